"""One experiment from configuration to `results.json`: the pipeline behind `tpuplex train`.

Order matters: everything that can be checked cheaply (task, devices, backend, batch sizes, checkpoint, data) is
checked before the output directory is created, so bad input leaves nothing half-written behind.

    <output_dir>/run.json        the config and the directory the run started in (`run_folder`: eval, predict,
                                 export)
    <output_dir>/results.json    task, backend, topology, metrics per eval split, throughput, padding efficiency,
                                 compile count, wall time, config hash and config file sha256, loss summary
    <output_dir>/log.jsonl, tensorboard/, checkpoints/step-*/   (see tpuplex.engine.run_log, tpuplex.engine.checkpoint)

In a multi-process run (`tpuplex.hosts`) every process runs this pipeline and process 0 alone writes these files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tpuplex import hardware, hosts, kinds, registry, tasks
from tpuplex.commands import run_folder
from tpuplex.config import Config
from tpuplex.data.batching import check_divisible, check_micro_batches
from tpuplex.engine.run_log import LOG_FILE, TENSORBOARD_DIR, Reporter
from tpuplex.engine.trainer import Trainer, TrainResult
from tpuplex.errors import ConfigError, MeshError, TpuplexError
from tpuplex.hardware import Topology
from tpuplex.plugins import add_search_path
from tpuplex.protocol import Backend, ModelSpec, OptimizerSpec
from tpuplex.tasks import Task, TaskData
from tpuplex.text_files import staged_text

RESULTS_FILE = "results.json"


@dataclasses.dataclass
class Experiment:
    """A run, validated and built, before its first step: what `train` fits and tools such as parity inspect."""

    config: Config
    task: Task
    data: TaskData
    """The task's encoded splits (`data.test`: your own data.test_file, checked, never trained on)."""
    backend_name: str
    backend: Backend
    topology: Topology
    discovered: Topology
    trainer: Trainer
    state: Any
    output_dir: Path
    started: float
    model_dir: Path | None
    """The checkpoint folder the model (and a text task's tokenizer) came from: model.checkpoint resolved; None
    for an image model of your own (`tpuplex.kinds.ModelKind.checkpoint_dir`)."""


def prepare(config: Config, backend_name: str, config_path: Path | None = None, model_only: bool = False,
            any_layout: bool = False) -> Experiment:
    """Check the config against the task, devices, backend, checkpoint and data, then build the model state.

    A user model (`model.architecture`) imports from the current directory or the config file's folder, and so
    does a task of your own (`task.name`). `model_only`: a trained run's model to generate with, built without
    reading any split where the task can (`Task.model_data`); its Trainer then trains and evaluates nothing.
    `any_layout`: a trained run's checkpoint read here (eval, predict, generate, export), on its own
    runtime.mesh and cpu_devices where they fit, else on the devices there are (`create_backend`).

    Creates no output directory: bad input leaves nothing behind (only the tokenization cache may be written).
    """
    started = time.perf_counter()
    task, options, kind = checked_task(config, config_path, check_data=not model_only)
    output_dir = output_directory(config, backend_name)
    check_run_folder(output_dir)
    discovered = hardware.discover(config.runtime.device)
    # Joining a multi-process run waits for the others: a process that never arrives must not hang this one.
    processes = hosts.expected_processes()
    watchdog = hosts.Watchdog(config.runtime.host_timeout, -1, processes, enabled=processes > 1,
                              start_timeout=config.runtime.start_timeout)
    with watchdog.watch(f"the start of the {backend_name} backend"):
        backend, config = create_backend(config, backend_name, any_layout)
    topology = backend.topology()
    _check_batch_sizes(config, topology)
    if config.train.fp8 and backend_name != "torch":
        raise ConfigError(f"train.fp8 (torchao's float8 training) runs on the torch backend, not {backend_name}: set "
                          "train.fp8 = false, or use --backend torch")

    data = (task.model_data(config, options, kind.checkpoint_dir) if model_only else None) or task.prepare(
        config, options, kind.checkpoint_dir)
    kind.check_data(data)
    if data.held_by and not backend.holds_data:
        raise ConfigError(f"{data.held_by} = true: the {backend_name} backend keeps no data on its devices; set it "
                          "to false, or use the torch or jax backend")
    model = kind.spec(config, task, data)
    trainer = Trainer(backend, config, data, output_dir, model)
    with trainer.hosts.watchdog.watch("building the model"):
        state = backend.init(model, optimizer_spec(config))
    return Experiment(config, task, data, backend_name, backend, topology, discovered, trainer, state, output_dir,
                      started, kind.checkpoint_dir)


def create_backend(config: Config, backend_name: str, any_layout: bool = False) -> tuple[Backend, Config]:
    """The backend of `config`, and the config it runs. `any_layout`: a layout this backend or these devices cannot
    give (a `MeshError`: runtime.mesh over other devices, fsdp on a data-only backend, CPU devices it does not
    split) gives way to data parallelism over the devices there are, every parameter whole on each (a checkpoint
    reads on any mesh), said in one line; the config returned then has runtime.mesh = {} and cpu_devices = 0."""
    try:
        return registry.create(backend_name, config.runtime), config
    except MeshError as error:
        anywhere = dataclasses.replace(config.runtime, mesh={}, cpu_devices=0)
        if not any_layout or anywhere == config.runtime:
            raise
        problem = error.problem
    backend = registry.create(backend_name, anywhere)
    topology = backend.topology()
    if topology.process_index == 0:
        print(f"tpuplex: {problem}; the checkpoint is read on the {topology.device_count} {topology.kind} "
              f"device(s) of the {backend_name} backend instead, every parameter whole on each (a checkpoint reads "
              "on any mesh)", file=sys.stderr, flush=True)
    return backend, dataclasses.replace(config, runtime=anywhere)


def checked_task(config: Config, config_path: Path | None, check_data: bool = True) -> tuple[Any, Any, Any]:
    """(task, its options, model kind) of `config`, checked against each other (and the data when `check_data`:
    a trained run's data may be gone since)."""
    if config_path is not None:
        add_search_path(Path(config_path).resolve().parent)
    task = tasks.get(config.task.name)
    options = tasks.options(task, config.task.options)
    if check_data:
        task.check(config, options)
    kind = kinds.resolve(config, task)
    kind.check(config, task)
    return task, options, kind


def prepare_data(config: Config, config_path: Path | None = None) -> Any:
    """What a run of `config` reads first, prepared into `data.cache_dir` as its first run would prepare it (audio
    features, images, tokenized text): the task's data, with no backend, model or run folder."""
    task, options, kind = checked_task(config, config_path)
    check_writable_folder(Path(config.data.cache_dir).expanduser(), "data.cache_dir")  # all that prepare writes
    if added := task.prepare_checkpoint(config, options, kind.checkpoint_dir):
        print(f"{kind.checkpoint_dir}: {added}")
    data = task.prepare(config, options, kind.checkpoint_dir)
    kind.check_data(data)
    return data


def train(config: Config, backend_name: str, config_path: Path | None = None,
          on_evaluation: Callable[[int, int, dict[str, dict[str, float]]], None] | None = None,
          said: set[str] | None = None) -> dict[str, Any]:
    """Run the experiment `config` on the backend `backend_name`; returns what it writes to results.json.
    `on_evaluation`: called after each evaluation (`Trainer.on_evaluation`: tpuplex tune's reports and pruning).
    `said`: the notes already said (`Trainer.said`), shared by runs that say each once (tpuplex tune's trials)."""
    run = prepare(config, backend_name, config_path)
    trainer, backend = run.trainer, run.backend
    trainer.on_evaluation = on_evaluation
    if said is not None:
        trainer.said = said
    resume = trainer.find_resume_point()  # before the Reporter: a refused resume writes nothing
    with Reporter(run.output_dir, write=trainer.hosts.writer) as reporter:
        if trainer.hosts.writer:
            record = run_folder.record(config, run.data.pinned_options())
            write_json_atomic(run.output_dir / run_folder.RUN_FILE, record)
            if run.model_dir is not None:
                run_folder.keep_model_files(run.model_dir, run.output_dir)
        state_bytes = backend.state_bytes(run.state)  # before the first step, which may donate the state
        held = f", {state_bytes / 2**20:.1f} MiB of parameters and moments a device" if state_bytes else ""
        reporter.say(f"{backend_name}: {run.topology.report()}{held}")
        reporter.record("start", 0, task=run.task.name, dataset=run.data.name, backend=backend_name,
                        topology=run.topology.report(), state_bytes_per_device=state_bytes,
                        config_hash=config.hash(), total_steps=trainer.total_steps)
        result = trainer.fit(run.state, reporter, resume)
        results = {
            "task": run.task.name,
            "dataset": run.data.name,
            "backend": backend_name,
            "output_dir": str(run.output_dir),
            "topology": run.topology.report(),
            "discovered": run.discovered.report(),
            "mesh": run.topology.mesh.report() if run.topology.mesh else f"data={run.topology.batch_shards}",
            "state_bytes_per_device": state_bytes,
            "parameters": parameter_counts(trainer.model, config.train.optimizer),
            "metrics": result.metrics,
            "step": result.step,
            "total_steps": trainer.total_steps,
            "steps_per_epoch": trainer.steps_per_epoch,
            "train": result.train.summary(trainer.peak.flops_per_s),
            "peak": {"tflops_per_s": float(f"{trainer.peak.flops_per_s / 1e12:.4g}"), "source": trainer.peak.source},
            "eval": result.eval.summary(),
            "data": run.data.report(),
            "buckets": list(trainer.train_batcher.lengths),
            "padding_efficiency": {
                "train": round(trainer.train_batcher.padding_efficiency(train=True), 4),
                **{split: round(batcher.padding_efficiency(train=False), 4)
                   for split, batcher in trainer.eval_batchers.items()},
            },
            "train_reads": _train_reads(trainer),
            "compile_count": backend.compile_count(),
            "compile_count_by_epoch": result.compiles_by_epoch,
            "losses": loss_summary(result, config.runtime.log_every),
            "resumed_from": str(result.resumed_from) if result.resumed_from else None,
            "checkpoint": str(result.checkpoint) if result.checkpoint else None,
            "wall_seconds": round(time.perf_counter() - run.started, 3),
            "config_hash": config.hash(),
            "config_file": str(config_path) if config_path else None,
            "config_sha256": hashlib.sha256(Path(config_path).read_bytes()).hexdigest() if config_path else None,
            "config": config.to_dict(),
        }
        if trainer.hosts.writer:
            path = write_json_atomic(run.output_dir / RESULTS_FILE, results)
            reporter.say(f"results written to {path}")
    return results


def parameter_counts(model: ModelSpec | None, optimizer: str) -> dict[str, int] | None:
    """The model's parameters, those that train (a LoRA run: the adapters alone) and the bytes of the optimizer's
    float32 moments of them (AdamW two, SGD one); None for a model of your own, which its framework draws."""
    if model is None or not model.params:
        return None
    total = sum(int(np.prod(np.shape(array))) for array in model.params.values())
    trained = sum(int(np.prod(np.shape(array))) for name, array in model.params.items() if name not in model.frozen)
    return {"total": total, "trained": trained, "optimizer_state_bytes": trained * 4 * (1 if optimizer == "sgd" else 2)}


def _train_reads(trainer: Trainer) -> list[dict[str, int]] | None:
    """What each process read of a prepared training split (`tpuplex.data.shards.ReadStats`): records, bytes and
    retried reads, one entry per process; None for a split held in memory."""
    stats = getattr(trainer.train_batcher.data, "read_stats", None)
    if stats is None:
        return None
    gathered = trainer.hosts.gather("counting the records read", np.array([stats.records, stats.retried], float))
    return [{"process": process, "records": int(records), "bytes": int(records) * stats.record_bytes,
             "retried": int(retried)} for process, (records, retried) in enumerate(gathered)]


def output_directory(config: Config, backend_name: str) -> Path:
    """`runtime.output_dir` with its `{dataset}` (data.dataset), `{task}` (task.name, its last part for an
    import path) and `{backend}` placeholders filled in."""
    template = config.runtime.output_dir
    task_name = config.task.name.rsplit(":", 1)[-1].rsplit(".", 1)[-1]
    try:
        path = Path(template.format(dataset=config.data.dataset, task=task_name, backend=backend_name)).expanduser()
    except (KeyError, IndexError, ValueError):
        raise ConfigError(f"runtime.output_dir = {template!r} has an unknown placeholder: only {{dataset}}, "
                          "{task} and {backend} are filled in (write {{ and }} for literal braces)") from None
    check_writable_folder(path, "runtime.output_dir")
    return path


def foreign_files(folder: Path, mark: str) -> str:
    """The entries of an existing `folder` that tpuplex did not write, as "a, b, c, ..." ("" when none): none in a
    folder that holds the `mark` file of the command that writes it, else every entry."""
    if not folder.is_dir() or (folder / mark).is_file():
        return ""
    return shown_names(sorted(child.name for child in folder.iterdir()))


def shown_names(names: list[str]) -> str:
    """The first three of `names`, "a, b, c, ..."."""
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def check_run_folder(path: Path) -> None:
    """`runtime.output_dir` is new, empty, or a run's folder (the run.json a run writes, or the log and TensorBoard
    folder it starts with): a run never writes over files it did not make (a run.json, results.json or log.jsonl of
    your own, say)."""
    if not path.is_dir() or run_folder.written_by_a_run(path / run_folder.RUN_FILE):
        return
    shown = shown_names(sorted(child.name for child in path.iterdir() if not _started_by_a_run(child)))
    if shown:
        raise TpuplexError(f"runtime.output_dir = {str(path)!r} holds files tpuplex did not write ({shown}): give a "
                           "new or empty folder (or the folder of a run, to resume it), so none of yours is replaced")


def _started_by_a_run(entry: Path) -> bool:
    """Whether `entry` is what a run writes before its run.json: its log (empty, or JSON records with an event, a
    step and a time) or its TensorBoard folder (event files only)."""
    if entry.name == TENSORBOARD_DIR and entry.is_dir():
        return all(child.name.startswith("events.out.tfevents.") for child in entry.iterdir())
    if entry.name != LOG_FILE or not entry.is_file():
        return False
    try:
        with entry.open(encoding="utf-8") as log:
            first = log.readline()
        record = json.loads(first) if first.strip() else {"event": "", "step": 0, "time": 0}
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(record, dict) and {"event", "step", "time"} <= set(record)


def check_writable_folder(path: Path, field: str) -> None:
    """`path` is, or can be made, a folder we may write in; checked without creating anything."""
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        what = "is a file" if existing == path else f"is under {existing}, which is a file"
        raise TpuplexError(f"{field} = {str(path)!r} {what}: choose a folder path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise TpuplexError(f"{field} = {str(path)!r} cannot be written ({existing} is read-only): choose another "
                           "folder or fix its permissions")


def optimizer_spec(config: Config) -> OptimizerSpec:
    train = config.train
    return OptimizerSpec(weight_decay=train.weight_decay, beta1=train.adam_beta1, beta2=train.adam_beta2,
                         epsilon=train.adam_epsilon, clip_norm=train.clip_norm, grad_accum=train.grad_accum,
                         bf16=train.bf16, fp8=train.fp8, seed=train.seed, optimizer=train.optimizer,
                         momentum=train.momentum, nesterov=train.nesterov)


def loss_summary(result: TrainResult, window: int) -> dict[str, Any]:
    """The training losses this process saw: first and last step, first and last loss, and the mean of the last
    `window` steps (the last logging window)."""
    losses = result.losses
    if not losses:
        return {"steps": 0}
    tail = losses[-window:]
    return {"steps": len(losses), "first_step": result.first_step, "last_step": result.step,
            "first": losses[0], "last": losses[-1], "min": min(losses), "mean_last": sum(tail) / len(tail)}


def write_json_atomic(path: Path, content: dict[str, Any]) -> Path:
    """Write `content` as JSON to `path` through a temporary file renamed into place: whole or absent."""
    with staged_text(path) as file:
        json.dump(content, file, indent=2)
    return path


def _check_batch_sizes(config: Config, topology: Topology) -> None:
    train, replicas = config.train, topology.batch_shards
    check_micro_batches(train.global_batch, replicas, train.grad_accum, topology.mesh)
    if train.eval_batch:
        check_divisible(train.eval_batch, replicas, field="train.eval_batch", mesh=topology.mesh)

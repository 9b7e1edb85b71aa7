"""One experiment from configuration to `results.json`: the pipeline behind `tpuplex train`.

Order matters: everything that can be checked cheaply (task, devices, backend, batch sizes, checkpoint, data) is
checked before the output directory is created, so bad input leaves nothing half-written behind.

    <output_dir>/results.json    task, backend, topology, metrics per eval split, throughput, padding efficiency,
                                 compile count, wall time, config hash and config file sha256, loss summary
    <output_dir>/log.jsonl, tensorboard/, checkpoints/step-*/   (see tpuplex.reporting, tpuplex.checkpoint)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from tpuplex import devices, params, registry
from tpuplex.collate import check_divisible, check_micro_batches
from tpuplex.config import Config
from tpuplex.devices import Topology
from tpuplex.errors import TpuplexError
from tpuplex.glue import compute, get_task, load_encoded
from tpuplex.glue.tasks import Task
from tpuplex.protocol import Backend, ModelSpec, OptimizerSpec
from tpuplex.reporting import Reporter
from tpuplex.trainer import Trainer, TrainResult

RESULTS_FILE = "results.json"


@dataclasses.dataclass
class Experiment:
    """A run, validated and built, before its first step: what `train` fits and tools such as parity inspect."""

    task: Task
    backend_name: str
    backend: Backend
    topology: Topology
    discovered: Topology
    trainer: Trainer
    state: Any
    output_dir: Path
    started: float


def prepare(config: Config, backend_name: str) -> Experiment:
    """Check the config against the task, devices, backend, checkpoint and data, then build the model state.

    Creates no output directory: bad input leaves nothing behind (only the tokenization cache may be written).
    """
    started = time.perf_counter()
    task = get_task(config.data.task)
    output_dir = output_directory(config, task, backend_name)
    discovered = devices.discover(config.runtime.device)
    backend = registry.create(backend_name, config.runtime)
    topology = backend.topology()
    _check_batch_sizes(config, topology.device_count)

    checkpoint_dir = params.resolve_checkpoint(config.model.checkpoint)
    hf_config = params.read_hf_config(checkpoint_dir)
    _check_max_length(config, hf_config)
    data_dir = Path(config.data.data_dir).expanduser() if config.data.data_dir else None
    cache_dir = Path(config.data.cache_dir).expanduser()
    encoded = {split: load_encoded(task, split, data_dir, checkpoint_dir, config.data.max_length, cache_dir)
               for split in task.splits}
    train_data, eval_data = encoded.pop("train"), encoded
    trainer = Trainer(backend, config, train_data, eval_data, functools.partial(compute, task), task.num_labels,
                      output_dir)

    model = ModelSpec(hf_config=hf_config, num_labels=task.num_labels, dropout=config.model.dropout,
                      params=params.initial_params(checkpoint_dir, hf_config, task.num_labels, config.train.seed),
                      checkpoint_dir=checkpoint_dir)
    state = backend.init(model, optimizer_spec(config))
    return Experiment(task, backend_name, backend, topology, discovered, trainer, state, output_dir, started)


def train(config: Config, backend_name: str, config_path: Path | None = None) -> dict[str, Any]:
    """Run the experiment `config` on the backend `backend_name`; returns what it writes to results.json."""
    run = prepare(config, backend_name)
    trainer, backend = run.trainer, run.backend
    with Reporter(run.output_dir) as reporter:
        reporter.say(f"{backend_name}: {run.topology.report()}")
        reporter.record("start", 0, task=run.task.name, backend=backend_name, topology=run.topology.report(),
                        config_hash=config.hash(), total_steps=trainer.total_steps)
        result = trainer.fit(run.state, reporter)
        results = {
            "task": run.task.name,
            "backend": backend_name,
            "output_dir": str(run.output_dir),
            "topology": run.topology.report(),
            "discovered": run.discovered.report(),
            "metrics": result.metrics,
            "step": result.step,
            "total_steps": trainer.total_steps,
            "steps_per_epoch": trainer.steps_per_epoch,
            "train": result.train.summary(),
            "eval": result.eval.summary(),
            "padding_efficiency": {
                "train": round(trainer.train_batcher.padding_efficiency(train=True), 4),
                **{split: round(batcher.padding_efficiency(train=False), 4)
                   for split, batcher in trainer.eval_batchers.items()},
            },
            "compile_count": backend.compile_count(),
            "losses": loss_summary(result, config.runtime.log_every),
            "resumed_from": str(result.resumed_from) if result.resumed_from else None,
            "checkpoint": str(result.checkpoint) if result.checkpoint else None,
            "wall_seconds": round(time.perf_counter() - run.started, 3),
            "config_hash": config.hash(),
            "config_file": str(config_path) if config_path else None,
            "config_sha256": hashlib.sha256(Path(config_path).read_bytes()).hexdigest() if config_path else None,
            "config": config.to_dict(),
        }
        path = write_json_atomic(run.output_dir / RESULTS_FILE, results)
        reporter.say(f"results written to {path}")
    return results


def output_directory(config: Config, task: Task, backend_name: str) -> Path:
    """`runtime.output_dir` with its `{task}` and `{backend}` placeholders filled in."""
    template = config.runtime.output_dir
    try:
        return Path(template.format(task=task.name, backend=backend_name)).expanduser()
    except (KeyError, IndexError, ValueError):
        raise TpuplexError(f"runtime.output_dir = {template!r} has an unknown placeholder: only {{task}} and "
                           "{backend} are filled in (write {{ and }} for literal braces)") from None


def optimizer_spec(config: Config) -> OptimizerSpec:
    train = config.train
    return OptimizerSpec(weight_decay=train.weight_decay, beta1=train.adam_beta1, beta2=train.adam_beta2,
                         epsilon=train.adam_epsilon, clip_norm=train.clip_norm, grad_accum=train.grad_accum,
                         bf16=train.bf16, seed=train.seed)


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
    descriptor, staging = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            json.dump(content, file, indent=2)
        os.replace(staging, path)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise
    return path


def _check_batch_sizes(config: Config, replicas: int) -> None:
    train = config.train
    check_micro_batches(train.global_batch, replicas, train.grad_accum)
    if train.eval_batch:
        check_divisible(train.eval_batch, replicas, field="train.eval_batch")


def _check_max_length(config: Config, hf_config: dict[str, Any]) -> None:
    positions = int(hf_config["max_position_embeddings"])
    if config.data.max_length > positions:
        raise TpuplexError(f"data.max_length = {config.data.max_length} is longer than the model's "
                           f"{positions} position embeddings: use data.max_length <= {positions}")

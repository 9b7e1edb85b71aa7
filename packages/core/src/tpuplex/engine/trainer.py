"""The training loop: the core drives, the backend steps.

The Trainer owns everything that must be identical on every framework: the data order (`Batcher`), the learning
rate of each step (`tpuplex.engine.schedule`), when to evaluate, log and checkpoint, and how to resume. Steps are
counted as optimizer updates; "step n" is the n-th update (1-based), and `lr` of update n is
`SCHEDULES[train.schedule](n - 1, ...)` (linear or cosine decay after the warmup).

Cadence (`runtime`):
    eval_every / checkpoint_every    every this many steps; 0 means at the end of each epoch
    log_every                        one "train" record per this many steps, and one at the last step: the
                                     window's mean loss and its throughput, its steps' examples over their time
                                     (`_LossLog`)
    profile_steps = [a, b]           backend.start_profile before step a, stop_profile after step b
Training always ends with an evaluation and a checkpoint of the final state.

With `train.steps_per_execution = k > 1`, k consecutive batches of the same shape go to `backend.train_steps` in
one call; a group never spans an evaluation, checkpoint, profile boundary or the end of an epoch, so those happen
at exactly the configured steps. Batches that cannot form a whole group run one by one through `train_step`,
which keeps the number of distinct programs at two per shape.

Resume: `<output_dir>/checkpoints/step-*` holds the state plus `trainer.json` (step, epoch, position = batches
already consumed in that epoch, seed, config hash, training data fingerprint, metrics); the run continues with
batch `position` of `epoch`, so a resumed run sees exactly the batches and learning rates an uninterrupted one
would. It starts from the newest checkpoint that verifies against its manifest; damaged newer ones are reported
and skipped. Another config hash or other training data is refused; the hash leaves out how long to train
(`tpuplex.config.LENGTH_FIELDS`), so raising train.max_steps or train.epochs continues a finished run from its last
checkpoint, the learning-rate schedule then spanning the new length.

Preemption (`runtime.on_preempt = "checkpoint"`): a SIGTERM or SIGINT ends the run after the current step or group
with a checkpoint of that step, then `tpuplex.engine.preemption.Preempted` (see that module).

Several processes (`tpuplex.hosts`): every process runs this same loop on the same global batches (the backend
feeds its own rows and returns global losses and logits). Before the first step they check that they agree on the
config, the data and the resume step; after each step or group they combine their preemption flags; process 0
alone writes checkpoints and the others wait for it. Every backend call that may wait for another process is
watched, so a lost process ends the others after `runtime.host_timeout` seconds instead of hanging them.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np

from tpuplex import flops
from tpuplex.config import Config
from tpuplex.data.batching import Batcher, Encoded, fit_buckets
from tpuplex.engine import checkpoint
from tpuplex.engine.preemption import Preempted, SignalWatch
from tpuplex.engine.prefetch import Prefetcher
from tpuplex.engine.run_log import Reporter, headline
from tpuplex.engine.schedule import SCHEDULES, warmup_steps
from tpuplex.errors import CheckpointError, TpuplexError
from tpuplex.hosts import Hosts
from tpuplex.protocol import Backend, Batch, ModelSpec, PortableState
from tpuplex.slices import as_slices
from tpuplex.tasks.base import TaskData

CHECKPOINTS_DIR = "checkpoints"
PROFILE_DIR = "profile"

@dataclasses.dataclass(frozen=True)
class Throughput:
    """Work done in one phase of this process: examples (rows with some weight), tokens (their real, unpadded
    tokens; 0 for batches without tokens), seconds, the part of those seconds spent waiting for input, and the
    model FLOPs of the batches (`tpuplex.flops`; None once a batch was not counted, as evaluation's are not)."""

    examples: int = 0
    tokens: int = 0
    seconds: float = 0.0
    input_wait: float = 0.0
    flops: float | None = 0.0

    def add(self, batch: Batch, flops: float | None = None) -> Throughput:
        real = batch["weight"].reshape(len(batch["weight"]), -1).max(axis=1) > 0
        tokens = int(batch["attention_mask"][real].sum()) if "attention_mask" in batch else 0
        return Throughput(self.examples + int(real.sum()), self.tokens + tokens, self.seconds, self.input_wait,
                          _add_flops(self.flops, flops))

    def __add__(self, other: Throughput) -> Throughput:
        return Throughput(self.examples + other.examples, self.tokens + other.tokens, self.seconds + other.seconds,
                          self.input_wait + other.input_wait, _add_flops(self.flops, other.flops))

    def timed(self, seconds: float, input_wait: float = 0.0) -> Throughput:
        return dataclasses.replace(self, seconds=self.seconds + seconds, input_wait=self.input_wait + input_wait)

    def summary(self, peak_flops_per_s: float = 0.0) -> dict[str, float | None]:
        """The figures of results.json; model_tflops_per_s and mfu (against `peak_flops_per_s`) are None where the
        FLOPs or the peak are not known."""
        rate = 1.0 / self.seconds if self.seconds > 0 else 0.0
        return {"examples": self.examples, "tokens": self.tokens, "seconds": round(self.seconds, 3),
                "examples_per_s": round(self.examples * rate, 2), "tokens_per_s": round(self.tokens * rate, 1),
                "input_wait_seconds": round(self.input_wait, 3),
                "input_wait_share": round(self.input_wait * rate, 4),
                **flops.rates(self.flops, self.seconds, peak_flops_per_s)}


def _add_flops(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


@dataclasses.dataclass(frozen=True)
class Gathered:
    """A split's predict outputs [N, ...], and its evaluation batches' labels and weight, in split order."""

    outputs: np.ndarray
    labels: np.ndarray
    weight: np.ndarray
    work: Throughput


@dataclasses.dataclass
class TrainResult:
    """The outcome of `Trainer.fit`.

    metrics: eval split -> metric -> value, from the last evaluation (of the final state).
    losses: the training loss of every step this process ran, in order, beginning at step `first_step`.
    train, eval: throughput of this process's training steps and evaluations.
    compiles_by_epoch: epoch -> programs compiled so far, at the end of each epoch this process finished.
    """

    state: Any
    step: int
    metrics: dict[str, dict[str, float]]
    losses: list[float]
    first_step: int
    train: Throughput
    eval: Throughput
    resumed_from: Path | None
    checkpoint: Path | None
    compiles_by_epoch: dict[int, int]


@dataclasses.dataclass
class _Position:
    step: int = 0
    epoch: int = 0
    position: int = 0


class Trainer:
    """Runs one experiment on `backend`.

    Args:
        backend: the framework backend.
        config: the whole run configuration (its hash guards resuming with another config).
        data: the task's data (`tpuplex.tasks.TaskData`): the encoded splits, the task's batches and metrics.
        output_dir: where checkpoints (and, through the Reporter, logs) go.
        model: the model being trained, whose FLOPs give the MFU of the progress lines and results (`tpuplex.flops`);
            without it they are not reported.
    """

    def __init__(self, backend: Backend, config: Config, data: TaskData, output_dir: Path,
                 model: ModelSpec | None = None):
        self.backend = backend
        self.model = model
        self.config = config
        self.data = data
        train_data = data.train
        self.output_dir = Path(output_dir)
        self.checkpoint_root = self.output_dir / CHECKPOINTS_DIR
        train, runtime = config.train, config.runtime
        replicas = backend.topology().batch_shards
        data_config = config.data
        # Fitted to the training split alone: evaluation and prediction use the same lengths, so the same programs.
        self.buckets = (fit_buckets(train_data.lengths, train_data.max_length, data_config.bucket_count,
                                    data_config.bucket_multiple)
                        if data_config.bucket_count and train_data is not None else data_config.buckets)
        topology = backend.topology()
        self.eval_batchers = {split: self.batcher(encoded) for split, encoded in data.eval.items()}
        self.train_batcher: Batcher | None = None  # None: a model rebuilt to generate (`Task.model_data`)
        self.steps_per_epoch, self.train_data_fingerprint = 0, ""
        if train_data is not None:
            self.train_batcher = Batcher(train_data, train.global_batch, replicas, self.buckets, seed=train.seed,
                                         group_by_length=data_config.group_by_length,
                                         process=(topology.process_index, topology.host_count))
            self.steps_per_epoch = self.train_batcher.steps_per_epoch
            # Recorded in every checkpoint, so that resuming on other training data is refused.
            self.train_data_fingerprint = train_data.fingerprint()
        self.total_steps = train.max_steps or train.epochs * self.steps_per_epoch
        self.warmup = warmup_steps(self.total_steps, train.warmup_ratio)
        self.profile = tuple(runtime.profile_steps)
        self.hosts = Hosts(backend, runtime.host_timeout, runtime.start_timeout)
        self._processes_agree = False
        self._flops_by_shapes: dict[tuple, float | None] = {}
        self.on_evaluation: Callable[[int, int, dict[str, dict[str, float]]], None] | None = None
        """Called after each evaluation of `fit` with (step, total_steps, every split's metrics): `tpuplex tune`
        reports them to its study there, and stops a pruned trial by raising. None: nothing is called."""
        self.said: set[str] = set()
        """The notes said once (an MFU above the peak): a set shared by several runs (`tpuplex tune`'s trials) says
        each once for them all."""

    @functools.cached_property
    def peak(self) -> flops.Peak:
        """The devices' peak FLOP/s, found when first asked (a CPU's is measured; eval and predict never ask)."""
        return flops.peak(self.backend.topology(), self.config.runtime.peak_tflops)

    def train_flops(self, batch: Batch, state: Any) -> float | None:
        """Model FLOPs of a training step on `batch` (`tpuplex.flops`; a model of your own counted by the backend's
        framework on `state`); None without a model spec or a count. They depend on the batch's shapes alone, so
        each shape is counted once (a handful of buckets), off the step-to-step path."""
        if self.model is None:
            return None
        shapes = tuple((name, np.shape(value)) for name, value in batch.items())
        if shapes not in self._flops_by_shapes:
            self._flops_by_shapes[shapes] = flops.train_flops(self.model, batch,
                                                              lambda: self.backend.forward_flops(state, batch))
        return self._flops_by_shapes[shapes]

    def learning_rate(self, step: int) -> float:
        """The learning rate of update `step` (1-based)."""
        schedule = SCHEDULES[self.config.train.schedule]
        train = self.config.train
        return schedule(step - 1, peak=train.learning_rate, warmup=self.warmup, total=self.total_steps,
                        floor=train.min_learning_rate)

    def fit(self, state: Any, reporter: Reporter, resume: ResumePoint | None | Literal["latest"] = "latest"
            ) -> TrainResult:
        """Train from `state`, or from `resume` (by default the latest good checkpoint in
        `<output_dir>/checkpoints`, see `find_resume_point`), to `total_steps`."""
        if resume == "latest":
            resume = self.find_resume_point()
        self._check_processes_agree(resume)  # done already when find_resume_point found `resume`
        at = _Position()
        if resume is not None:
            for line in resume.damaged:
                reporter.say(line)
            state, at = self.backend.state_from_arrays(state, resume.arrays), dataclasses.replace(resume.at)
        signals = SignalWatch(enabled=self.config.runtime.on_preempt == "checkpoint")
        run = _Run(self, state, at, reporter, signals)
        if resume is not None:
            run.last_checkpoint_step = at.step
            reporter.say(f"resuming from {resume.path} (step {at.step}, epoch {at.epoch}, batch {at.position})")
            if resume.total_steps not in (None, self.total_steps) and at.step < self.total_steps:
                reporter.say(f"the run now trains {self.total_steps} steps, not {resume.total_steps} "
                             f"({_length(self.config)}): its learning-rate schedule now spans {self.total_steps} "
                             f"steps (lr {self.learning_rate(at.step + 1):.2e} at step {at.step + 1})")
        if at.step < self.total_steps and (held := self.data.held()):
            self.backend.hold(held)
        reporter.start_progress(self.total_steps, at.step)
        first_step = at.step + 1
        # A signal during the final evaluation or save is recorded and ignored: the run is about to end anyway.
        with signals:
            try:
                while at.step < self.total_steps:
                    run.epoch()
            finally:
                run.close_input()
                run.profiler.stop()
            if run.last_eval_step != at.step or not run.metrics:
                run.evaluate()
            if run.last_checkpoint_step != at.step:
                run.save()
        return TrainResult(state=run.state, step=at.step, metrics=run.metrics, losses=run.losses,
                           first_step=first_step, train=run.train_throughput, eval=run.eval_throughput,
                           resumed_from=resume.path if resume else None,
                           checkpoint=checkpoint.latest(self.checkpoint_root),
                           compiles_by_epoch=run.compiles_by_epoch)

    def _check_processes_agree(self, resume: ResumePoint | None) -> None:
        """Every process must compute the same run from the same step (once per Trainer; a no-op with one
        process)."""
        hosts = self.hosts
        if self._processes_agree or hosts.count == 1:
            return
        hosts.agree("the configuration", f"{self.config.hash()} for {self.total_steps} steps",
                    "start every process with the same config file, --set options and data directory")
        data = [self.train_data_fingerprint, *(b.data.fingerprint() for b in self.eval_batchers.values())]
        hosts.agree("the tokenized data", ",".join(data), "give every process the same data files and tokenizer")
        hosts.agree("the step to resume from", str(resume.at.step if resume else 0),
                    "runtime.output_dir must be one folder that every process sees (a shared disk or bucket)")
        self._processes_agree = True

    def find_resume_point(self) -> ResumePoint | None:
        """The newest good checkpoint of this run, read and checked against the config and the training data, or
        None; it writes nothing, so a refused resume (a TpuplexError) leaves the run folder as it was. With several
        processes, they also check here that they agree on the run and on this step (`_check_processes_agree`)."""
        resume = self._latest_good_checkpoint()
        self._check_processes_agree(resume)
        return resume

    def _latest_good_checkpoint(self) -> ResumePoint | None:
        damaged: list[str] = []
        path = checkpoint.latest_good(self.checkpoint_root, damaged.append)
        if path is None:
            return None
        arrays, info = checkpoint.load(path, verified=True)
        if not self.config.hash_matches(info.get("config_hash")):
            recorded = info.get("config")
            changes = self.config.changes_from(recorded) if isinstance(recorded, dict) else []
            differs = (f"{'; '.join(changes)}" if changes
                       else f"hash {info.get('config_hash')}, now {self.config.hash()}")
            raise CheckpointError(
                f"{path} was written with another configuration ({differs}): restore that configuration to resume, "
                "or set a new runtime.output_dir")
        if int(info["step"]) > self.total_steps:
            raise CheckpointError(
                f"{path} is at step {info['step']}, past the {self.total_steps} steps this config trains "
                f"({_length(self.config)}): raise it to at least {info['step']} to resume (a longer run continues "
                "from this checkpoint), evaluate the checkpoint with tpuplex eval, or set a new runtime.output_dir")
        if info.get("train_data") != self.train_data_fingerprint:
            raise CheckpointError(
                f"{path} was trained on other training data (tokens and labels differ): restore that data to "
                "resume, or set a new runtime.output_dir")
        at = _Position(int(info["step"]), int(info["epoch"]), int(info["position"]))
        total = info.get("total_steps")
        return ResumePoint(path, self.with_frozen(arrays, info, path), at, tuple(damaged),
                           int(total) if isinstance(total, int) else None)

    def without_frozen(self, state: PortableState) -> PortableState:
        """What a checkpoint holds of `state`: the trained parameters; a LoRA run's frozen base is recorded by its
        fingerprint alone (`with_frozen` puts it back)."""
        frozen = self.model.frozen if self.model is not None else frozenset()
        return dataclasses.replace(state, params={name: value for name, value in state.params.items()
                                                  if name not in frozen})

    def with_frozen(self, arrays: PortableState, info: dict[str, Any], path: Path) -> PortableState:
        """A checkpoint's state as the backend restores it: with the model's frozen base, checked to be the base
        the checkpoint's adapters were trained on."""
        if self.model is None or not self.model.frozen:
            return arrays
        recorded = str(info.get("base_sha256", "none"))
        if recorded != self.model.base_sha256:
            raise CheckpointError(
                f"{path} holds LoRA adapters trained on another base model (sha256 {recorded[:16]}; "
                f"model.checkpoint = {self.config.model.checkpoint!r} is {self.model.base_sha256[:16]}): point "
                "model.checkpoint at the base the adapters were trained on")
        base = {name: self.model.params[name] for name in self.model.frozen}
        return dataclasses.replace(arrays, params={**base, **arrays.params})

    def evaluate_split(self, state: Any, split: str, what: str = "evaluation") -> tuple[dict[str, float], Throughput]:
        """The metrics (and "loss") of eval split `split` for `state`, and the work it took."""
        started = time.perf_counter()
        batcher = self.eval_batchers[split]
        gathered = self.gather(state, batcher, what)
        metrics = self.data.metrics(split, gathered.outputs, gathered.labels, gathered.weight)
        return metrics, gathered.work.timed(time.perf_counter() - started)

    def predict(self, state: Any, batcher: Batcher, what: str = "prediction") -> tuple[np.ndarray, Throughput]:
        """The predict outputs of every example of `batcher`'s split ([N, ...], see `gather`), and the work."""
        gathered = self.gather(state, batcher, what)
        return gathered.outputs, gathered.work

    def gather(self, state: Any, batcher: Batcher, what: str = "prediction") -> Gathered:
        """Every example of `batcher`'s split through the task's evaluation batches and `backend.predict`, in split
        order, each example computed exactly once (checked). Per-token values are padded to the split's
        max_length (with weight 0)."""
        count, length = len(batcher.data), batcher.data.max_length
        gathered: dict[str, np.ndarray] = {}
        seen = np.zeros(count, np.int64)
        work = Throughput()
        for item in batcher.eval_batches():
            real = item.index >= 0
            batch = self.data.eval_batch(item.batch, item.index)
            with self.hosts.watchdog.watch(what):
                output = np.asarray(self.backend.predict(state, batch))
            if len(output) != len(real) or np.any(batch["weight"].reshape(len(real), -1)[~real] != 0):
                raise RuntimeError(f"evaluation batch mismatch: outputs {output.shape}, {int(real.sum())} real rows, "
                                   f"indices {item.index.tolist()}")
            np.add.at(seen, item.index[real], 1)
            for key, values in (("outputs", output), ("labels", batch["labels"]), ("weight", batch["weight"])):
                values = values[real]
                # (a row as wide in every batch stays so: a speech split's labels, its run's longest transcript)
                if self.data.per_token and values.ndim > 1 and values.shape[1] < length:
                    values = np.pad(values, [(0, 0), (0, length - values.shape[1])] + [(0, 0)] * (values.ndim - 2))
                if key not in gathered:
                    gathered[key] = np.zeros((count, *values.shape[1:]), values.dtype)
                gathered[key][item.index[real]] = values
            work = work.add(item.batch)
        if not np.all(seen == 1):
            wrong = np.flatnonzero(seen != 1)
            raise RuntimeError(f"evaluation counted examples {wrong[:5].tolist()} {seen[wrong[:5]].tolist()} "
                               "times instead of once")
        return Gathered(gathered["outputs"], gathered["labels"], gathered["weight"], work)

    def batcher(self, data: Encoded) -> Batcher:
        """Evaluation batches of `data` as the run's eval splits get them (eval batch size, buckets)."""
        train = self.config.train
        return Batcher(data, train.eval_batch or train.global_batch, self.backend.topology().batch_shards,
                       self.buckets, seed=train.seed)


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """Where `Trainer.fit` continues: a verified checkpoint's state and data position, and one line for each newer,
    damaged checkpoint that was skipped (fit reports them)."""

    path: Path
    arrays: PortableState
    at: _Position
    damaged: tuple[str, ...]
    total_steps: int | None = None
    """The steps the run that wrote the checkpoint was to train (None: not recorded, an older checkpoint)."""


def _length(config: Config) -> str:
    """The config's fields that set the run's length, as "train.max_steps = 6" or "train.epochs = 3"."""
    train = config.train
    return f"train.max_steps = {train.max_steps}" if train.max_steps else f"train.epochs = {train.epochs}"


class _Cadence:
    """When the run evaluates, checkpoints and profiles (runtime.eval_every, checkpoint_every, profile_steps): every
    N steps, or at each epoch's end when N is 0; the last step always evaluates."""

    def __init__(self, runtime: Any, total_steps: int):
        self.eval_every, self.checkpoint_every = runtime.eval_every, runtime.checkpoint_every
        self.profile = tuple(runtime.profile_steps)
        self.total_steps = total_steps

    def evaluates_after(self, step: int) -> bool:
        return step == self.total_steps or bool(self.eval_every and step % self.eval_every == 0)

    def saves_after(self, step: int) -> bool:
        return bool(self.checkpoint_every and step % self.checkpoint_every == 0)

    def next_boundary(self, step: int, stop: int) -> int:
        """The first step after `step` (at most `stop`) after which something other than training happens: a step
        group must not cross it."""
        candidates = [stop] + [(step // every + 1) * every for every in (self.eval_every, self.checkpoint_every)
                               if every > 0]
        if self.profile:
            first, last = self.profile
            candidates += [edge for edge in (first - 1, last) if edge > step]
        return min(candidates)


class _LossLog:
    """The "train" records: each `log_every` steps' mean loss (and the last step's window, however short), the
    learning rate of the last of them, and their throughput (`Throughput.summary`: examples, tokens, seconds,
    examples_per_s, tokens_per_s, input wait, model_tflops_per_s, mfu).

    A window's seconds are the sum of its steps' times, each step's time its share of the group it ran in
    (`_Run.epoch`), so a window that cuts a group of `steps_per_execution` gets the time of the steps it holds, the
    windows' seconds add up to the run's training time (evaluations and checkpoints are no step's), and every
    rate is a total over a total. An MFU above 1 is never written (`tpuplex.flops.rates` leaves it out): the first
    figure that would exceed the peak prints one line instead, naming the peak's source, and training goes on.
    """

    def __init__(self, trainer: Trainer, reporter: Reporter, peak: flops.Peak):
        self.trainer, self.reporter, self.peak = trainer, reporter, peak
        self.every = trainer.config.runtime.log_every
        self._losses: list[float] = []
        self._window = Throughput()

    def add(self, step: int, loss: float, epoch: int, work: Throughput) -> None:
        """Step `step` (1-based) trained with `loss`; `work` is its batch's throughput and its share of the time."""
        self._losses.append(loss)
        self._window += work
        # The last step closes its window too, however short: a run shorter than log_every records its loss.
        if step % self.every == 0 or step == self.trainer.total_steps:
            self.reporter.record("train", step, epoch=epoch, loss=float(np.mean(self._losses)),
                                 learning_rate=self.trainer.learning_rate(step), **self.figures(self._window, step))
            self._losses, self._window = [], Throughput()

    def figures(self, work: Throughput, step: int) -> dict[str, float | None]:
        """`work.summary` against the run's peak, saying once why an MFU above 1 is left out."""
        said = self.trainer.said
        if "above peak" not in said and flops.above_peak(work.flops, work.seconds, self.peak.flops_per_s):
            said.add("above peak")
            self.reporter.say(
                f"MFU left out at step {step} and wherever else it would exceed 100%: "
                f"{work.flops / work.seconds / 1e12:.4g} model TFLOP/s against a peak of "
                f"{self.peak.flops_per_s / 1e12:.4g} ({self.peak.source}) means the peak or the FLOP count is wrong; "
                "set runtime.peak_tflops to the devices' peak (a CPU's is measured once, before the first step, and "
                "a load that eases later leaves it too low)")
        return work.summary(self.peak.flops_per_s)


class _Profiler:
    """The backend's profiler over the steps runtime.profile_steps names, written to `<output_dir>/profile`."""

    def __init__(self, trainer: Trainer, reporter: Reporter):
        self.backend, self.reporter = trainer.backend, reporter
        self.steps = trainer.profile
        self.folder = trainer.output_dir / PROFILE_DIR
        self.running = False

    def before_step(self, step: int) -> None:
        if self.steps and not self.running and self.steps[0] <= step <= self.steps[1]:
            self.backend.start_profile(self.folder)
            self.running = True

    def after_step(self, step: int) -> None:
        if self.running and step >= self.steps[1]:
            self.stop()

    def stop(self) -> None:
        if self.running:
            self.backend.stop_profile()
            self.running = False
            self.reporter.say(f"profile written to {self.folder}")


class _Run:
    """The mutable side of one `Trainer.fit` call: state, position and the metrics so far. It trains step groups
    (`epoch`), and hands the cadence, the loss records and the profile to the parts above; evaluation, checkpoints
    and preemption are its own."""

    def __init__(self, trainer: Trainer, state: Any, at: _Position, reporter: Reporter, signals: SignalWatch):
        self.trainer = trainer
        self.signals = signals
        self.backend = trainer.backend
        self.state = state
        self.at = at
        self.reporter = reporter
        self.cadence = _Cadence(trainer.config.runtime, trainer.total_steps)
        # The peak is known before the first step: a CPU's is measured (tpuplex.flops), and once the run computes,
        # its framework's threads and the input thread take cores from the measurement.
        self.log = _LossLog(trainer, reporter, trainer.peak)
        self.profiler = _Profiler(trainer, reporter)
        self.metrics: dict[str, dict[str, float]] = {}
        self.losses: list[float] = []
        self.last_eval_step = self.last_checkpoint_step = -1
        self.train_throughput = Throughput()
        self.eval_throughput = Throughput()
        self.compiles_by_epoch: dict[int, int] = {}
        self.input: Prefetcher | None = None  # the training batches over epochs (`_training_batches`), and
        self.batches: _Lookahead | None = None  # the same with one batch of lookahead (a group's shape)

    # -- training ----------------------------------------------------------------------------------------

    def epoch(self) -> None:
        """Train from the current position to the end of the epoch (or to the last step)."""
        trainer, at = self.trainer, self.at
        stop = min(trainer.total_steps, at.step + trainer.steps_per_epoch - at.position)
        if self.input is None:
            self.input = Prefetcher(self._training_batches(at.step, at.epoch, at.position),
                                    trainer.config.runtime.prefetch * trainer.config.train.steps_per_execution)
            self.batches = _Lookahead(self.input)
        prefetcher, batches = self.input, self.batches
        while at.step < stop:
            started, waited = time.perf_counter(), prefetcher.waited
            read, group = zip(*self._next_group(batches, stop), strict=True)
            self.profiler.before_step(at.step + 1)
            losses = self._run_group(list(group))
            # The group ran as one call: each of its steps is charged an equal share of its wall time (and of
            # its wait for input), so that the log windows, whose edges may cut a group, add up to the run.
            share = 1.0 / len(group)
            elapsed, waited = (time.perf_counter() - started) * share, (prefetcher.waited - waited) * share
            steps = [Throughput().add(batch, trainer.train_flops(task_batch, self.state)).timed(elapsed, waited)
                     for batch, task_batch in zip(read, group, strict=True)]
            self.train_throughput = sum(steps, self.train_throughput)
            self._after_steps(losses, steps)
            self._stop_if_signalled()
        if at.position == trainer.steps_per_epoch:
            at.epoch, at.position = at.epoch + 1, 0
            if self.cadence.eval_every == 0 and self.last_eval_step != at.step:
                self.evaluate()
            if self.cadence.checkpoint_every == 0:
                self.save()
            # Cumulative programs at each epoch's end: equal counts after the first mean no recompilation.
            self.compiles_by_epoch[at.epoch] = self.backend.compile_count()
            self.reporter.record("epoch", at.step, epoch=at.epoch, compiles=self.compiles_by_epoch[at.epoch])

    def _training_batches(self, step: int, epoch: int, position: int) -> Iterator[tuple[Batch, Batch]]:
        """(Batcher's batch, task's batch) for every step after `step` (batch `position` of `epoch`) to the last, over
        epochs: the input thread (`runtime.prefetch` calls ahead, each of `steps_per_execution` batches, since a
        group's batches are all taken before it runs) builds the next epoch's first groups while this one's last group
        runs, and the next group while a group runs. Each batch is made by the task for the step that trains on it;
        the Batcher's rides along (its attention_mask counts the real tokens). Only the batches this run trains on are
        built (and their records read)."""
        trainer = self.trainer
        while step < trainer.total_steps:
            count = min(trainer.total_steps - step, trainer.steps_per_epoch - position)
            for batch in itertools.islice(trainer.train_batcher.train_batches(epoch, position), count):
                step += 1
                yield batch, trainer.data.train_batch(batch, step)
            epoch, position = epoch + 1, 0

    def close_input(self) -> None:
        if self.input is not None:
            self.input.close()

    def _next_group(self, batches: _Lookahead, stop: int) -> list[tuple[Batch, Batch]]:
        """The next 1 or `steps_per_execution` (Batcher's batch, task's batch) pairs: a whole group only if it ends
        at or before the next evaluation/checkpoint/profile boundary and all its batches share one shape."""
        k = self.trainer.config.train.steps_per_execution
        group = [next(batches)]
        if k > 1 and self.cadence.next_boundary(self.at.step, stop) - self.at.step >= k:
            shape = shapes(group[0][1])
            # A shape change may cut the group short; `_run_group` then runs its batches one by one.
            while len(group) < k and batches.peek() is not None and shapes(batches.peek()[1]) == shape:
                group.append(next(batches))
        return group

    def _run_group(self, group: list[Batch]) -> list[float]:
        first = self.at.step + 1
        rates = [self.trainer.learning_rate(first + i) for i in range(len(group))]
        k = self.trainer.config.train.steps_per_execution
        watchdog = self.trainer.hosts.watchdog
        with watchdog.watch(f"step {first}"):
            if k > 1 and len(group) == k:
                self.state, losses = self.backend.train_steps(self.state, group, rates)
                losses = [float(loss) for loss in losses]
            else:
                losses = []
                for batch, rate in zip(group, rates, strict=True):
                    self.state, loss = self.backend.train_step(self.state, batch, rate)
                    losses.append(float(loss))
        watchdog.started()  # start-up and the first compilation are behind: runtime.host_timeout from here
        return losses

    def _after_steps(self, losses: list[float], steps: list[Throughput]) -> None:
        """Account for the steps just run (their losses, and each one's throughput and share of the time): loss
        check, log records, progress, then the step-cadence events."""
        at = self.at
        for offset, (loss, work) in enumerate(zip(losses, steps, strict=True)):
            step = at.step + offset + 1
            if not math.isfinite(loss):
                self._stop(step, f"loss became {loss}")
            self.log.add(step, loss, at.epoch, work)
        at.step += len(losses)
        at.position += len(losses)
        self.losses.extend(losses)
        so_far = self.log.figures(self.train_throughput, at.step)
        self.reporter.advance(at.step, losses[-1], so_far["examples_per_s"], so_far["mfu"])
        self.profiler.after_step(at.step)
        # The last step always evaluates here, before any save, so its checkpoint holds the final metrics.
        if self.cadence.evaluates_after(at.step):
            self.evaluate()
        if self.cadence.saves_after(at.step):
            self.save()

    def _stop_if_signalled(self) -> None:
        """After a SIGTERM / SIGINT to any process: checkpoint this step (unless just done) and raise Preempted."""
        received = self.signals.received
        if not self.trainer.hosts.any(received is not None, f"the preemption check after step {self.at.step}"):
            return
        received = received or "a signal to another process"
        if self.last_checkpoint_step != self.at.step:
            self.save()
        path = self.trainer.checkpoint_root / checkpoint.step_dir_name(self.at.step)
        self.reporter.record("preempted", self.at.step, signal=received, checkpoint=str(path))
        raise Preempted(received, self.at.step, path)

    def _stop(self, step: int, what: str) -> None:
        """End training on a diverged state, naming the last good checkpoint (none is written of this one)."""
        last_good = checkpoint.latest(self.trainer.checkpoint_root)
        rate = self.trainer.config.train.learning_rate
        message = (f"{what} at step {step}; last good checkpoint: {last_good or 'none'}; lower "
                   f"train.learning_rate (now {rate:g}) or raise train.warmup_ratio, and start again in a new "
                   "runtime.output_dir")
        self.reporter.record("error", step, message=message)
        raise TpuplexError(message)

    # -- evaluation and checkpoints ------------------------------------------------------------------------

    def evaluate(self) -> None:
        """Metrics of every eval split at the current step, each real example counted exactly once."""
        for split in self.trainer.eval_batchers:
            metrics, work = self.trainer.evaluate_split(self.state, split, f"evaluation at step {self.at.step}")
            self.eval_throughput += work
            self.metrics[split] = metrics
            self.reporter.record("eval", self.at.step, split=split, **metrics)
            self.reporter.say(f"step {self.at.step} {split}: {headline(metrics)}")
        self.last_eval_step = self.at.step
        if self.trainer.on_evaluation is not None:
            self.trainer.on_evaluation(self.at.step, self.trainer.total_steps, self.metrics)

    def save(self) -> None:
        """Checkpoint the current state, refusing a state whose parameters are no longer finite. Every process writes
        the slices it holds (`checkpoint.save`, collective); none goes on before the checkpoint is in place."""
        trainer, at, hosts = self.trainer, self.at, self.trainer.hosts
        slices = trainer.without_frozen(self.backend.state_to_slices(self.state))
        broken = sorted(name for name, held in slices.params.items()
                        if not all(np.all(np.isfinite(piece.data)) for piece in as_slices(held)))
        if hosts.any(bool(broken), f"the finiteness check of step {at.step}"):
            self._stop(at.step, f"parameter {broken[0] if broken else 'on another process'} became non-finite")
        if slices.step != at.step:
            raise RuntimeError(f"backend {self.backend.name} reports {slices.step} optimizer steps, "
                               f"the trainer ran {at.step}")
        trainer_state = {"step": at.step, "epoch": at.epoch, "position": at.position,
                         "seed": trainer.config.train.seed, "config_hash": trainer.config.hash(),
                         "config": trainer.config.to_dict(),
                         "total_steps": trainer.total_steps,
                         "train_data": trainer.train_data_fingerprint,
                         "metrics": self.metrics}
        if trainer.model is not None and trainer.model.frozen:
            trainer_state["base_sha256"] = trainer.model.base_sha256
        checkpoint.save(trainer.checkpoint_root, slices, trainer_state, trainer.config.runtime.keep_checkpoints, hosts)
        path = trainer.checkpoint_root / checkpoint.step_dir_name(at.step)
        self.reporter.record("checkpoint", at.step, path=str(path))
        self.last_checkpoint_step = at.step


class _Lookahead:
    """An iterator with one item of lookahead (`peek` returns None at the end): (Batcher's batch, task's batch)."""

    _END = object()

    def __init__(self, items: Iterator[tuple[Batch, Batch]]):
        self._items = items
        self._next: Any = next(items, self._END)

    def __next__(self) -> tuple[Batch, Batch]:
        if self._next is self._END:
            raise StopIteration
        item, self._next = self._next, next(self._items, self._END)
        return item

    def peek(self) -> tuple[Batch, Batch] | None:
        return None if self._next is self._END else self._next


def shapes(batch: Batch) -> dict[str, tuple[int, ...]]:
    """Each array's shape: batches with equal shapes run one compiled program."""
    return {key: value.shape for key, value in batch.items()}

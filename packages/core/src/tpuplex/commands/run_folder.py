"""A finished (or interrupted) run as the workflow commands find it: its folder, a checkpoint, and its config.

`tpuplex train` writes `<output_dir>/run.json`: the config as given and the directory it ran from, so that eval,
predict and export rebuild exactly that experiment from anywhere. Relative paths in the config (data, model, cache)
are read from the directory the run started in when they exist there. It also keeps the model's config.json and
tokenizer files in `<output_dir>/model/`: a run folder copied alone (the checkpoint folder it started from gone)
generates and exports from them.

    record(config)   what run.json holds
    keep_model_files(checkpoint_dir, run_dir)   the model's config.json and tokenizer, beside the run
    locate(path)     a run folder (its newest good checkpoint) or one of its checkpoints/step-* folders, verified,
                     with the run's config (`data_dir` replaces its data.data_dir)
    trained_backend(run_dir)   the backend the run trained on, what eval, predict and generate use by default
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tpuplex import config as config_lib
from tpuplex.checkpoints import MINILM_ALIAS, is_hub_id
from tpuplex.config import Config
from tpuplex.engine import checkpoint
from tpuplex.engine.run_log import LOG_FILE
from tpuplex.errors import CheckpointError
from tpuplex.models.gguf import SMOLLM2_ALIAS
from tpuplex.plugins import add_search_path, search_paths
from tpuplex.text_files import as_umask_allows

RUN_FILE = "run.json"
RUN_PATHS = {**config_lib.INPUT_PATHS, "data": (*config_lib.INPUT_PATHS["data"], "cache_dir")}
"""The paths of run.json's config that are read from the directory the run started in: its inputs, and the cache
the run wrote there."""


@dataclasses.dataclass(frozen=True)
class Found:
    """A checkpoint of a run. config: the run's config with its relative paths resolved; config_hash: the hash
    the run recorded (of the config as given); hash_with_length: that config's `Config.hash_with_length`, which
    checkpoints written before the training length left the hash recorded."""

    run_dir: Path
    checkpoint: Path
    config: Config
    config_hash: str
    hash_with_length: str = ""

    def written_by_this_run(self, recorded: object) -> bool:
        """Whether a checkpoint's recorded config hash is this run's (`Config.hash_matches`)."""
        return recorded in (self.config_hash, self.hash_with_length or self.config_hash)


MODEL_DIR = "model"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.json",
                   "merges.txt", "spiece.model", "sentencepiece.bpe.model", "added_tokens.json")
MODEL_FILES = ("config.json", "generation_config.json", "chat_template.jinja", *TOKENIZER_FILES)
"""A checkpoint folder's files besides its weights: what building the model and reading text need."""

RUN_FORMAT = "tpuplex.run/1"
"""run.json's `format`: what tells a run's folder from a folder of yours that happens to hold a run.json."""


def record(config: Config, pinned_options: dict[str, Any]) -> dict[str, Any]:
    """The content of `<output_dir>/run.json`, which `tpuplex train` writes before its first step: its format, the
    config, the directory, the task options the data decided (`TaskData.pinned_options`) and the folders a model
    or task of your own imported from (the config's own among them)."""
    return {"format": RUN_FORMAT, "config": config.to_dict(), "directory": os.getcwd(),
            "task_options": pinned_options, "search_path": search_paths()}


def keep_model_files(checkpoint_dir: Path, run_dir: Path) -> None:
    """Copy the model's `MODEL_FILES` (those it has) from its checkpoint folder into `<run_dir>/model/`, whole or
    not at all (staged, then renamed into place), once: a `model/` already there (the run's own from an earlier
    start, or a folder of yours) is left as it is."""
    kept = run_dir / MODEL_DIR
    if kept.exists():
        return
    staging = Path(tempfile.mkdtemp(prefix=f".{MODEL_DIR}-", dir=run_dir))
    try:
        for name in MODEL_FILES:
            if (Path(checkpoint_dir) / name).is_file():
                shutil.copy2(Path(checkpoint_dir) / name, staging / name)
        os.rename(as_umask_allows(staging), kept)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def written_by_a_run(path: Path) -> bool:
    """Whether `path` is a run.json `tpuplex train` wrote: its `format`, or (before the format was recorded) the
    config and directory and nothing else."""
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    if not isinstance(content, dict):
        return False
    if content.get("format") == RUN_FORMAT:
        return True
    return ({"config", "directory"} <= set(content) <= {"config", "directory", "task_options"}
            and isinstance(content["config"], dict))


def locate(path: str | Path, data_dir: str | None = None) -> Found:
    """The checkpoint `path` names (a run folder: its newest checkpoint that verifies) and the run's config, with
    data.data_dir replaced by `data_dir` when given."""
    path = Path(path).expanduser()
    run_dir = folder_of(path)
    if run_dir != path:
        step_dir = path
        problem = checkpoint.verify(step_dir)
        if problem:
            raise CheckpointError(f"checkpoint {step_dir} is damaged ({problem}): give another checkpoint of the run")
    else:
        step_dir = checkpoint.latest_good(path / "checkpoints", lambda line: None)
        if step_dir is None:
            raise CheckpointError(f"{path} holds no checkpoint (no checkpoints/step-* folder that verifies): give a "
                                  "run folder (runtime.output_dir of a tpuplex train run) or one of its "
                                  "checkpoints/step-* folders")
    recorded = run_dir / RUN_FILE
    try:
        written = json.loads(recorded.read_text(encoding="utf-8"))
        directory = Path(written.get("directory", "."))
        for folder in [directory, *map(Path, written.get("search_path", []))]:
            add_search_path(folder)  # a model or task of your own imports as it did in training
        given = config_lib.from_dict(written["config"])
        config = config_lib.from_dict(config_lib.rebased_inputs(written["config"], directory, RUN_PATHS))
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"{recorded} is unreadable ({type(error).__name__}): restore it from the run") from None
    pinned = written.get("task_options") or {}
    config = dataclasses.replace(config, task=dataclasses.replace(config.task, options={**config.task.options,
                                                                                        **pinned}))
    if data_dir is not None:
        config = dataclasses.replace(config, data=dataclasses.replace(config.data, data_dir=data_dir))
    if _moved_away(config.model.checkpoint) and (run_dir / MODEL_DIR / "config.json").is_file():
        config = dataclasses.replace(config, model=dataclasses.replace(config.model,
                                                                       checkpoint=str(run_dir / MODEL_DIR)))
    return Found(run_dir, step_dir, config, given.hash(), given.hash_with_length())


def trained_backend(run_dir: Path) -> str:
    """The backend the run in `run_dir` trained on: its log's first `start` record names it."""
    path = run_dir / LOG_FILE
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines() if path.is_file() else []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut by a kill: the start record comes first, whole
        if isinstance(record, dict) and record.get("event") == "start" and isinstance(record.get("backend"), str):
            return record["backend"]
    raise CheckpointError(f"{path} names no backend the run trained on: give one (--backend, or backend= in Python): "
                          "torch, jax or tf")


def _moved_away(checkpoint: str) -> bool:
    """Whether model.checkpoint names a local folder or .gguf file that is no longer there (an alias or a hub id
    is found as it was in training)."""
    if not checkpoint or checkpoint in (MINILM_ALIAS, SMOLLM2_ALIAS) or is_hub_id(checkpoint):
        return False
    return not Path(checkpoint).expanduser().exists()


def folder_of(path: Path) -> Path:
    """The run folder of `path` (a run folder, or one of its checkpoints/step-* folders), which must hold the
    run's run.json; no checkpoint is verified yet."""
    if (path / checkpoint.MANIFEST).is_file() or (path / "trainer.json").is_file():
        run_dir = path.parent.parent
    elif path.is_file():
        raise CheckpointError(f"{path} is a file: give a run folder (runtime.output_dir of a tpuplex train run) or one "
                              "of its checkpoints/step-* folders")
    elif path.is_dir():
        run_dir = path
    else:
        raise CheckpointError(f"{path} does not exist: give a run folder (runtime.output_dir of a tpuplex train run) "
                              "or one of its checkpoints/step-* folders")
    if not (run_dir / RUN_FILE).is_file():
        raise CheckpointError(f"{run_dir} has no {RUN_FILE}, so it holds no checkpoint of a run: give the folder a "
                              "tpuplex train run wrote (runtime.output_dir), or one of its checkpoints/step-* folders")
    return run_dir

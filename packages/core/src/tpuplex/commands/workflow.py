"""What a researcher does with a trained run: evaluate a checkpoint and write predictions, on any backend.

    evaluate(path, backend, split)   metrics of a checkpoint (written by any backend) on the run's eval splits,
                                     counted exactly as in training; written to <run>/eval/<step>-<backend>.json
    predict(path, backend, split)    the task's prediction files of a split (sequence classification: for GLUE
                                     test files the leaderboard files, `index<TAB>prediction`)

Both rebuild the run's experiment from its run.json (`tpuplex.commands.run_folder`) on the chosen backend and load
the portable checkpoint into it, so a checkpoint trained on torch evaluates on jax or tf with the same numbers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpuplex import tasks
from tpuplex.commands import run_folder
from tpuplex.commands.run import Experiment, foreign_files, prepare, write_json_atomic
from tpuplex.engine import checkpoint
from tpuplex.errors import CheckpointError, TpuplexError

EVAL_DIR = "eval"
PREDICTIONS_DIR = "predictions"


def restore(found: run_folder.Found, backend_name: str, model_only: bool = False) -> tuple[Experiment, Any]:
    """The run's experiment built on `backend_name` with its state set to the checkpoint; `model_only`: without
    reading its data where the task can (to generate: `run.prepare`). The run's runtime.mesh is kept where it fits
    the backend and its devices; elsewhere the checkpoint is read replicated over the devices there are
    (`run.create_backend`), so a sharded run evaluates on any backend and any mesh."""
    arrays, info = checkpoint.load(found.checkpoint, verified=True)
    if not found.written_by_this_run(info.get("config_hash")):
        raise CheckpointError(f"{found.checkpoint} was written with config hash {info.get('config_hash')}, but "
                              f"{found.run_dir / run_folder.RUN_FILE} has {found.config_hash}: give a checkpoint of "
                              "this run")
    experiment = prepare(found.config, backend_name, model_only=model_only, any_layout=True)
    arrays = experiment.trainer.with_frozen(arrays, info, found.checkpoint)
    return experiment, experiment.backend.state_from_arrays(experiment.state, arrays)


def evaluate(path: str | Path, backend_name: str, split: str | None = None, data_dir: str | None = None,
             out: Path | None = None) -> dict[str, Any]:
    """Evaluate the checkpoint `path` names on `backend_name`: every eval split, or `split`. Returns (and writes
    to `out`, by default `<run>/eval/<step>-<backend>.json`) the metrics with where they came from."""
    found = run_folder.locate(path, data_dir)
    return evaluate_restored(found, *restore(found, backend_name), split, out)


def evaluate_restored(found: run_folder.Found, experiment: Experiment, state: Any, split: str | None = None,
                      out: Path | None = None) -> dict[str, Any]:
    """`evaluate` of a checkpoint already restored (`restore`)."""
    trainer, backend_name = experiment.trainer, experiment.backend_name
    splits = list(trainer.eval_batchers)
    if split is not None and split not in splits:
        raise TpuplexError(f"the run has no evaluation split {split!r}: use one of {', '.join(splits)}")
    metrics = {name: trainer.evaluate_split(state, name)[0] for name in ([split] if split else splits)}
    result = {"checkpoint": str(found.checkpoint), "backend": backend_name, "topology": experiment.topology.report(),
              "task": experiment.task.name, "dataset": experiment.data.name, "config_hash": found.config_hash,
              "examples": {name: len(trainer.eval_batchers[name].data) for name in metrics}, "metrics": metrics}
    if trainer.hosts.writer:
        out = out or found.run_dir / EVAL_DIR / f"{found.checkpoint.name}-{backend_name}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        result["written"] = str(write_json_atomic(out, result))
    return result


def predict(path: str | Path, backend_name: str, split: str = "test", data_dir: str | None = None,
            out: Path | None = None) -> dict[str, Path]:
    """Predictions of the checkpoint `path` names on `split` ("test": every test file), one TSV per split in
    `out` (default `<run>/predictions/<step>-<backend>/`): GLUE's submission files for GLUE test splits, else
    `<split>.tsv`. Returns split -> file. Files appear whole: they are written beside and renamed into place."""
    found = run_folder.locate(path, data_dir)
    if out is not None:
        check_prediction_folder(Path(out))
    task = tasks.get(found.config.task.name)
    sources = task.prediction_sources(found.config, split)  # checked before any backend starts
    experiment, state = restore(found, backend_name)
    out = Path(out or found.run_dir / PREDICTIONS_DIR / f"{found.checkpoint.name}-{backend_name}")
    if experiment.trainer.hosts.writer:
        out.mkdir(parents=True, exist_ok=True)
        (out / PREDICTIONS_MARK).write_text("written by tpuplex predict: its files may be written again\n")
    return task.write_predictions(experiment, state, sources, out, experiment.trainer.hosts.writer)


PREDICTIONS_MARK = ".tpuplex-predictions"
"""In every folder `tpuplex predict` writes to: a later predict may replace its files, and no other folder's."""


def check_prediction_folder(out: Path) -> None:
    """`--out` must be a new or empty folder, or one `tpuplex predict` wrote before: predictions never replace a file
    tpuplex did not write (the dev.tsv of the data folder the run read, say)."""
    if out.exists() and not out.is_dir():
        raise TpuplexError(f"--out {out} is a file: give a folder for the prediction files (it is created if "
                           "missing)")
    shown = foreign_files(out, PREDICTIONS_MARK)
    if shown:
        raise TpuplexError(f"--out {out} holds files tpuplex did not write ({shown}): give a new or empty folder "
                           "for the prediction files, so none of yours is replaced")

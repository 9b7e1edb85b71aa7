"""The portable checkpoint: one directory per step that every backend reads and writes.

    <root>/step-00000120/
        model.safetensors       parameters under the task's HF names (torch layout), and the model's non-trainable
                                state (batch-norm statistics), as a torch state_dict holds both
        optimizer.safetensors   Adam moments: "exp_avg.<name>" and "exp_avg_sq.<name>"
        trainer.json            optimizer step, epoch, batch position in the epoch, seed, config hash, metrics
        manifest.json           the bytes and sha256 of each file above, written last

A checkpoint is written into a hidden temporary directory beside it and renamed into place, so a crash leaves
either a whole checkpoint or none; a write that fails (a full disk) removes its temporary directory and leaves the
existing checkpoints as they were. Only the newest `keep` are kept, pruned after the new one is in place. A copy
cut short or a file damaged later fails `verify`, and resuming skips to the newest checkpoint that passes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save_file

from tpuplex.errors import TpuplexError
from tpuplex.protocol import PortableState
from tpuplex.text_files import as_umask_allows

_STEP_DIR = re.compile(r"step-(\d{8})")
MOMENTS = ("exp_avg", "exp_avg_sq")
FILES = ("model.safetensors", "optimizer.safetensors", "trainer.json")
MANIFEST = "manifest.json"


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def save(root: str | Path, state: PortableState, trainer_state: dict[str, Any], keep: int) -> Path:
    """Write `state` and `trainer_state` as `<root>/step-<state.step>` atomically, then keep the newest `keep`."""
    root = Path(root)
    final = root / step_dir_name(state.step)
    staging = None
    try:
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
        weights = {**state.params, **state.buffers}
        # np.asarray keeps a 0-d counter (num_batches_tracked) 0-d, where np.ascontiguousarray makes it [1].
        save_file({name: np.asarray(a, order="C") for name, a in weights.items()}, staging / "model.safetensors")
        moments = {f"{kind}.{name}": np.ascontiguousarray(array)
                   for kind in MOMENTS for name, array in getattr(state, kind).items()}
        save_file(moments, staging / "optimizer.safetensors")
        (staging / "trainer.json").write_text(json.dumps({**trainer_state, "optimizer_step": state.step}, indent=2))
        (staging / MANIFEST).write_text(json.dumps({name: _describe(staging / name) for name in FILES}, indent=2))
        if final.exists():
            shutil.rmtree(final)
        os.rename(as_umask_allows(staging), final)
    except BaseException as error:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, OSError):
            raise TpuplexError(
                f"could not write checkpoint {final} ({error.strerror or error}); the checkpoints already in {root} "
                "are untouched: free space there or point runtime.output_dir elsewhere, then run the same command "
                "to resume") from error
        raise
    for old in checkpoints(root)[:-keep]:
        shutil.rmtree(old)
    return final


def verify(path: str | Path) -> str | None:
    """None when the checkpoint at `path` is whole (every file there, with the manifest's size and sha256);
    otherwise what is wrong, in a few words."""
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        return f"no {MANIFEST}"
    except (OSError, ValueError) as error:
        return f"{MANIFEST} is unreadable ({type(error).__name__})"
    if not isinstance(manifest, dict) or set(manifest) != set(FILES):
        return f"{MANIFEST} does not list {', '.join(FILES)}"
    for name in FILES:
        if not (path / name).is_file():
            return f"no {name}"
        found, expected = _describe(path / name), manifest[name]
        if found["bytes"] != expected.get("bytes"):
            return f"{name} has {found['bytes']} bytes, the manifest says {expected.get('bytes')}"
        if found["sha256"] != expected.get("sha256"):
            return f"{name} does not match its sha256"
    return None


def latest_good(root: str | Path, on_damaged: Callable[[str], None]) -> Path | None:
    """The newest checkpoint under `root` that verifies, after reporting each damaged newer one (one line each
    through `on_damaged`); None when there is no checkpoint. Raises TpuplexError when every one is damaged."""
    found = checkpoints(root)
    problems = []
    for path in reversed(found):
        problem = verify(path)
        if problem is None:
            return path
        problems.append(f"{path.name}: {problem}")
        on_damaged(f"skipping damaged checkpoint {path} ({problem})")
    if found:
        raise TpuplexError(f"no usable checkpoint in {root} ({'; '.join(problems)}): restore a good checkpoint "
                           "there, or move the folder aside (or set a new runtime.output_dir) to start afresh")
    return None


def _describe(path: Path) -> dict[str, Any]:
    with path.open("rb") as handle:
        return {"bytes": path.stat().st_size, "sha256": hashlib.file_digest(handle, "sha256").hexdigest()}


def checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first (temporary directories are ignored)."""
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise TpuplexError(f"{root} is a file, where the run keeps its checkpoints: move it aside")
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and _STEP_DIR.fullmatch(p.name))


def latest(root: str | Path) -> Path | None:
    """The newest complete checkpoint under `root`, or None."""
    found = checkpoints(root)
    return found[-1] if found else None


def load(path: str | Path, verified: bool = False) -> tuple[PortableState, dict[str, Any]]:
    """Read a checkpoint directory into a PortableState and its trainer state, after `verify` (skipped when
    `verified`: the path comes from `latest_good`, which has just checked it)."""
    path = Path(path)
    problem = None if verified else verify(path)
    if problem is not None:
        raise TpuplexError(f"checkpoint {path} is damaged or incomplete ({problem}): "
                           "point at a whole step-* directory written by tpuplex")
    trainer_state = json.loads((path / "trainer.json").read_text())
    weights = load_file(path / "model.safetensors")
    optimizer = load_file(path / "optimizer.safetensors")
    moments = {kind: {name[len(kind) + 1:]: array for name, array in optimizer.items()
                      if name.startswith(f"{kind}.")} for kind in MOMENTS}
    # The weights with Adam moments are parameters; the rest is the model's non-trainable state.
    params = {name: array for name, array in weights.items() if name in moments["exp_avg"]}
    buffers = {name: array for name, array in weights.items() if name not in moments["exp_avg"]}
    state = PortableState(params=params, exp_avg=moments["exp_avg"], exp_avg_sq=moments["exp_avg_sq"],
                          step=int(trainer_state["optimizer_step"]), buffers=buffers)
    return state, trainer_state

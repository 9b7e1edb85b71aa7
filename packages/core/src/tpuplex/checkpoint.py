"""The portable checkpoint: one directory per step that every backend reads and writes.

    <root>/step-00000120/
        model.safetensors       parameters under the family's HF *ForSequenceClassification names (torch layout)
        optimizer.safetensors   Adam moments: "exp_avg.<name>" and "exp_avg_sq.<name>"
        trainer.json            optimizer step, epoch, batch position in the epoch, seed, config hash, metrics

A checkpoint is written into a hidden temporary directory beside it and renamed into place, so a crash leaves
either a whole checkpoint or none. Only the newest `keep` are kept.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save_file

from tpuplex.errors import TpuplexError
from tpuplex.protocol import PortableState

_STEP_DIR = re.compile(r"step-(\d{8})")
MOMENTS = ("exp_avg", "exp_avg_sq")


def save(root: str | Path, state: PortableState, trainer_state: dict[str, Any], keep: int) -> Path:
    """Write `state` and `trainer_state` as `<root>/step-<state.step>` atomically, then keep the newest `keep`."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{state.step:08d}"
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
    try:
        save_file({name: np.ascontiguousarray(a) for name, a in state.params.items()}, staging / "model.safetensors")
        moments = {f"{kind}.{name}": np.ascontiguousarray(array)
                   for kind in MOMENTS for name, array in getattr(state, kind).items()}
        save_file(moments, staging / "optimizer.safetensors")
        (staging / "trainer.json").write_text(json.dumps({**trainer_state, "optimizer_step": state.step}, indent=2))
        if final.exists():
            shutil.rmtree(final)
        os.rename(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    for old in checkpoints(root)[:-keep]:
        shutil.rmtree(old)
    return final


def checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first (temporary directories are ignored)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and _STEP_DIR.fullmatch(p.name))


def latest(root: str | Path) -> Path | None:
    """The newest complete checkpoint under `root`, or None."""
    found = checkpoints(root)
    return found[-1] if found else None


def load(path: str | Path) -> tuple[PortableState, dict[str, Any]]:
    """Read a checkpoint directory into a PortableState and its trainer state."""
    path = Path(path)
    missing = [f for f in ("model.safetensors", "optimizer.safetensors", "trainer.json") if not (path / f).is_file()]
    if missing:
        raise TpuplexError(f"checkpoint {path} is incomplete (no {', '.join(missing)}): "
                           "point at a step-* directory written by tpuplex")
    trainer_state = json.loads((path / "trainer.json").read_text())
    params = load_file(path / "model.safetensors")
    optimizer = load_file(path / "optimizer.safetensors")
    moments = {kind: {name[len(kind) + 1:]: array for name, array in optimizer.items()
                      if name.startswith(f"{kind}.")} for kind in MOMENTS}
    state = PortableState(params=params, exp_avg=moments["exp_avg"], exp_avg_sq=moments["exp_avg_sq"],
                          step=int(trainer_state["optimizer_step"]))
    return state, trainer_state

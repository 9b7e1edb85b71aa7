"""The portable checkpoint: one directory per step that every backend reads and writes.

    <root>/step-00000120/
        model.safetensors       parameters under the task's HF names (torch layout), and the model's non-trainable
                                state (batch-norm statistics), as a torch state_dict holds both
        optimizer.safetensors   Adam moments: "exp_avg.<name>" and "exp_avg_sq.<name>"
        model.process-00001.safetensors, optimizer.process-00001.safetensors, ...
                                in a run of several processes that shards its state, what process 1 holds, ...
        trainer.json            optimizer step, epoch, batch position in the epoch, seed, config hash, metrics
        manifest.json           the bytes and sha256 of each file above, written last

Every process writes the slices of the state it holds (`tpuplex.slices.Slice`), process 0 into the first two
files, so no process gathers a sharded array whole. A whole array is stored under its name, a slice under
`<name>@<offset per dimension>`, its offset and the whole's shape in the file's metadata: a replicated run's
checkpoint is a pair of plain state_dict files. `load` gives each array as a `StoredArray`, which reads only the
slices a block needs, so a run on any mesh (or none) takes what its devices hold from any checkpoint.

The processes write into one hidden directory beside the step, named with a number process 0 draws; process 0
writes the manifest once all have written and renames the directory into place, so a crash (a SIGKILL) leaves
either a whole checkpoint or none (and the hidden directory, which the run's next save removes); a write that
fails (a full disk) removes the directory and leaves the existing checkpoints as they were. Only the newest `keep`
are kept, pruned after the new one is in place. A copy cut short or a file damaged later fails `verify`, and
resuming skips to the newest checkpoint that passes.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from tpuplex.errors import CheckpointError
from tpuplex.hosts import Hosts
from tpuplex.models.weights import SAFETENSORS_DTYPES
from tpuplex.protocol import PortableState
from tpuplex.slices import BlockReader, Index, Slice, as_slices, bounds
from tpuplex.text_files import as_umask_allows

_STEP_DIR = re.compile(r"step-(\d{8})")
_STAGING_DIR = re.compile(r"\.step-\d{8}\.writing-[0-9a-f]{8}")
"""The hidden directory a save writes into (`save`: the step's name and process 0's 32-bit draw)."""
_PROCESS_FILE = re.compile(r"(model|optimizer)\.process-\d{5}\.safetensors")
MOMENTS = ("exp_avg", "exp_avg_sq")
FILES = ("model.safetensors", "optimizer.safetensors", "trainer.json")
MANIFEST = "manifest.json"
SLICES_METADATA = "tpuplex.slices"
"""The safetensors metadata entry that places each slice: key -> {"name", "start", "shape" (the whole's)}."""


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def save(root: str | Path, state: PortableState, trainer_state: dict[str, Any], keep: int,
         hosts: Hosts | None = None) -> Path:
    """Write `state` and `trainer_state` as `<root>/step-<state.step>` atomically, then keep the newest `keep`.

    state: whole arrays (written by process 0) or, per array, the `Slice`s this process writes (a backend's
        `state_to_slices`: each slice of a sharded array from exactly one process).
    hosts: the run's processes; every one calls `save` at the same point (it is collective). None: one process.
    """
    hosts = hosts or Hosts.alone()
    root = Path(root)
    final = root / step_dir_name(state.step)
    staging = root / f".{final.name}.writing-{hosts.shared_token('naming the checkpoint being written'):08x}"

    created = False  # only a directory this save made is ever removed

    def create() -> None:
        nonlocal created
        if hosts.writer:
            root.mkdir(parents=True, exist_ok=True)
            _remove_stale_staging(root, staging)
            staging.mkdir()
            created = True

    def publish() -> None:
        if not hosts.writer:
            return
        (staging / "trainer.json").write_text(json.dumps({**trainer_state, "optimizer_step": state.step}, indent=2))
        listed = sorted(p.name for p in staging.iterdir())
        (staging / MANIFEST).write_text(json.dumps({name: _describe(staging / name) for name in listed}, indent=2))
        if final.exists():
            shutil.rmtree(final)
        os.rename(as_umask_allows(staging), final)

    try:
        for what, work in (("creating", create), ("writing its slices of", lambda: _write(staging, state, hosts.index)),
                           ("publishing", publish)):
            _together(hosts, f"{what} checkpoint {final.name}", work, final)
    except BaseException:
        if created:
            shutil.rmtree(staging, ignore_errors=True)
        raise
    if hosts.writer:
        for old in checkpoints(root)[:-keep]:
            shutil.rmtree(old)
    return final


def _remove_stale_staging(root: Path, current: Path) -> None:
    """Remove what a save killed mid-write (a SIGKILL runs no cleanup) left under `root`: a directory named as
    `save` names them, other than `current`, that holds only files a save writes; a directory of yours under
    such a name keeps its files."""
    for path in root.iterdir():
        if (path != current and _STAGING_DIR.fullmatch(path.name) and path.is_dir() and not path.is_symlink()
                and all(_written_by_save(file) for file in path.iterdir())):
            shutil.rmtree(path, ignore_errors=True)


def _written_by_save(path: Path) -> bool:
    return (path.is_file() and not path.is_symlink()
            and (path.name in (*FILES, MANIFEST) or _PROCESS_FILE.fullmatch(path.name) is not None))


def _together(hosts: Hosts, what: str, work: Callable[[], None], final: Path) -> None:
    """`work` on every process, then a barrier; a TpuplexError on every process if it failed on any."""
    failure = None
    try:
        work()
    except OSError as error:
        failure = error
    if hosts.all_ok(failure is None, what):
        return
    kept = f"the checkpoints already in {final.parent} are untouched"
    if failure is None:
        raise CheckpointError(f"another process failed {what} (its output says why); {kept}: fix that, then run the "
                              "same command to resume")
    raise CheckpointError(
        f"could not write checkpoint {final} ({failure.strerror or failure}); {kept}: free space there or point "
        "runtime.output_dir elsewhere, then run the same command to resume") from failure


def _write(staging: Path, state: PortableState, process_index: int) -> None:
    """This process's slices of `state` into its model and optimizer files in `staging`."""
    model_file, optimizer_file = (FILES[0], FILES[1]) if process_index == 0 else (
        f"model.process-{process_index:05d}.safetensors", f"optimizer.process-{process_index:05d}.safetensors")
    mine = _held_by(process_index)
    _save_slices({name: mine(value) for name, value in {**state.params, **state.buffers}.items()},
                 staging / model_file)
    _save_slices({f"{kind}.{name}": mine(value) for kind in MOMENTS for name, value in getattr(state, kind).items()},
                 staging / optimizer_file)


def _held_by(process_index: int) -> Callable[[Any], Sequence[Slice]]:
    """A state value -> the slices this process writes of it: its own `Slice`s, or a whole array on process 0."""
    def slices(value: Any) -> Sequence[Slice]:
        return as_slices(value) if isinstance(value, (list, tuple)) or process_index == 0 else []
    return slices


def _save_slices(named: Mapping[str, Sequence[Slice]], path: Path) -> None:
    tensors, placed = {}, {}
    for name, slices in named.items():
        for piece in slices:
            # np.asarray keeps a 0-d counter (num_batches_tracked) 0-d, where np.ascontiguousarray makes it [1].
            data = np.asarray(piece.data, order="C")
            if piece.is_whole:
                tensors[name] = data
                continue
            key = f"{name}@{','.join(map(str, piece.start))}"
            tensors[key] = data
            placed[key] = {"name": name, "start": list(piece.start), "shape": list(piece.shape)}
    save_file(tensors, path, metadata={SLICES_METADATA: json.dumps(placed)} if placed else None)
    as_umask_allows(path)  # safetensors creates its files private (0600)


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
    if not isinstance(manifest, dict) or not set(FILES) <= set(manifest):
        return f"{MANIFEST} does not list {', '.join(FILES)}"
    unknown = sorted(name for name in manifest if name not in FILES and not _PROCESS_FILE.fullmatch(name))
    if unknown:
        return f"{MANIFEST} lists {unknown[0]}, which tpuplex does not write"
    for name in sorted(manifest):
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
        raise CheckpointError(f"no usable checkpoint in {root} ({'; '.join(problems)}): restore a good checkpoint "
                              "there, or move the folder aside (or set a new runtime.output_dir) to start afresh")
    return None


def _describe(path: Path) -> dict[str, Any]:
    with path.open("rb") as handle:
        return {"bytes": path.stat().st_size, "sha256": hashlib.file_digest(handle, "sha256").hexdigest()}


def checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first (temporary directories are ignored)."""
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise CheckpointError(f"{root} is a file, where the run keeps its checkpoints: move it aside")
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and _STEP_DIR.fullmatch(p.name))


def latest(root: str | Path) -> Path | None:
    """The newest complete checkpoint under `root`, or None."""
    found = checkpoints(root)
    return found[-1] if found else None


def load(path: str | Path, verified: bool = False) -> tuple[PortableState, dict[str, Any]]:
    """Read a checkpoint directory as a PortableState of `StoredArray`s (read a slice at a time when asked) and its
    trainer state, after `verify` (skipped when `verified`: the path comes from `latest_good`, which has just
    checked it)."""
    path = Path(path)
    problem = None if verified else verify(path)
    if problem is not None:
        raise CheckpointError(f"checkpoint {path} is damaged or incomplete ({problem}): "
                              "point at a whole step-* directory written by tpuplex")
    trainer_state = json.loads((path / "trainer.json").read_text())
    files = sorted(json.loads((path / MANIFEST).read_text()))
    weights = _stored(path, [path / name for name in files if name.startswith("model.")])
    optimizer = _stored(path, [path / name for name in files if name.startswith("optimizer.")])
    moments = {kind: {name[len(kind) + 1:]: array for name, array in optimizer.items()
                      if name.startswith(f"{kind}.")} for kind in MOMENTS}
    # The weights with Adam moments are parameters; the rest is the model's non-trainable state.
    params = {name: array for name, array in weights.items() if name in moments["exp_avg"]}
    buffers = {name: array for name, array in weights.items() if name not in moments["exp_avg"]}
    state = PortableState(params=params, exp_avg=moments["exp_avg"], exp_avg_sq=moments["exp_avg_sq"],
                          step=int(trainer_state["optimizer_step"]), buffers=buffers)
    return state, trainer_state


_DTYPES = {name: dtype for name, dtype in SAFETENSORS_DTYPES.items() if name != "BF16"}
"""What a checkpoint's files may hold: tpuplex writes no bfloat16."""


class StoredArray(BlockReader):
    """An array of a checkpoint, stored as slices in its files: `self[index]` reads the parts of the slices that
    overlap the block `index` (each element once), `np.asarray(self)` the whole."""

    def __init__(self, name: str, shape: tuple[int, ...], dtype: np.dtype,
                 parts: list[tuple[Any, str, tuple[int, ...], tuple[int, ...]]]):
        self.name, self.shape, self.dtype, self._parts = name, shape, dtype, parts

    def __getitem__(self, index: Index) -> np.ndarray:
        wanted = bounds(index, self.shape)
        block = np.empty([stop - start for start, stop in wanted], self.dtype)
        for handle, key, start, size in self._parts:
            overlap = [(max(a, s), min(b, s + n)) for (a, b), s, n in zip(wanted, start, size, strict=True)]
            if any(low >= high for low, high in overlap):
                continue
            if list(size) == [high - low for low, high in overlap]:
                piece = handle.get_tensor(key)  # the whole slice (and a 0-d array, which get_slice cannot read)
            else:
                piece = handle.get_slice(key)[tuple(slice(low - s, high - s)
                                                    for (low, high), s in zip(overlap, start, strict=True))]
            block[tuple(slice(low - a, high - a) for (low, high), (a, _) in zip(overlap, wanted, strict=True))] = piece
        return block


def _stored(folder: Path, paths: list[Path]) -> dict[str, StoredArray]:
    """The arrays stored across `paths` (safetensors files of slices), each checked to be covered exactly."""
    parts: dict[str, list] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, np.dtype] = {}
    for path in paths:
        handle = safe_open(path, framework="np")
        placed = json.loads((handle.metadata() or {}).get(SLICES_METADATA, "{}"))
        for key in handle.keys():
            stored = handle.get_slice(key)
            size = tuple(stored.get_shape())
            where = placed.get(key, {"name": key, "start": [0] * len(size), "shape": list(size)})
            name = where["name"]
            parts.setdefault(name, []).append((handle, key, tuple(where["start"]), size))
            shapes.setdefault(name, tuple(where["shape"]))
            dtypes.setdefault(name, np.dtype(_DTYPES[stored.get_dtype()]))
    for name, pieces in parts.items():
        covered = sum(math.prod(size) for *_, size in pieces)
        if covered != math.prod(shapes[name]):
            raise CheckpointError(f"checkpoint {folder} is damaged: the slices of {name} hold {covered} of its "
                                  f"{math.prod(shapes[name])} elements; resume from another checkpoint")
    return {name: StoredArray(name, shapes[name], dtypes[name], pieces) for name, pieces in parts.items()}

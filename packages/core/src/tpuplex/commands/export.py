"""`tpuplex export`: hand a trained checkpoint to someone who uses plain transformers or TF Serving.

    hf            an HF folder that `AutoModelForSequenceClassification.from_pretrained` and `AutoTokenizer` load:
                  config.json (the checkpoint's, with num_labels, id2label/label2id, problem_type and the family's
                  *ForSequenceClassification in "architectures"), model.safetensors (the portable checkpoint's
                  parameters, already under HF's names and layout) and the tokenizer files. Written by the core,
                  no framework needed.
    saved_model   a TensorFlow SavedModel with a serving signature over token ids, or, for an image run, over
                  encoded JPEG/PNG bytes (written by the tf backend: `tpuplex_tf.export`).
    torch_export  a `torch.export` program plain torch loads (`torch.export.load`), with `serving.json` saying
                  what it takes (written by the torch backend: `tpuplex_torch.export`; image runs).

Either is written into a hidden folder beside `out` and renamed into place: whole or absent.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from tpuplex import kinds, tasks
from tpuplex.commands import run_folder
from tpuplex.engine import checkpoint
from tpuplex.errors import TpuplexError
from tpuplex.text_files import as_umask_allows

FORMATS = {"hf": "the core", "saved_model": "tf", "torch_export": "torch"}
"""Export format -> who writes it: the core, or the backend of that name."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.json",
                   "merges.txt", "spiece.model", "sentencepiece.bpe.model", "added_tokens.json")


def export(path: str | Path, format: str, out: Path | None = None) -> Path:
    """Export the checkpoint `path` names (a run folder or a step folder) as `format`; returns the folder written,
    by default `<run>/export/<step>-<format>`."""
    if format not in FORMATS:
        raise TpuplexError(f"unknown export format {format!r}: use one of {', '.join(FORMATS)}")
    found = run_folder.locate(path)
    out = Path(out) if out else found.run_dir / "export" / f"{found.checkpoint.name}-{format}"
    if out.exists():
        raise TpuplexError(f"{out} already exists: remove it or choose another --out")
    if format == "hf":
        return write_atomically(out, lambda staging: write_hf(found, staging))
    from tpuplex.commands import workflow  # builds a backend: only for the formats a framework writes

    experiment, state = workflow.restore(found, FORMATS[format])
    return write_atomically(out, lambda staging: experiment.backend.export(state, format, staging, experiment.data))


def write_hf(found: run_folder.Found, folder: Path) -> None:
    """The HF folder of `found` (see the module doc) into the empty `folder`."""
    config = found.config
    task = tasks.get(config.task.name)
    kind = kinds.resolve(config, task)
    exported = {**kind.hf_config, "architectures": [kind.hf_class(config, task)], **task.export_config(config)}
    (folder / "config.json").write_text(json.dumps(exported, indent=2) + "\n")
    state, _ = checkpoint.load(found.checkpoint, verified=True)
    weights = kind.hf_weights({name: np.asarray(array) for name, array in {**state.params, **state.buffers}.items()})
    # transformers reads the "format" metadata to know the tensors are in torch layout.
    save_file({name: np.ascontiguousarray(a) for name, a in weights.items()}, folder / "model.safetensors",
              metadata={"format": "pt"})
    for name in TOKENIZER_FILES:
        if (kind.checkpoint_dir / name).is_file():
            shutil.copy2(kind.checkpoint_dir / name, folder / name)


def write_atomically(out: Path, write: Callable[[Path], None]) -> Path:
    """Run `write(staging)` on a hidden folder beside `out`, then rename it to `out`; on failure leave nothing."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        write(staging)
        as_umask_allows(staging).rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out

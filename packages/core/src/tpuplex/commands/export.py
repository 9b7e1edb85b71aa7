"""`tpuplex export`: hand a trained checkpoint to someone who uses plain transformers or TF Serving.

    hf            an HF folder that `AutoModelFor<Task>.from_pretrained` and `AutoTokenizer` load: config.json (the
                  checkpoint's, with the task's settings, e.g. num_labels and id2label, and its HF class in
                  "architectures"), model.safetensors (the portable checkpoint's parameters, already under HF's
                  names and layout, written a block at a time: the model is never whole in memory) and the
                  tokenizer files (a character-level run's vocabulary written as one: `Characters.save_pretrained`).
                  A LoRA run's needs `--merge`: its adapters folded into the base (W += alpha / rank * B A).
                  Written by the core, no framework needed.
    peft          a LoRA run's adapters as PEFT writes them: adapter_config.json and adapter_model.safetensors, which
                  `peft.PeftModel.from_pretrained(base, folder)` puts on the base model (the HF folder the run read,
                  named in the config).
    saved_model   a TensorFlow SavedModel with a serving signature over token ids, or, for an image run, over
                  encoded JPEG/PNG bytes (written by the tf backend: `tpuplex_tf.export`).
    torch_export  a `torch.export` program plain torch loads (`torch.export.load`), with `serving.json` saying
                  what it takes (written by the torch backend: `tpuplex_torch.export`; image runs).

Either is written into a hidden folder beside `out` and renamed into place: whole or absent.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tpuplex import kinds, tasks
from tpuplex.commands import run_folder
from tpuplex.engine import checkpoint
from tpuplex.errors import TpuplexError
from tpuplex.models.lora import PEFT_PREFIX, Lora, fingerprint
from tpuplex.models.weights import save_weights
from tpuplex.slices import SliceReader
from tpuplex.tasks.causal_lm.data import Characters
from tpuplex.text_files import as_umask_allows

FORMATS = {"hf": "the core", "peft": "the core", "saved_model": "tf", "torch_export": "torch"}
"""Export format -> who writes it: the core, or the backend of that name."""


def export(path: str | Path, format: str, out: Path | None = None, merge: bool = False) -> Path:
    """Export the checkpoint `path` names (a run folder or a step folder) as `format`; returns the folder written,
    by default `<run>/export/<step>-<format>` (`-merged` with `merge`)."""
    if format not in FORMATS:
        raise TpuplexError(f"unknown export format {format!r}: use one of {', '.join(FORMATS)}")
    if merge and format != "hf":
        raise TpuplexError(f"--merge folds a LoRA run's adapters into an HF folder: use it with --format hf, not "
                           f"{format}")
    found = run_folder.locate(path)
    suffix = "-merged" if merge else ""
    out = Path(out) if out else found.run_dir / "export" / f"{found.checkpoint.name}-{format}{suffix}"
    if out.exists():
        raise TpuplexError(f"{out} already exists: remove it or choose another --out")
    if format in ("hf", "peft"):
        trained = Trained.read(found)
        write = trained.write_peft if format == "peft" else functools.partial(trained.write_hf, merge=merge)
        return write_atomically(out, write)
    from tpuplex.commands import workflow  # builds a backend: only for the formats a framework writes

    experiment, state = workflow.restore(found, FORMATS[format])
    return write_atomically(out, lambda staging: experiment.backend.export(state, format, staging, experiment.data))


@dataclasses.dataclass(frozen=True)
class Trained:
    """A checkpoint as the core's formats read it: its run's config, task, model kind and LoRA adapters (None
    without), and its parameters and buffers (`StoredArray`s)."""

    found: run_folder.Found
    task: Any
    kind: Any
    lora: Lora | None
    state: Any
    info: dict[str, Any]
    data: Any
    """The task's data without its splits (`Task.model_data`: a character run's vocabulary), or None."""

    @classmethod
    def read(cls, found: run_folder.Found) -> Trained:
        task = tasks.get(found.config.task.name)
        kind = kinds.resolve(found.config, task)
        rebuilt = task.model_data(found.config, tasks.options(task, found.config.task.options), kind.checkpoint_dir)
        if rebuilt is not None:
            kind.check_data(rebuilt)  # sizes what the model's config.json left to the run's tokenizer
        state, info = checkpoint.load(found.checkpoint, verified=True)
        return cls(found, task, kind, kind.lora(found.config), state, info, rebuilt)

    def write_hf(self, folder: Path, merge: bool) -> None:
        """The HF folder (see the module doc) into the empty `folder`."""
        if self.lora is not None and not merge:
            raise TpuplexError(f"{self.found.checkpoint} holds LoRA adapters, not a whole model: export them with "
                               "--format peft, or the model with them folded in with --format hf --merge")
        if self.lora is None and merge:
            raise TpuplexError(f"{self.found.checkpoint} has no LoRA adapters to merge: export it with --format hf "
                               "alone")
        config, kind = self.found.config, self.kind
        exported = {**kind.hf_config, "architectures": [kind.hf_class(config, self.task)],
                    **self.task.export_config(config)}
        (folder / "config.json").write_text(json.dumps(exported, indent=2) + "\n")
        params = self._params()
        weights = kind.hf_weights({**(self.lora.merged(params) if self.lora else params), **self.state.buffers})
        _save_safetensors(weights, folder / "model.safetensors")
        vocabulary = getattr(self.data, "vocabulary", None)
        if isinstance(vocabulary, Characters):  # the run's own vocabulary, not a tokenizer of the checkpoint's
            vocabulary.save_pretrained(folder)
            return
        for name in run_folder.TOKENIZER_FILES:
            if (kind.checkpoint_dir / name).is_file():
                shutil.copy2(kind.checkpoint_dir / name, folder / name)

    def write_peft(self, folder: Path) -> None:
        """A LoRA run's adapters as PEFT's folder: adapter_config.json and adapter_model.safetensors."""
        if self.lora is None:
            raise TpuplexError(f"{self.found.checkpoint} has no LoRA adapters (the run trained every parameter): "
                               "export it with --format hf")
        peft_config = self.lora.peft_config("CAUSAL_LM", str(self.kind.checkpoint_dir))  # decoders: causal_lm
        (folder / "adapter_config.json").write_text(json.dumps(peft_config, indent=2) + "\n")
        adapters = {f"{PEFT_PREFIX}{name}": array for name, array in self.state.params.items()}
        _save_safetensors(adapters, folder / "adapter_model.safetensors")

    def _params(self) -> dict[str, SliceReader]:
        """The trained parameters (read from the checkpoint when written), with a LoRA run's base read from its
        model.checkpoint (checked to be the one its adapters were trained on)."""
        params = dict(self.state.params)
        if self.lora is None:
            return params
        base, _ = self.kind.initial_state(None, self.found.config.train.seed)  # a decoder: no head to draw
        if fingerprint(base) != self.info.get("base_sha256"):
            raise TpuplexError(f"{self.found.checkpoint} holds LoRA adapters trained on another base than "
                               f"model.checkpoint = {self.found.config.model.checkpoint!r}: point the run's "
                               "model.checkpoint at the base they were trained on")
        return {**base, **params}


def _save_safetensors(arrays: Mapping[str, SliceReader], path: Path) -> None:
    # transformers and peft read the "format" metadata to know the tensors are in torch layout.
    save_weights(arrays, path, metadata={"format": "pt"})


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

"""Kinds of model, each a plug-in like a task: one resolution from `[model]` to the kind that owns what differs.

    text    an HF text encoder family (BERT, RoBERTa, DistilBERT, ELECTRA, ALBERT) with the task's head
    image   an HF image family (ResNet, ViT)
    decoder an HF decoder language model family (GPT-2, Llama, Qwen2, Mistral, Gemma 2, Phi-3)
    encoder_decoder  an HF encoder-decoder (T5)
    speech  a speech model family (a Conformer for CTC)
    own     your own network (`model.architecture`): written once (`tpuplex.nn`), or in the backend's framework

    kind = kinds.resolve(config, task)    # the ModelKind of this run, checked against the task's `model_kinds`
    kind.checkpoint_dir                   # the folder of the weights and a text task's tokenizer (or None)
    kind.check(config); kind.check_data(data)
    model = kind.spec(config, task, data) # the ModelSpec a backend builds: initial state from the core

A kind is framework-free here (`tpuplex/kinds/<kind>/`: which families it answers to, how its initial state is
drawn or read), a subclass of `ModelKind` (`tpuplex.kinds.base`, re-exported here); each backend package holds its
`KindModule`, which builds the network (`tpuplex_<backend>.kinds.<kind>`, the contract in
`tpuplex_<backend>.kinds`); `frameworks` names them. The backends call `build` of the kind a spec names and never
ask which kind it is.
"""

from __future__ import annotations

from typing import Any

from tpuplex import checkpoints, models
from tpuplex.errors import ConfigError
from tpuplex.kinds.base import ModelKind, backend_modules, framework_module, with_adapters
from tpuplex.kinds.decoder import Decoders
from tpuplex.kinds.encoder_decoder import EncoderDecoders
from tpuplex.kinds.image import ImageFamilies
from tpuplex.kinds.own import OwnModel
from tpuplex.kinds.speech import SpeechFamilies
from tpuplex.kinds.text import TextEncoders


def family_kinds() -> tuple[type[ModelKind], ...]:
    """The kinds a checkpoint's family resolves to, in the order they are asked."""
    return TextEncoders, ImageFamilies, Decoders, SpeechFamilies, EncoderDecoders


def resolve(config: Any, task: Any) -> ModelKind:
    """The kind of model `config.model` names for `task`: your own (`model.architecture`), else the kind whose
    families include the checkpoint's; one clear error when the task cannot train it."""
    if config.model.architecture:
        kind: ModelKind = OwnModel.resolve(config, task)
    else:
        checkpoint_dir = checkpoints.resolve_checkpoint(config.model.checkpoint)
        hf_config = checkpoints.read_hf_config(checkpoint_dir)
        family, arch = models.architecture_of(hf_config, checkpoint_dir / "config.json")
        found = next(kind for kind in family_kinds() if family in kind.families)
        kind = found(checkpoint_dir, hf_config, family, arch)
    if kind.name not in task.model_kinds:
        raise ConfigError(mismatch(config, task, kind))
    kind.lora(config)  # [model.lora] checked against the model before any data is read
    return kind


def mismatch(config: Any, task: Any, kind: ModelKind) -> str:
    """The one-line refusal of a model the task cannot train, naming the kinds it can."""
    accepted = [kind for kind in family_kinds() if kind.name in task.model_kinds]
    model_types = ", ".join(t for accepted_kind in accepted for family in accepted_kind.families
                            for t in family.model_types)
    if kind.name == "own":
        return (f"the {task.name} task cannot train a model of your own (model.architecture = "
                f"{config.model.architecture!r}): leave model.architecture empty and give model.checkpoint a "
                f"{model_types} model")
    own = ('; or set model.architecture to a model of your own (e.g. "models.{backend}_cnn:FlowersCNN")'
           if "own" in task.model_kinds else "")
    return (f"model.checkpoint {kind.checkpoint_dir} is a {kind.family.name} model, which the {task.name} task "
            f"cannot train: give a checkpoint folder of a {model_types} model{own}")


__all__ = ["ModelKind", "backend_modules", "family_kinds", "framework_module", "mismatch", "resolve", "with_adapters"]

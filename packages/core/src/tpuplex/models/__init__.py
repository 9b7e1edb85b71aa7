"""Model families, each described once (`tpuplex.models.<family>`), and the lookup by `model_type`.

    family = family_of(hf_config)                # Family (text encoders), ImageFamily (resnet, vit), DecoderFamily
    arch = family.architecture(hf_config)        # Architecture, the image family's plan, DecoderArch: framework-free
    family.hf_shapes(arch)                       # text: HF name -> shape of every encoder parameter
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tpuplex.errors import TpuplexError
from tpuplex.models.albert import ALBERT
from tpuplex.models.bert import BERT
from tpuplex.models.config_reader import ACTIVATIONS
from tpuplex.models.conformer import CONFORMER, SpeechFamily
from tpuplex.models.decoder import DecoderArch, DecoderFamily
from tpuplex.models.distilbert import DISTILBERT
from tpuplex.models.electra import ELECTRA
from tpuplex.models.encoder_architecture import BLOCK_MODULES, Architecture, canonical_shapes
from tpuplex.models.encoder_family import Family
from tpuplex.models.gemma2 import GEMMA2
from tpuplex.models.gpt2 import GPT2
from tpuplex.models.image_family import RESNET, VIT, ImageFamily
from tpuplex.models.llama import LLAMA
from tpuplex.models.mistral import MISTRAL
from tpuplex.models.phi3 import PHI3
from tpuplex.models.qwen2 import QWEN2
from tpuplex.models.roberta import ROBERTA
from tpuplex.models.t5 import T5, T5Arch, T5Family

FAMILIES: tuple[Family, ...] = (BERT, ROBERTA, DISTILBERT, ELECTRA, ALBERT)
IMAGE_FAMILIES: tuple[ImageFamily, ...] = (RESNET, VIT)
DECODER_FAMILIES: tuple[DecoderFamily, ...] = (GPT2, LLAMA, QWEN2, MISTRAL, GEMMA2, PHI3)
SPEECH_FAMILIES: tuple[SpeechFamily, ...] = (CONFORMER,)
ENCODER_DECODER_FAMILIES: tuple[T5Family, ...] = (T5,)
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(t for family in FAMILIES for t in family.model_types)
IMAGE_MODEL_TYPES: tuple[str, ...] = tuple(t for family in IMAGE_FAMILIES for t in family.model_types)
DECODER_MODEL_TYPES: tuple[str, ...] = tuple(t for family in DECODER_FAMILIES for t in family.model_types)
SPEECH_MODEL_TYPES: tuple[str, ...] = tuple(t for family in SPEECH_FAMILIES for t in family.model_types)
ENCODER_DECODER_MODEL_TYPES: tuple[str, ...] = tuple(t for family in ENCODER_DECODER_FAMILIES
                                                     for t in family.model_types)


def family_of(hf_config: Mapping[str, Any], path: Path | str = "config.json") -> Any:
    """The family whose `model_type` the config names; one clear error naming the supported ones otherwise."""
    model_type = hf_config.get("model_type")
    for family in (*FAMILIES, *IMAGE_FAMILIES, *DECODER_FAMILIES, *SPEECH_FAMILIES, *ENCODER_DECODER_FAMILIES):
        if model_type in family.model_types:
            return family
    raise TpuplexError(f"model_type {model_type!r} in {path} is not supported: tpuplex builds "
                       f"{', '.join(SUPPORTED_MODEL_TYPES)} encoders, {', '.join(IMAGE_MODEL_TYPES)} image models, "
                       f"{', '.join(DECODER_MODEL_TYPES)} decoders, {', '.join(ENCODER_DECODER_MODEL_TYPES)} "
                       f"encoder-decoders and {', '.join(SPEECH_MODEL_TYPES)} speech models")


def architecture_of(hf_config: Mapping[str, Any], path: Path | str = "config.json") -> tuple[Family, Architecture]:
    """(family, architecture); for an image family (`ImageFamily`), its plan (`resnet.ResNet`, `vit.ViT`); for a
    decoder (`DecoderFamily`), its `DecoderArch`; for T5, its `T5Arch`."""
    family = family_of(hf_config, path)
    return family, family.architecture(hf_config, path)


__all__ = ["ACTIVATIONS", "BLOCK_MODULES", "DECODER_FAMILIES", "DECODER_MODEL_TYPES", "ENCODER_DECODER_FAMILIES",
           "ENCODER_DECODER_MODEL_TYPES", "FAMILIES", "IMAGE_FAMILIES",
           "IMAGE_MODEL_TYPES", "SPEECH_FAMILIES", "SPEECH_MODEL_TYPES", "SUPPORTED_MODEL_TYPES", "Architecture",
           "DecoderArch", "DecoderFamily", "Family", "ImageFamily", "SpeechFamily", "T5Arch", "T5Family",
           "architecture_of", "canonical_shapes", "family_of"]

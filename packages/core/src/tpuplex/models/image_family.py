"""An image model family described once: how to read its `config.json` into a plan every backend builds.

    family = models.family_of(hf_config)          # RESNET or VIT (an ImageFamily)
    arch = family.architecture(hf_config)          # tpuplex.models.resnet.ResNet / tpuplex.models.vit.ViT
    arch.parameter_shapes(num_labels), arch.buffer_shapes(), arch.initial_params(...), arch.initial_buffers()

Parameters and buffers have HF's names and torch's layout (convolutions OIHW) in every backend, so a portable
checkpoint of an image family is read by any backend, and by transformers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tpuplex.models import resnet, vit
from tpuplex.models.config_reader import ConfigReader


@dataclasses.dataclass(frozen=True)
class ImageFamily:
    """model_types: config.json's `model_type` values; prefix: the backbone's attribute in HF's
    *ForImageClassification (base-model checkpoints get it added on load); hf_class: that class."""

    model_types: tuple[str, ...]
    prefix: str
    hf_class: str
    read: Callable[[ConfigReader], Any]

    @property
    def name(self) -> str:
        return self.model_types[0]

    def architecture(self, hf_config: Mapping[str, Any], path: Path | str = "config.json") -> Any:
        return self.read(ConfigReader(hf_config, path))


RESNET = ImageFamily(("resnet",), "resnet", "ResNetForImageClassification", resnet.read)
VIT = ImageFamily(("vit",), "vit", "ViTForImageClassification", vit.read)


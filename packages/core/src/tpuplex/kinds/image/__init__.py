"""Image families (`tpuplex.models.image_family`: ResNet, ViT), described once as a plan each framework walks
(`tf.py`, `jax.py` here; torch uses transformers' own classes, `torch.py`).

A config.json alone is a model to train from scratch, drawn by the core; with weights, they are read (a classifier
of another size drawn anew), with the batch-norm statistics (`tpuplex.params.initial_image_state`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from tpuplex import models, params
from tpuplex.kinds import ModelKind


class ImageFamilies(ModelKind):
    name: ClassVar[str] = "image"
    families: ClassVar[tuple[Any, ...]] = models.IMAGE_FAMILIES
    frameworks: ClassVar[dict[str, str]] = {framework: f"{__name__}.{framework}:ImageFamily"
                                            for framework in ("jax", "tf", "torch")}

    def initial_state(self, head: Any, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        return params.initial_image_state(self.checkpoint_dir, self.hf_config, head.num_labels, seed)


def example_image_shape(arch: Any) -> tuple[int, int, int]:
    """(H, W, C) of an image the model takes, to build its variables: a ViT's own size, any size for a ResNet."""
    return (*getattr(arch, "image_size", (32, 32)), arch.num_channels)

"""Image families (`tpuplex.models.image_family`: ResNet, ViT), described once as a plan each framework walks
(each backend's `kinds/image.py`: the ViT is its forward pass written once, `tpuplex.models.vit.forward`;
the ResNet walks the plan in Flax and Keras, and is transformers' own class in torch).

A config.json alone is a model to train from scratch, drawn by the core; with weights, they are read (a classifier
of another size drawn anew), with the batch-norm statistics (`initial_image_state`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tpuplex import models
from tpuplex.checkpoints import check_names
from tpuplex.kinds.base import ModelKind, backend_modules
from tpuplex.models.weights import PICKLE, SAFETENSORS, load_weights
from tpuplex.protocol import batch_rows


class ImageFamilies(ModelKind):
    name: ClassVar[str] = "image"
    families: ClassVar[tuple[Any, ...]] = models.IMAGE_FAMILIES
    frameworks: ClassVar[dict[str, str]] = backend_modules("image", "ImageFamily")

    def initial_state(self, head: Any, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        return initial_image_state(self.checkpoint_dir, self.hf_config, head.num_labels, seed)

    def forward_flops(self, spec: Any, batch: Mapping[str, np.ndarray]) -> float:
        """The network with its classifier (part of the family's plan): the image task has no head of its own. A
        batch of rows the devices hold (`image_index`) has the example batch's image size."""
        _, height, width, _ = np.shape(batch["images"] if "images" in batch else spec.example_batch["images"])
        return self.arch.forward_flops(batch_rows(batch), height, width, spec.head.num_labels)


def example_image_shape(arch: Any) -> tuple[int, int, int]:
    """(H, W, C) of an image the model takes, to build its variables: a ViT's own size, any size for a ResNet."""
    return (*getattr(arch, "image_size", (32, 32)), arch.num_channels)


def initial_image_state(checkpoint_dir: Path, hf_config: Mapping[str, Any], num_labels: int, seed: int
                        ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """An image family's parameters and buffers (batch-norm statistics), float32 (counts int64), HF names and
    torch layout.

    From the checkpoint's weights file when it has one (a backbone saved without its prefix gets it; a classifier
    of another num_labels is drawn anew), else all drawn as HF initialises the family (`arch.initial_params`, keyed
    by `seed`, each drawn a block at a time when read): a config.json alone is a model to train from scratch.
    """
    family, arch = models.architecture_of(hf_config, Path(checkpoint_dir) / "config.json")
    shapes, buffer_shapes = arch.parameter_shapes(num_labels), arch.buffer_shapes()
    params, buffers = arch.initial_params(num_labels, seed), arch.initial_buffers()
    folder = Path(checkpoint_dir)
    if not any((folder / name).is_file() for name in (SAFETENSORS, PICKLE)):
        return params, buffers
    loaded = {}
    for name, array in load_weights(folder).items():
        full = name if name in shapes or name in buffer_shapes else f"{family.prefix}.{name}"
        if full in shapes or full in buffer_shapes:
            loaded[full] = array
    head = [name for name in shapes if name.startswith("classifier.")]
    keep_head = all(name in loaded and loaded[name].shape == shapes[name] for name in head)
    loaded_params = {name: array for name, array in loaded.items() if name in shapes
                     and (keep_head or name not in head)}
    check_names({n: s for n, s in shapes.items() if keep_head or n not in head}, loaded_params,
                f"the weights in {checkpoint_dir}")
    check_names(buffer_shapes, {name: array for name, array in loaded.items() if name in buffer_shapes},
                f"the batch-norm statistics in {checkpoint_dir}")
    return params | loaded_params, buffers | {name: np.asarray(loaded[name], buffers[name].dtype) for name in buffers}

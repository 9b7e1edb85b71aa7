"""Image classification in PyTorch: what the model (an image family, or your own) is called with, the loss of
each image, and the `torch.export` program's serving wrapper."""

from __future__ import annotations

from collections.abc import Mapping

import torch.nn.functional as F

import torch
from tpuplex.tasks.image_classification.data import crop_and_flip
from tpuplex_torch import tasks as tasks_torch
from tpuplex_torch.ops import TorchOps


class Module(tasks_torch.TaskModule):
    def model_inputs(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor]:
        """images uint8 [b, H, W, 3] (or the held training images' rows, cropped and flipped here) -> float32
        [b, 3, H, W] in [0, 1]: torch's channels-first layout, scaled on the device."""
        images = batch["images"] if "images" in batch else crop_and_flip(
            TorchOps(False, batch["image_index"].device), batch["train_images"], batch["image_index"],
            batch["shift"], batch["flip"])
        return (images.permute(0, 3, 1, 2).float() / 255.0,)

    def unit_losses(self, outputs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Cross-entropy per image [b] in float32, from logits [b, classes]."""
        return F.cross_entropy(outputs.float(), batch["labels"], reduction="none")

    def predict_outputs(self, outputs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Logits float32 [b, classes]."""
        return outputs.float()

    def serving(self, model: torch.nn.Module, data) -> tuple:
        """An image run's program: the wrapper, an example input, the batch dimension left dynamic, and
        serving.json's contract."""
        from tpuplex.data.images import RESIZE_RULE

        example = torch.zeros((2, *data.image_shape), dtype=torch.uint8)
        contract = {"inputs": {"images": f"uint8 [batch, {', '.join(map(str, data.image_shape))}] RGB pixels"},
                    "preprocessing": RESIZE_RULE + " (tpuplex.data.images.decode does all of it)",
                    "outputs": ["probabilities float32 [batch, classes]", "classes int64 [batch]"],
                    "classes": list(data.classes), "image_shape": list(data.image_shape)}
        return Serving(model, self), (example,), {"images": {0: torch.export.Dim("batch", min=1)}}, contract


class Serving(torch.nn.Module):
    """images uint8 [batch, H, W, 3] -> (probabilities float32 [batch, classes], classes int64 [batch])."""

    def __init__(self, model: torch.nn.Module, task: Module):
        super().__init__()
        self.model, self.task = model, task

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        outputs = self.model(*self.task.model_inputs({"images": images}))
        logits = getattr(outputs, "logits", outputs).float()  # a model of your own may return HF's outputs
        return logits.softmax(dim=-1), logits.argmax(dim=-1)

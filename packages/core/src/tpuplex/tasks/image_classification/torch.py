"""Image classification in PyTorch: the model is your own `torch.nn.Module`; this module says what it is called
with and what the loss of each image is."""

from __future__ import annotations

from collections.abc import Mapping

import torch.nn.functional as F

import torch


def model_inputs(batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor]:
    """images uint8 [b, H, W, 3] -> float32 [b, 3, H, W] in [0, 1]: torch's channels-first layout, scaled on the
    device."""
    return (batch["images"].permute(0, 3, 1, 2).float() / 255.0,)


def unit_losses(outputs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy per image [b] in float32, from logits [b, classes]."""
    return F.cross_entropy(outputs.float(), batch["labels"], reduction="none")


def predict_outputs(outputs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Logits float32 [b, classes]."""
    return outputs.float()


class Serving(torch.nn.Module):
    """images uint8 [batch, H, W, 3] -> (probabilities float32 [batch, classes], classes int64 [batch])."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        outputs = self.model(*model_inputs({"images": images}))
        logits = getattr(outputs, "logits", outputs).float()  # HF's ResNet and ViT return an output object
        return logits.softmax(dim=-1), logits.argmax(dim=-1)


def serving_module(model: torch.nn.Module, data) -> tuple:
    """What `tpuplex export --format torch_export` writes for an image run: the wrapper, an example input, the
    batch dimension left dynamic, and serving.json's contract."""
    from tpuplex.data.images import RESIZE_RULE

    example = torch.zeros((2, *data.image_shape), dtype=torch.uint8)
    contract = {"inputs": {"images": f"uint8 [batch, {', '.join(map(str, data.image_shape))}] RGB pixels"},
                "preprocessing": RESIZE_RULE + " (tpuplex.data.images.decode does all of it)",
                "outputs": ["probabilities float32 [batch, classes]", "classes int64 [batch]"],
                "classes": list(data.classes), "image_shape": list(data.image_shape)}
    return Serving(model), (example,), {"images": {0: torch.export.Dim("batch", min=1)}}, contract


def head_config(head) -> dict[str, int]:
    """What HF's *ForImageClassification config takes from the head (a ResNet's or ViT's classifier size)."""
    return {"num_labels": head.num_labels}

"""Your own `torch.nn.Module` (`model.architecture`, `tpuplex.models.user`), initialised under
`torch.manual_seed(optimizer.seed)`."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import torch
from tpuplex.models import user
from tpuplex.protocol import ModelSpec, OptimizerSpec
from tpuplex_torch.kinds import Built, KindModule


class OwnModel(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec) -> Built:
        """The user's module in float32, every dropout off unless `spec.dropout`; it starts from the values it
        drew (parameters, and buffers such as batch-norm statistics)."""
        torch.manual_seed(optimizer.seed)
        module = user.build(spec.architecture, "torch", spec.model_arguments, torch.nn.Module, "torch.nn.Module")
        module = module.float()
        if not spec.dropout:
            for layer in module.modules():
                if isinstance(layer, torch.nn.modules.dropout._DropoutNd):
                    layer.p = 0.0
        params = {name: p.detach().numpy().copy() for name, p in module.named_parameters()}
        buffers = {name: b.detach().numpy().copy() for name, b in module.state_dict().items() if name not in params}
        forward = functools.partial(user_logits, architecture=spec.architecture, num_labels=spec.num_labels,
                                    model_inputs=task.model_inputs)
        return Built(module, forward, params, buffers)


def user_logits(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor], architecture: str, num_labels: int,
                model_inputs: Callable[[Mapping[str, torch.Tensor]], tuple[torch.Tensor, ...]]) -> torch.Tensor:
    """A user module's logits [b, num_labels] from the task's `model_inputs(inputs)`; its output is checked,
    since nothing else constrains it."""
    arguments = model_inputs(inputs)
    logits = model(*arguments)
    shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
    user.check_logits(architecture, shape, arguments[0].shape[0], num_labels)
    return logits

"""The train and predict steps, the same code for eager and XLA (the placement hides the difference).

A train step follows `tpuplex.protocol` exactly: each micro-batch's loss is sum(weight * loss) over its rows divided
by the global batch's total weight, so the summed gradients are the gradient of the global weighted mean loss
(also when an epoch's short batch, filled up with weight-0 rows, spreads its weight unevenly); then the global-norm clip
g * min(1, c / ||g||) computed here (torch's clip_grad_norm_ adds 1e-6 to the norm) and torch.optim.AdamW, which
applies the decoupled decay lr * wd * p to the pre-update parameters with epsilon outside the corrected square root.
On XLA the whole step is one lazy graph per batch shape, cut by `torch_xla.sync()`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager

import numpy as np
from torch.distributed.tensor import DTensor
from torch.utils.flop_counter import FlopCounterMode

import torch
from tpuplex.data.batching import check_micro_batches
from tpuplex.protocol import Batch, OptimizerSpec, batch_rows, decays
from tpuplex_torch.devices import Placement, WeightedLoss
from tpuplex_torch.kinds import Forward
from tpuplex_torch.ops import Float8Matmuls, float8_products
from tpuplex_torch.tasks import TaskModule


@dataclasses.dataclass
class TorchState:
    """The training state, updated in place. forward: how to call the model (`tpuplex_torch.kinds.Built`);
    train_loss: a micro-batch's weighted loss sum as the train step calls it (`weighted_loss`; compiled under
    torch_mode "compile" and "cuda_graphs"); task: the task's torch module (`tpuplex_torch.tasks.TaskModule`:
    `unit_losses`, `predict_outputs`); buffer_names: the model's buffers that checkpoints carry (a user model's
    batch-norm statistics); float8: the float8 products the training forward runs (`train.fp8`; None: none);
    step: optimizer updates applied so far."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    spec: OptimizerSpec
    forward: Forward
    train_loss: WeightedLoss
    task: TaskModule
    buffer_names: tuple[str, ...] = ()
    float8: Float8Matmuls | None = None
    step: int = 0



def weighted_loss(forward: Forward, task: TaskModule, autocast: Callable[[], AbstractContextManager]) -> WeightedLoss:
    """The train step's loss as one function, so that a compiled step holds the loss with the forward (and a CUDA
    graph replays both): the forward under `autocast`, the task's per-row losses in float32 outside it."""

    def weighted_loss_sum(model: torch.nn.Module, micro: dict[str, torch.Tensor]) -> torch.Tensor:
        with autocast():
            logits = forward(model, micro)
        return (task.unit_losses(logits, micro) * micro["weight"]).sum()

    return weighted_loss_sum


def make_optimizer(model: torch.nn.Module, spec: OptimizerSpec) -> torch.optim.Optimizer:
    """AdamW (or SGD with momentum, `spec.optimizer`) over the parameters that train (`requires_grad`; a LoRA
    run's base does not), with decay on those `decays(name)` selects and none on the rest.

    Its state (exp_avg, exp_avg_sq, step; SGD's momentum_buffer) is what checkpoints hold; on XLA `adamw_on_xla`
    applies the update.
    On a GPU and on the CPU the update is `fused`: one kernel for every parameter, where the step of a small model
    would otherwise wait for dozens of launches (on the CPU 0.5 ms against `foreach`'s 1.8 ms for nanoGPT's
    character model; it rounds differently from the per-parameter loop, by about one float32 ulp). Elsewhere
    (XLA's lazy tensors) `foreach`.
    """
    named = [(name, parameter) for name, parameter in model.named_parameters() if parameter.requires_grad]
    groups = [{"params": [p for name, p in named if decays(name)], "weight_decay": spec.weight_decay},
              {"params": [p for name, p in named if not decays(name)], "weight_decay": 0.0}]
    kernels = {"fused": True} if fused_update(model) else {"foreach": True}
    if spec.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=0.0, momentum=spec.momentum, nesterov=spec.nesterov, **kernels)
    return torch.optim.AdamW(groups, lr=0.0, betas=(spec.beta1, spec.beta2), eps=spec.epsilon, **kernels)


def fused_update(model: torch.nn.Module) -> bool:
    """Whether the optimizer updates every parameter in one fused kernel: on a GPU or the CPU."""
    return next(model.parameters()).device.type in ("cuda", "cpu")


def dropout_seed(seed: int, step: int) -> int:
    """The RNG seed for the dropout masks of optimizer step `step`: a function of (seed, step) only, so a resumed
    run draws the same masks as an uninterrupted one."""
    return int(np.random.SeedSequence([seed, step]).generate_state(1)[0])


def train_steps(state: TorchState, placement: Placement, batches: Sequence[Batch], learning_rates: Sequence[float],
                held: Mapping[str, torch.Tensor]) -> list[float]:
    """One update per batch; the losses are read back after the last, so that a GPU runs the steps back to back
    instead of waiting for the host after each one."""
    losses = [train_step(state, placement, batch, rate, held)
              for batch, rate in zip(batches, learning_rates, strict=True)]
    return [float(loss.item()) for loss in losses]


def train_step(state: TorchState, placement: Placement, batch: Batch, learning_rate: float,
               held: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """One AdamW update on the global `batch` (beside it, the arrays the device holds, `held`, which the task module
    reads rows of); returns the batch's weighted mean loss, a scalar on the device."""
    model, spec = state.model, state.spec
    inputs = placement.put(batch)
    placement.begin_step()
    placement.seed(dropout_seed(spec.seed, state.step))
    if not model.training:  # after predict: `train()` visits every module, 0.1 ms a step for a small GPT
        model.train()
    total_weight = placement.reduce_sum(inputs["weight"].sum()).clamp(min=1.0)
    loss = torch.zeros((), device=placement.device)
    for index, micro in enumerate(micro_batches(inputs, placement.replicas_in_view, spec.grad_accum)):
        with float8_products(state.float8):
            micro_loss = state.train_loss(model, {**micro, **held}) / total_weight
        (micro_loss * placement.gradient_scale).backward()
        if index == 0 and spec.grad_accum > 1 and placement.replays_graphs:
            # The first backward's gradients are the graph's outputs, which the next replay writes over: copied
            # out, the later micro-batches add into them in place.
            for parameter in model.parameters():
                if parameter.grad is not None:
                    parameter.grad = parameter.grad.clone()
        loss = loss + micro_loss.detach()
    parameters = [p for p in model.parameters() if p.grad is not None]
    if placement.row_processes > 1 and not placement.shards_parameters:  # FSDP2 has reduced them in the backward
        _sum_gradients_over_processes(parameters, placement)
    if spec.clip_norm > 0:
        _clip_by_global_norm(parameters, spec.clip_norm)
    if placement.mode == "xla":
        (sgd_on_xla if spec.optimizer == "sgd" else adamw_on_xla)(state.optimizer, placement, learning_rate)
    else:
        for group in state.optimizer.param_groups:
            group["lr"] = learning_rate
        state.optimizer.step()
    state.optimizer.zero_grad(set_to_none=True)
    loss = placement.reduce_sum(loss)
    placement.sync()
    state.step += 1
    return loss


def adamw_on_xla(optimizer: torch.optim.AdamW, placement: Placement, learning_rate: float) -> None:
    """torch.optim.AdamW's update on its own state, with the per-step numbers uploaded as one tensor.

    torch's step hands XLA the learning rate and bias corrections as Python numbers, which torch_xla passes as
    cached scalar data: equal values share one input, so lr = 0 (the first warmup step, decay factor 1.0) changes
    the program and compiles it again; its capturable variant divides by lr and gives NaN at lr = 0.
    """
    first = optimizer.param_groups[0]
    beta1, beta2 = first["betas"]
    step = int(optimizer.state[first["params"][0]]["step"]) + 1
    numbers = [learning_rate / (1 - beta1**step), (1 - beta2**step) ** 0.5]
    numbers += [learning_rate * group["weight_decay"] for group in optimizer.param_groups]
    step_size, bias_correction2_sqrt, *decay = placement.upload(np.array(numbers)).unbind()
    for group, group_decay in zip(optimizer.param_groups, decay, strict=True):
        for parameter in group["params"]:
            moments, grad = optimizer.state[parameter], parameter.grad
            moments["exp_avg"].lerp_(grad, 1 - beta1)
            moments["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            if group["weight_decay"]:
                parameter.data.mul_(1 - group_decay)
            denominator = moments["exp_avg_sq"].sqrt() / bias_correction2_sqrt + group["eps"]
            parameter.data.sub_(step_size * moments["exp_avg"] / denominator)
            moments["step"] += 1


def sgd_on_xla(optimizer: torch.optim.SGD, placement: Placement, learning_rate: float) -> None:
    """torch.optim.SGD's momentum update (dampening 0) on its own state, the learning rate uploaded as a tensor
    (a Python number would be a cached scalar of the program: see `adamw_on_xla`)."""
    rate = placement.upload(np.array([learning_rate]))[0]
    for group in optimizer.param_groups:
        momentum = group["momentum"]
        for parameter in group["params"]:
            grad = parameter.grad
            if group["weight_decay"]:
                grad = grad.add(parameter.data, alpha=group["weight_decay"])
            buffer = optimizer.state[parameter]["momentum_buffer"]
            buffer.mul_(momentum).add_(grad)
            parameter.data.sub_(rate * (grad.add(buffer, alpha=momentum) if group["nesterov"] else buffer))


def predict(state: TorchState, placement: Placement, batch: Batch) -> np.ndarray:
    """The task's predict outputs [B, ...] for every row of `batch`, padding rows included."""
    inputs = placement.put(batch)
    state.model.eval()
    with torch.no_grad(), placement.autocast(state.spec.bf16):
        outputs = state.task.predict_outputs(state.forward(state.model, inputs), inputs).float()
    placement.sync()
    return placement.gather_rows(outputs).cpu().numpy()


def forward_flops(state: TorchState, placement: Placement, batch: Batch, held: Mapping[str, torch.Tensor]) -> float:
    """The inference forward's FLOPs on the global `batch` as torch's `FlopCounterMode` counts them (matrix
    products, convolutions, attention) in one uncompiled forward without gradients. Each of several processes
    computes its own rows, all of the batch's shapes: its count is scaled to the batch's rows."""
    inputs = placement.put(batch)
    training = state.model.training
    state.model.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            state.forward(state.model, {**inputs, **held})
    finally:
        state.model.train(training)
    return float(counter.get_total_flops()) * batch_rows(batch) / batch_rows(inputs)


def micro_batches(inputs: dict[str, torch.Tensor], replicas: int, count: int) -> Iterator[dict[str, torch.Tensor]]:
    """Split [b, ...] tensors holding `replicas` contiguous row blocks into `count` micro-batches, micro-batch j
    made of the j-th part of every replica's block (so under SPMD each device keeps its own rows)."""
    rows = len(inputs["labels"])
    check_micro_batches(rows, replicas, count)
    if count == 1:
        yield inputs
        return
    part = rows // (replicas * count)
    for j in range(count):
        yield {name: t.reshape(replicas, count, part, *t.shape[1:])[:, j].reshape(replicas * part, *t.shape[1:])
               for name, t in inputs.items()}


def _sum_gradients_over_processes(parameters: list[torch.nn.Parameter], placement: Placement) -> None:
    """Add up the gradients of processes that each computed their own rows (one flat all-reduce)."""
    grads = [p.grad for p in parameters]
    summed = placement.reduce_sum(torch.cat([g.reshape(-1) for g in grads]))
    for grad, part in zip(grads, summed.split([g.numel() for g in grads]), strict=True):
        grad.copy_(part.view_as(grad))


def _clip_by_global_norm(parameters: list[torch.nn.Parameter], clip_norm: float) -> None:
    """g *= min(1, clip_norm / ||g||) over all gradients together; a zero norm (clip_norm / 0 = inf) leaves g."""
    grads = [p.grad for p in parameters]
    norm = torch.nn.utils.get_total_norm(grads)
    if isinstance(norm, DTensor):  # FSDP2's shards: the norm of the whole gradients, then one number for every shard
        scale = float((clip_norm / norm.full_tensor()).clamp(max=1.0))
    else:
        scale = (clip_norm / norm).clamp(max=1.0)
    torch._foreach_mul_(grads, scale)

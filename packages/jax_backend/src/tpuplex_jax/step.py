"""Compiled train and predict steps: functions of the global batch, laid out over the device mesh by GSPMD.

Each step is one `jax.jit` program. Its rows arrive split over the mesh's batch axes (`tpuplex.sharding.BATCH_AXES`),
its state laid out as `tpuplex.sharding` decides (parameters and both Adam moments split over `fsdp` and `tensor`,
the rest replicated), and XLA inserts the collectives: pure data parallelism all-reduces the gradients, fsdp gathers
each weight where it is used and reduce-scatters its gradient. The train step follows `tpuplex.protocol` exactly:
- the global batch's rows split into `grad_accum` micro-batches, each taking its share of every batch shard's rows
  (so a micro-batch stays spread over the devices); a `lax.scan` when there are several;
- the loss is the weighted mean over the global batch, sum(weight * loss) / max(sum(weight), 1), differentiated
  as it is (an epoch's short batch, filled up with weight-0 rows, is exact too);
- `optax.clip_by_global_norm` (g * min(1, c / ||g||), written by optax as g / ||g|| * c when ||g|| >= c), then
  `optax.adamw` with the decay mask from `tpuplex.protocol.decays` and the per-step learning rate injected
  through `optax.inject_hyperparams`.
The state is donated. A model's non-trainable state (Flax collections besides "params": batch-norm
`batch_stats`) is updated by the forward pass of each micro-batch in turn.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util

import jax
from tpuplex.protocol import OptimizerSpec, decays
from tpuplex_jax.ops import Naming

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # jax._src.dispatch.BACKEND_COMPILE_EVENT


class TrainState(NamedTuple):
    """Flax parameter tree of what trains (float32), the optax state (clip, then injected-hyperparameter AdamW),
    the model's other Flax collections (`{"batch_stats": ...}`; empty for most models), which the optimizer never
    touches, and the parameters that do not train (`ModelSpec.frozen`, a LoRA run's base; empty for most): no
    gradient, no moments."""

    params: Any
    opt_state: Any
    model_state: Any
    frozen: Any = {}

    @property
    def network_params(self) -> Any:
        """Every parameter of the network, as one Flax tree."""
        return merge_params(self.params, self.frozen)


def partition_params(params: Any, naming: Naming, frozen: frozenset[str]) -> tuple[Any, Any]:
    """A Flax parameter tree -> (the trees of the parameters that train, of those whose portable names are
    `frozen`)."""
    flat = traverse_util.flatten_dict(params)
    held = {path: value for path, value in flat.items() if naming.of(path) in frozen}
    trained = {path: value for path, value in flat.items() if path not in held}
    return traverse_util.unflatten_dict(trained), traverse_util.unflatten_dict(held)


def merge_params(trained: Any, frozen: Any) -> Any:
    """The two trees of `partition_params` as one."""
    if not frozen:
        return trained
    return traverse_util.unflatten_dict({**traverse_util.flatten_dict(frozen), **traverse_util.flatten_dict(trained)})


def apply(model: nn.Module, model_inputs: Callable, params: Any, model_state: Any, rows: dict, train: bool,
          dropout: bool, key: jax.Array | None = None) -> tuple[jax.Array, Any]:
    """The model's outputs on `rows` and its updated non-trainable state (`model_state` itself outside training).
    `model_inputs(rows, train, dropout)` (the task module's) gives the call's arguments."""
    args, kwargs = model_inputs(rows, train, dropout)
    rngs = {"dropout": key} if train and dropout else None
    variables = {"params": params, **model_state}
    if train and model_state:
        outputs, updated = model.apply(variables, *args, rngs=rngs, mutable=list(model_state), **kwargs)
        return outputs, dict(updated)
    return model.apply(variables, *args, rngs=rngs, **kwargs), model_state


def make_optimizer(spec: OptimizerSpec, params: Any, naming: Naming) -> optax.GradientTransformation:
    """Global-norm clip then AdamW (or SGD with momentum, `spec.optimizer`); the learning rate is a hyperparameter
    set before every update.

    Weight decay follows `tpuplex.protocol.decays` of each parameter's portable (HF) name.
    `clip_norm` = 0 turns clipping off (as HF's max_grad_norm = 0 does) instead of zeroing every gradient.
    """
    mask = jax.tree_util.tree_map_with_path(lambda path, _: decays(naming.of(path)), params)
    if spec.optimizer == "sgd":
        update = optax.inject_hyperparams(lambda learning_rate: optax.chain(
            optax.add_decayed_weights(spec.weight_decay, mask), sgd_momentum(spec.momentum, spec.nesterov),
            optax.scale_by_learning_rate(learning_rate)))(learning_rate=0.0)
    else:
        update = optax.inject_hyperparams(optax.adamw)(
            learning_rate=0.0, b1=spec.beta1, b2=spec.beta2, eps=spec.epsilon, eps_root=0.0,
            weight_decay=spec.weight_decay, mask=mask)
    if spec.clip_norm > 0:
        return optax.chain(optax.clip_by_global_norm(spec.clip_norm), update)
    return optax.chain(update)


def sgd_momentum(momentum: float, nesterov: bool) -> optax.GradientTransformation:
    """torch.optim.SGD's momentum (dampening 0): m = momentum m + g, then g + momentum m (Nesterov) or m.

    Its state is optax's ScaleByAdamState (count, mu = the buffer, nu unused and zero), so checkpoints, resume and
    the dropout key read the same fields for SGD as for AdamW (the portable exp_avg is the buffer).
    """
    def init(params: Any) -> optax.ScaleByAdamState:
        zeros = jax.tree.map(jnp.zeros_like, params)
        return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32), mu=zeros, nu=jax.tree.map(jnp.zeros_like, params))

    def update(updates: Any, state: optax.ScaleByAdamState, params: Any = None) -> tuple[Any, Any]:
        buffer = jax.tree.map(lambda m, g: momentum * m + g, state.mu, updates)
        direction = jax.tree.map(lambda g, m: g + momentum * m, updates, buffer) if nesterov else buffer
        return direction, optax.ScaleByAdamState(count=optax.safe_increment(state.count), mu=buffer, nu=state.nu)

    return optax.GradientTransformation(init, update)


def adam_state(opt_state: Any) -> optax.ScaleByAdamState:
    """The AdamW moments (mu, nu) and bias-correction count inside the optax state."""
    return optax.tree_utils.tree_get(opt_state, "ScaleByAdamState")


def with_adam_state(opt_state: Any, adam: optax.ScaleByAdamState) -> Any:
    """`opt_state` with Adam's moments and count replaced by `adam`, and the injected-hyperparameter count (the
    number of updates inject_hyperparams has seen) set to the same step."""
    def replace(node: Any, kind: type, new: Callable[[Any], Any]) -> Any:
        return jax.tree.map(lambda n: new(n) if isinstance(n, kind) else n, node,
                            is_leaf=lambda n: isinstance(n, kind))

    opt_state = replace(opt_state, optax.ScaleByAdamState, lambda _: adam)
    return replace(opt_state, optax.InjectStatefulHyperparamsState, lambda n: n._replace(count=adam.count))


def make_train_step(model: nn.Module, optimizer: optax.GradientTransformation, grad_accum: int, batch_shards: int,
                    dropout: bool, seed: int, unit_losses: Callable[[Any, dict], jax.Array],
                    model_inputs: Callable) -> Callable[[TrainState, dict, jax.Array, dict],
                                                        tuple[TrainState, jax.Array]]:
    """The train step `(state, rows, learning_rate, held) -> (state, global mean loss)` on the global batch.

    rows: the model's inputs ([B, L] token ids and masks, or [B, H, W, 3] images), and the task's labels and
    weight (weight: the shape of `unit_losses(outputs, rows)`, the task's loss units), B split into
    `batch_shards` parts over the mesh. held: the arrays the devices hold for the run (`Backend.hold`; replicated),
    which every micro-batch's model inputs may read rows of.
    Dropout draws from `key(seed)` folded with the optimizer step and the micro-batch, so a resumed run draws the
    same masks as an uninterrupted one, and (JAX's partitionable threefry) the same on any mesh.
    """
    def step(state: TrainState, rows: dict, learning_rate: jax.Array, held: dict) -> tuple[TrainState, jax.Array]:
        denominator = jnp.maximum(jnp.sum(rows["weight"]), 1.0)
        micro_batches = jax.tree.map(lambda a: micro_split(a, batch_shards, grad_accum), rows)
        step_key = jax.random.fold_in(jax.random.key(seed), adam_state(state.opt_state).count)

        def scaled_loss(params, model_state, micro, key):
            outputs, model_state = apply(model, model_inputs, merge_params(params, state.frozen), model_state,
                                         {**micro, **held}, True, dropout, key)
            weighted_sum = jnp.sum(micro["weight"] * unit_losses(outputs, micro))
            return weighted_sum / denominator, (weighted_sum, model_state)

        def accumulate(carry, inputs):
            grads, loss_sum, model_state = carry
            micro, index = inputs
            (_, (weighted_sum, model_state)), micro_grads = jax.value_and_grad(scaled_loss, has_aux=True)(
                state.params, model_state, micro, jax.random.fold_in(step_key, index))
            return (jax.tree.map(jnp.add, grads, micro_grads), loss_sum + weighted_sum, model_state), None

        zeros = jax.tree.map(jnp.zeros_like, state.params)
        carry = (zeros, jnp.float32(0.0), state.model_state), (micro_batches, jnp.arange(grad_accum))
        # No loop for one micro-batch: inside a while loop XLA:CPU runs a convolution's gradient ~30x slower.
        if grad_accum == 1:
            (grads, loss_sum, model_state), _ = accumulate(carry[0], jax.tree.map(lambda a: a[0], carry[1]))
        else:
            (grads, loss_sum, model_state), _ = jax.lax.scan(accumulate, *carry)
        opt_state = optax.tree_utils.tree_set(state.opt_state, learning_rate=learning_rate)
        updates, opt_state = optimizer.update(grads, opt_state, state.params)
        return (TrainState(optax.apply_updates(state.params, updates), opt_state, model_state, state.frozen),
                loss_sum / denominator)

    return step


def micro_split(rows: jax.Array, batch_shards: int, grad_accum: int) -> jax.Array:
    """[B, ...] -> [grad_accum, B / grad_accum, ...]: micro-batch i holds the i-th of `grad_accum` equal parts of
    each batch shard's B / batch_shards rows, in shard order (so each shard's rows stay on its device)."""
    if grad_accum == 1:
        return rows[None]
    parts = rows.reshape(batch_shards, grad_accum, -1, *rows.shape[1:]).swapaxes(0, 1)
    return parts.reshape(grad_accum, -1, *rows.shape[1:])


def make_predict_step(model: nn.Module, predict_outputs: Callable[[Any, dict], jax.Array],
                      model_inputs: Callable) -> Callable[[Any, Any, dict], jax.Array]:
    """The predict step `(params, model_state, rows) -> the task's predict outputs [B, ...]`, in inference mode
    (no dropout, batch norm on its moving statistics)."""
    def predict(params: Any, model_state: Any, rows: dict) -> jax.Array:
        outputs, _ = apply(model, model_inputs, params, model_state, rows, False, False)
        return predict_outputs(outputs, rows)

    return predict


def forward_flops(model: nn.Module, model_inputs: Callable, params: Any, model_state: Any,
                  rows: dict[str, np.ndarray]) -> float | None:
    """XLA's count of the inference forward's FLOPs on `rows` (the global batch, [B, ...]): the cost analysis of
    the lowered program, from shapes alone (nothing is compiled or run); None where the platform gives none."""
    def forward(params: Any, model_state: Any, rows: dict) -> jax.Array:
        return apply(model, model_inputs, params, model_state, rows, False, False)[0]

    shaped = jax.tree.map(lambda value: jax.ShapeDtypeStruct(np.shape(value), value.dtype),
                          (params, model_state, rows))
    flops = (jax.jit(forward).lower(*shaped).cost_analysis() or {}).get("flops")
    return None if flops is None else float(flops)


class CompileCounter:
    """Counts XLA compilations (JAX's backend-compile events) that happen while this backend's steps run.

    JAX reports every compilation to its monitoring listeners, without saying whose program it is; a thread-local
    marker set around our own calls attributes the events, so other JAX work in the same process
    (another backend, a test's reference computation) is not counted.
    """

    _active = threading.local()
    _listening = False

    def __init__(self) -> None:
        self.count = 0
        if not CompileCounter._listening:
            jax.monitoring.register_event_duration_secs_listener(CompileCounter._on_event)
            CompileCounter._listening = True

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        previous = getattr(CompileCounter._active, "counter", None)
        CompileCounter._active.counter = self
        try:
            yield
        finally:
            CompileCounter._active.counter = previous

    @staticmethod
    def _on_event(event: str, duration: float, **kwargs: Any) -> None:
        counter = getattr(CompileCounter._active, "counter", None)
        if event == BACKEND_COMPILE_EVENT and counter is not None:
            counter.count += 1

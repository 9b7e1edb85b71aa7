"""Compiled train and predict steps under a `tf.distribute` strategy, following `tpuplex.protocol` exactly.

One training step, per replica (inside `strategy.run`, inside one `tf.function`):
  1. `_replica_gradients` (XLA, `jit_compile=True`): forward and backward over the replica's B/n rows, split into
     `grad_accum` micro-batches, giving the gradient of sum(weight * loss) over its rows.
  2. one batched all-reduce (SUM) of the gradients, the weighted loss sum and the weight sum. It stays outside
     XLA: MirroredStrategy cannot compile collectives into a jit_compile function, so the strategy runs it.
     The summed gradients divided by the global weight are the gradient of the global batch's weighted mean
     loss, also when replicas hold different weights (an epoch's short batch, filled up with weight-0 rows).
  3. `_adamw` or `_sgd` (XLA): global-norm clip and the update on the reduced gradients; every replica gets the
     same inputs, so every replica computes the same new values.
  4. `merge_call` -> `extended.update`: each replica writes the new values into its own copy of the variables.
On TPUStrategy the whole tf.function becomes one TPU program anyway.

How host batches reach the devices: the k host batches of one call, each [B, L], are concatenated row-wise into
host tensors [k * B, L] and passed to the training tf.function as they are. Inside `strategy.run` each replica takes
its own rows of batch i (`_replica_rows`): replica r of n takes rows [r * B/n, (r + 1) * B/n). Replicas are
numbered process-major, so a process's replicas take its block of every batch (`tpuplex.hosts.process_rows`). A
`tf.range` loop inside the training tf.function runs the k steps (steps_per_execution) on-device. The programs are
traced with the leading dimension unknown, so `train_step` (k = 1) and `train_steps` share one training program
per bucket length. Prediction uses the same path with k = 1 and gathers the replicas' logits (of every process) in
replica order, which is row order.
No `tf.data` pipeline: the rows are already in host memory, and a pipeline built inside every call costs its
iterator's set-up and tear-down each step (measured at [32, 128] on a 2-core CPU: some calls end with a ~500 ms wait
with no op running, see docs/investigations/tf-step.md).

A model's non-trainable state (batch-norm moving statistics) is updated in step 1 without writing any variable
(the forward runs in a `keras.StatelessScope` that collects the new values), averaged over the replicas by the same
all-reduce, and written with the parameters in step 4.

The learning rates arrive as a float32 tensor [k], so a new value never retraces. Dropout seeds are derived from
(optimizer seed, optimizer step, replica, micro-batch), so a resumed run draws the same masks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tpuplex.data.batching import check_divisible, check_micro_batches
from tpuplex.errors import TpuplexError
from tpuplex.protocol import Batch, OptimizerSpec, batch_rows, decays, device_dtype, head_inputs
from tpuplex_tf.kinds import Built
from tpuplex_tf.tasks import TaskModule


class Steps:
    """The compiled programs and the AdamW state of one model.

    Attributes:
        names: HF names of the parameters that train, in the order of `variables`, `exp_avg` and `exp_avg_sq`.
        transposed: per name, whether the variable is the transpose of the HF tensor (Dense kernels).
        variables: their tf.Variables (Keras layout: Dense kernels are [in, out]).
        exp_avg, exp_avg_sq: Adam moments, one per variable, same shapes.
        frozen: (HF name, transposed, variable) of each parameter that does not train (`ModelSpec.frozen`, a LoRA
            run's base): no gradient, no moments.
        step: int64 scalar, optimizer updates applied so far.
        state_names, state_variables: the model's non-trainable state (user models' batch-norm statistics).
        traces: Python traces of the top-level tf.functions (training and prediction programs).
    """

    def __init__(self, strategy: tf.distribute.Strategy, built: Built, optimizer: OptimizerSpec, task: TaskModule,
                 inputs: tuple[str, ...], jit_compile: bool, frozen: frozenset[str] = frozenset()):
        self.strategy = strategy
        self.model = model = built.network
        self.keras_layer = built.keras_layer
        self.optimizer = optimizer
        self.task = task
        self.inputs = inputs
        state = model.state_variables()
        self.state_names, self._state_keras = list(state), list(state.values())
        self.state_variables = [v.value for v in self._state_keras]
        hf_variables = model.hf_variables()
        self.names = [name for name in hf_variables if name not in frozen]
        self.variables = [hf_variables[name][0].value for name in self.names]
        self.transposed = [hf_variables[name][1] for name in self.names]
        self.frozen = [(name, transposed, variable.value) for name, (variable, transposed) in hf_variables.items()
                       if name in frozen]
        self._decays = [decays(name) for name in self.names]
        with strategy.scope():
            self.exp_avg = [tf.Variable(tf.zeros(v.shape), trainable=False) for v in self.variables]
            self.exp_avg_sq = [tf.Variable(tf.zeros(v.shape), trainable=False) for v in self.variables]
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.traces = 0
        # A forward pass that synchronises the replicas itself (cross-replica batch norm) cannot run in a nested
        # tf.function under MirroredStrategy: it runs inside the outer program (which TPUStrategy compiles whole).
        synchronises = built.synchronises_replicas and strategy.num_replicas_in_sync > 1
        self._replica_gradients_program = self._replica_gradients if synchronises else \
            tf.function(self._replica_gradients, jit_compile=jit_compile)
        self._update_xla = tf.function(self._sgd if optimizer.optimizer == "sgd" else self._adamw,
                                       jit_compile=jit_compile)
        self._logits_xla = tf.function(self._logits, jit_compile=jit_compile)
        self._programs: dict[tuple, Callable] = {}

    def train(self, batches: Sequence[Batch], learning_rates: Sequence[float]) -> list[float]:
        """Apply one update per batch (all of one shape [B, L]) in a single call; returns each batch's loss."""
        if len(batches) != len(learning_rates) or not batches:
            raise TpuplexError(f"train_steps got {len(batches)} batches and {len(learning_rates)} learning "
                               "rates: pass one learning rate per batch, at least one batch")
        shapes = {tuple((key, value.shape) for key, value in b.items()) for b in batches}
        if len(shapes) != 1:
            raise TpuplexError(f"train_steps got batches of shapes {sorted(shapes)}: one call takes batches of "
                               "one shape (group steps_per_execution batches by bucket length)")
        rows = batch_rows(batches[0])
        check_micro_batches(rows, self.strategy.num_replicas_in_sync, self.optimizer.grad_accum)
        keys = (*self.inputs, "labels", "weight", *head_inputs(batches[0], self.inputs))
        arrays = {key: np.concatenate([_train_array(b, key) for b in batches]) for key in keys}
        program = self._program(self._train_loop, arrays, rows, tf.TensorSpec([None], tf.float32))
        return [float(loss) for loss in program(arrays, np.asarray(learning_rates, np.float32)).numpy()]

    def predict(self, batch: Batch) -> np.ndarray:
        """The task's predict outputs [B, ...] for every row of `batch`."""
        rows = batch_rows(batch)
        check_divisible(rows, self.strategy.num_replicas_in_sync, "the evaluation batch size")
        keys = (*self.inputs, "labels", *head_inputs(batch, self.inputs))
        arrays = {key: _train_array(batch, key) for key in keys if key in batch}
        return self._program(self._predict, arrays, rows)(arrays).numpy()

    def forward_flops(self, batch: Batch) -> float:
        """The inference forward's FLOPs on the global `batch` as TensorFlow's graph profiler counts them (the
        float_ops statistics of the traced graph's matrix products, convolutions, bias additions ...): traced on
        the batch's shapes, never run."""
        arrays = {key: _train_array(batch, key) for key in (*self.inputs, *head_inputs(batch, self.inputs))}
        graph = tf.function(self._forward).get_concrete_function(
            {key: tf.TensorSpec(array.shape, tf.as_dtype(array.dtype)) for key, array in arrays.items()}).graph
        options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
        options["output"] = "none"
        quiet = tf.get_logger().level
        tf.get_logger().setLevel("ERROR")  # the v1 profiler's deprecation notices
        try:
            return float(tf.compat.v1.profiler.profile(graph=graph, options=options).total_float_ops)
        finally:
            tf.get_logger().setLevel(quiet)

    def _program(self, body: Callable, arrays: dict[str, np.ndarray], rows: int,
                 *more: tf.TensorSpec) -> Callable:
        """`body(arrays, *more, rows)` as a tf.function for inputs shaped like `arrays` with any number of stacked
        batches, and further arguments of the signatures `more` (a train call's learning rates).

        arrays: each [k * rows, ...]; the program is traced once per (body, rows, trailing shapes and dtypes).
        """
        signature = {key: tf.TensorSpec([None, *array.shape[1:]], tf.as_dtype(array.dtype))
                     for key, array in arrays.items()}
        key = (body.__name__, rows, tuple(signature.items()), more)
        if key not in self._programs:
            self._programs[key] = tf.function(functools.partial(body, rows=rows), input_signature=[signature, *more])
        return self._programs[key]

    # --- traced programs -------------------------------------------------------------------------------------

    def _train_loop(self, arrays: dict[str, tf.Tensor], learning_rates: tf.Tensor, rows: int) -> tf.Tensor:
        """One optimizer step per batch of `arrays` (each [k * rows, ...]) at its learning rate (float32 [k]) ->
        losses float32 [k]."""
        self.traces += 1
        count = tf.shape(arrays["labels"])[0] // rows
        losses = tf.TensorArray(tf.float32, size=count)
        replica_step = functools.partial(self._replica_step, rows=rows)
        for index in tf.range(count):
            per_replica = self.strategy.run(replica_step, args=(arrays, learning_rates[index], index))
            losses = losses.write(index, self.strategy.experimental_local_results(per_replica)[0])
        return losses.stack()

    def _predict(self, arrays: dict[str, tf.Tensor], rows: int) -> tf.Tensor:
        """The predict outputs [rows, ...] of the one batch in `arrays`, gathered from the replicas in row order."""
        self.traces += 1
        return self.strategy.gather(self.strategy.run(functools.partial(self._replica_logits, rows=rows),
                                                      args=(arrays,)), axis=0)

    def _replica_rows(self, arrays: dict[str, tf.Tensor], index: tf.Tensor | int, rows: int) -> dict[str, tf.Tensor]:
        """In replica context: this replica's rows of batch `index` of `arrays` (each [k * rows, ...]), each
        [rows / replicas, ...] with a static shape."""
        replicas = self.strategy.num_replicas_in_sync
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        return {key: tf.reshape(array, [-1, replicas, rows // replicas, *array.shape[1:]])[index, replica]
                for key, array in arrays.items()}

    def _replica_step(self, arrays: dict[str, tf.Tensor], learning_rate: tf.Tensor, index: tf.Tensor,
                      rows: int) -> tf.Tensor:
        """Update `index` of the call at `learning_rate`, in replica context; returns the global batch's weighted
        mean loss (a scalar)."""
        batch = self._replica_rows(arrays, index, rows)
        context = tf.distribute.get_replica_context()
        replicas = self.strategy.num_replicas_in_sync
        replica = tf.cast(context.replica_id_in_sync_group, tf.int32)
        seed = tf.stack([tf.constant(self.optimizer.seed, tf.int32),
                         tf.cast(self.step, tf.int32) * replicas + replica])
        gradients, loss_sum, weight_sum, model_state = self._replica_gradients_program(batch, seed)
        # Floating state (batch-norm statistics) is averaged over the replicas; counts are equal on every replica
        # (and int32 lives in host memory, which an all-reduce with device tensors refuses).
        floating = [index for index, value in enumerate(model_state) if value.dtype.is_floating]
        *sums, loss_sum, weight_sum = context.all_reduce(
            tf.distribute.ReduceOp.SUM, [*gradients, *(model_state[i] for i in floating), loss_sum, weight_sum])
        gradients = [g / tf.maximum(weight_sum, 1.0) for g in sums[: len(gradients)]]
        averaged = dict(zip(floating, (total / replicas for total in sums[len(gradients) :]), strict=True))
        model_state = [averaged.get(index, value) for index, value in enumerate(model_state)]
        updated = self._update_xla([v.read_value() for v in self.variables], [m.read_value() for m in self.exp_avg],
                                  [v.read_value() for v in self.exp_avg_sq], gradients, learning_rate,
                                  self.step + 1)
        context.merge_call(self._write, args=(*updated, model_state))
        return loss_sum / tf.maximum(weight_sum, 1.0)

    def _write(self, strategy: tf.distribute.Strategy, params, exp_avg, exp_avg_sq, model_state) -> None:
        """Cross-replica: every replica's new values into its own copy of each variable; step += 1."""
        targets = (*self.variables, *self.exp_avg, *self.exp_avg_sq, *self.state_variables)
        for variable, value in zip(targets, (*params, *exp_avg, *exp_avg_sq, *model_state), strict=True):
            strategy.extended.update(variable, _assign, args=(value,), group=False)
        strategy.extended.update(self.step, _increment, group=False)

    def _replica_gradients(self, batch: dict[str, tf.Tensor], seed: tf.Tensor):
        """Gradients of sum(weight * loss) over this replica's rows [R, L], in `grad_accum` micro-batches of R/k rows.

        Returns (gradients like `variables`, sum(weight * loss) over the rows, sum(weight), the model state after
        the micro-batches' forward passes, like `state_variables`).
        """
        accum = self.optimizer.grad_accum
        micro = {key: tf.reshape(x, [accum, -1, *x.shape[1:]]) for key, x in batch.items()}
        gradients = [tf.zeros(v.shape) for v in self.variables]
        model_state = [v.read_value() for v in self.state_variables]
        loss_sum = weight_sum = tf.constant(0.0)
        # No loop for one micro-batch: inside a while loop XLA:CPU runs a convolution's gradient ~30x slower.
        for index in range(accum) if accum == 1 else tf.range(accum):
            rows = {key: x[index] for key, x in micro.items()}
            with tf.GradientTape() as tape:
                logits, model_state = self._train_forward(rows, tf.random.experimental.stateless_fold_in(seed, index),
                                                          model_state)
                weighted_sum = tf.reduce_sum(rows["weight"] * self.task.unit_losses(logits, rows))
            step_gradients = tape.gradient(weighted_sum, self.variables)
            # Embedding gradients come as IndexedSlices; dense tensors are what the all-reduce and AdamW take.
            gradients = [g + tf.convert_to_tensor(s) for g, s in zip(gradients, step_gradients, strict=True)]
            loss_sum += weighted_sum
            weight_sum += tf.reduce_sum(rows["weight"])
        return gradients, loss_sum, weight_sum, model_state

    def _train_forward(self, rows: dict[str, tf.Tensor], seed: tf.Tensor, model_state: list[tf.Tensor]):
        """(outputs, new model state) of a training forward pass from `model_state`: the state's updates are
        collected by a StatelessScope, not written (replicas write them together, averaged, in `_write`)."""
        call = functools.partial(self.model, *self.task.model_inputs(rows), seed=seed,
                                 **head_inputs(rows, self.inputs))
        if not self._state_keras:
            return call(), model_state
        with keras.StatelessScope(state_mapping=list(zip(self._state_keras, model_state, strict=True))) as scope:
            outputs = call()
        return outputs, [scope.get_current_value(v) for v in self._state_keras]

    def _adamw(self, params, exp_avg, exp_avg_sq, gradients, learning_rate, step):
        """Clip by global norm, then AdamW with bias correction and decoupled decay (the protocol's formula).

        `step` is the count including this update (t). Returns (params, exp_avg, exp_avg_sq), each a list.
        """
        spec, gradients = self.optimizer, self._clipped(gradients)
        t = tf.cast(step, tf.float32)
        correction1, correction2 = 1.0 - spec.beta1 ** t, 1.0 - spec.beta2 ** t
        new_params, new_exp_avg, new_exp_avg_sq = [], [], []
        for p, m, v, g, decay in zip(params, exp_avg, exp_avg_sq, gradients, self._decays, strict=True):
            m = spec.beta1 * m + (1.0 - spec.beta1) * g
            v = spec.beta2 * v + (1.0 - spec.beta2) * tf.square(g)
            update = (m / correction1) / (tf.sqrt(v / correction2) + spec.epsilon)
            if decay:
                update += spec.weight_decay * p
            new_params.append(p - learning_rate * update)
            new_exp_avg.append(m)
            new_exp_avg_sq.append(v)
        return new_params, new_exp_avg, new_exp_avg_sq

    def _clipped(self, gradients: list[tf.Tensor]) -> list[tf.Tensor]:
        """g * min(1, clip_norm / global_norm(g)); clip_norm 0 turns clipping off."""
        if self.optimizer.clip_norm <= 0:
            return gradients
        scale = tf.minimum(1.0, self.optimizer.clip_norm / tf.linalg.global_norm(gradients))
        return [g * scale for g in gradients]

    def _sgd(self, params, exp_avg, exp_avg_sq, gradients, learning_rate, step):
        """Clip by global norm, then torch.optim.SGD's momentum update (the protocol's formula); `exp_avg` holds
        the momentum buffer, `exp_avg_sq` stays zero. Returns (params, exp_avg, exp_avg_sq), each a list."""
        spec, gradients = self.optimizer, self._clipped(gradients)
        new_params, buffers = [], []
        for p, m, g, decay in zip(params, exp_avg, gradients, self._decays, strict=True):
            if decay:
                g = g + spec.weight_decay * p
            m = spec.momentum * m + g
            new_params.append(p - learning_rate * (g + spec.momentum * m if spec.nesterov else m))
            buffers.append(m)
        return new_params, buffers, list(exp_avg_sq)

    def _replica_logits(self, arrays: dict[str, tf.Tensor], rows: int) -> tf.Tensor:
        # A plain Python function around the XLA one: passing the tf.function to strategy.run directly places
        # every replica's XLA launch on the first device, which cannot read the other replicas' variables.
        return self._logits_xla(self._replica_rows(arrays, 0, rows))

    def _logits(self, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        return self.task.predict_outputs(self._forward(batch), batch)

    def _forward(self, batch: dict[str, tf.Tensor]) -> Any:
        return self.model(*self.task.model_inputs(batch), **head_inputs(batch, self.inputs))


def _train_array(batch: Batch, key: str) -> np.ndarray:
    """One training input as the dtype the program takes (`tpuplex.protocol.device_dtype`, index type int32);
    labels as they are; a batch without `weight` counts every row."""
    if key == "weight":
        return np.asarray(batch.get("weight", np.ones(np.shape(batch["labels"]))), np.float32)
    array = np.asarray(batch[key])
    return array if key == "labels" else array.astype(device_dtype(array, np.int32), copy=False)


def _assign(variable: tf.Variable, value: tf.Tensor):
    return variable.assign(value)


def _increment(variable: tf.Variable):
    return variable.assign_add(1)

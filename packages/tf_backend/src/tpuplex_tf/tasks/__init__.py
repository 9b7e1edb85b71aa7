"""The contract of a task's Keras (TensorFlow) module, what the tf backend and the model kinds call.

A task's module here (`tpuplex_tf.tasks.<task>`, or a module of your own task's) subclasses `TaskModule` and
`Task.backends["tf"]` names the class ("package.module:Class").
Batches here are dicts of tensors: the model's inputs, `labels` and `weight` (the task's loss units), and the
head's inputs (`tpuplex.protocol.head_inputs`).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from tpuplex import tasks
from tpuplex.protocol import TEXT_INPUTS

Endpoint = tuple[Callable[..., dict[str, tf.Tensor]], list[tf.TensorSpec]]
"""A SavedModel endpoint: its function and the function's input signature."""


@dataclass(frozen=True)
class Serving:
    """What `tpuplex export --format saved_model` writes: the endpoints by name, `serving_default` among them, and
    the TensorFlow objects beyond the model that they read (a tokenizer's tables), which the archive tracks."""

    endpoints: dict[str, Endpoint]
    resources: tuple[tf.Module, ...] = ()


class TaskModule(abc.ABC):
    """A task in Keras: what the model is called with, its losses and serving (a text encoder's head is the task's
    `Head.forward`, `tpuplex.tasks.base`, written once)."""

    name: str = ""
    """The task's name, set by `load`."""

    def model_inputs(self, batch: dict[str, tf.Tensor]) -> tuple[tf.Tensor, ...]:
        """What the model is called with: input_ids, token_type_ids, attention_mask int32 [B, L]."""
        return tuple(batch[name] for name in TEXT_INPUTS)

    @abc.abstractmethod
    def unit_losses(self, outputs: tf.Tensor, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        """float32 losses of the task's units, the shape of batch["weight"]."""

    @abc.abstractmethod
    def predict_outputs(self, outputs: tf.Tensor, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        """What `Backend.predict` returns per row."""

    def serving(self, model: Any, data: Any) -> Serving:
        """The SavedModel's endpoints (`tpuplex export --format saved_model`). For text, `serving_default`:
        input_ids, token_type_ids, attention_mask int32 [batch, length] (the tokenizer runs beside the server) ->
        `serving_outputs`."""
        def serve(input_ids: tf.Tensor, token_type_ids: tf.Tensor, attention_mask: tf.Tensor) -> dict[str, tf.Tensor]:
            return self.serving_outputs(model(input_ids, token_type_ids, attention_mask))

        return Serving({"serving_default": (serve, [tf.TensorSpec([None, None], tf.int32, name=name)
                                                    for name in TEXT_INPUTS])})

    def serving_outputs(self, outputs: tf.Tensor) -> dict[str, tf.Tensor]:
        """The serving outputs of the model's outputs: logits."""
        return {"logits": outputs}


def token_losses(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """Per-token cross-entropy float32 [B, P] of logits [B, P, V] against labels [B, P] (language modelling)."""
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.cast(labels, tf.int32),
                                                          logits=tf.cast(logits, tf.float32))


def token_outputs(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """float32 [B, P, 2]: each token's cross-entropy and 1.0 where the most likely token is the label (what
    `tpuplex.tasks.base.token_metrics` reads)."""
    correct = tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), tf.cast(labels, tf.int32))
    return tf.stack([token_losses(logits, labels), tf.cast(correct, tf.float32)], axis=-1)


def load(task: Any) -> TaskModule:
    """The task's Keras module (`Task.backends["tf"]`), checked to be a `TaskModule`."""
    return tasks.framework_module(task, "tf", TaskModule)

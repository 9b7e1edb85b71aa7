"""The contract of a task's Flax (JAX) module, what the jax backend and the model kinds call.

A task's module here (`tpuplex_jax.tasks.<task>`, or a module of your own task's) subclasses `TaskModule` and
`Task.backends["jax"]` names the class ("package.module:Class").
Rows here are one replica's arrays: the model's inputs, `labels` and `weight` (the task's loss units), and the
head's inputs (`tpuplex.protocol.head_inputs`).
"""

from __future__ import annotations

import abc
from typing import Any

import jax.numpy as jnp
import optax

import jax
from tpuplex import tasks
from tpuplex.protocol import TEXT_INPUTS, head_inputs


class TaskModule(abc.ABC):
    """A task in Flax: how the model is called, and its losses (a text encoder's head is the task's `Head.forward`,
    `tpuplex.tasks.base`, written once)."""

    name: str = ""
    """The task's name, set by `load`."""

    def model_inputs(self, rows: dict[str, jax.Array], train: bool, dropout: bool) -> tuple[tuple, dict]:
        """The model's call as (arguments, keyword arguments): input_ids, token_type_ids, attention_mask [b, L],
        `deterministic` (no dropout outside training, or when it is off) and the head's inputs."""
        return tuple(rows[name] for name in TEXT_INPUTS), {"deterministic": not (train and dropout),
                                                          **head_inputs(rows, TEXT_INPUTS)}

    @abc.abstractmethod
    def unit_losses(self, outputs: jax.Array, rows: dict[str, jax.Array]) -> jax.Array:
        """float32 losses of the task's units, the shape of rows["weight"]."""

    @abc.abstractmethod
    def predict_outputs(self, outputs: jax.Array, rows: dict[str, jax.Array]) -> jax.Array:
        """What `Backend.predict` returns per row."""


def token_losses(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-token cross-entropy float32 [B, P] of logits [B, P, V] against labels [B, P] (language modelling)."""
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)


def token_outputs(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """float32 [B, P, 2]: each token's cross-entropy and 1.0 where the most likely token is the label (what
    `tpuplex.tasks.base.token_metrics` reads)."""
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    return jnp.stack([token_losses(logits, labels), correct], axis=-1)


def load(task: Any) -> TaskModule:
    """The task's Flax module (`Task.backends["jax"]`), checked to be a `TaskModule`."""
    return tasks.framework_module(task, "jax", TaskModule)

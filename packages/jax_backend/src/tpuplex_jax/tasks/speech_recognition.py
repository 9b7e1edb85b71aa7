"""Speech recognition in JAX: the model's call, each utterance's CTC loss and the predict outputs."""

from __future__ import annotations

import jax.numpy as jnp
import optax

import jax
from tpuplex.tasks.speech_recognition.data import BLANK
from tpuplex_jax import tasks as tasks_jax


class Module(tasks_jax.TaskModule):
    def model_inputs(self, rows: dict[str, jax.Array], train: bool, dropout: bool) -> tuple[tuple, dict]:
        return (rows["features"], rows["attention_mask"]), {"deterministic": not (train and dropout)}

    def unit_losses(self, outputs: tuple, rows: dict[str, jax.Array]) -> jax.Array:
        """float32 [b]: each utterance's CTC loss over its transcript's length; 0 where the model's frames cannot
        hold the transcript (see the torch module)."""
        logits, frames = outputs
        fits = feasible(frames, rows["labels"])
        labels = jnp.where(fits[:, None], rows["labels"], BLANK)
        label_lengths = (labels != BLANK).sum(axis=1)
        frame_paddings = (jnp.arange(logits.shape[1])[None, :] >= frames[:, None]).astype(jnp.float32)
        losses = optax.ctc_loss(logits.astype(jnp.float32), frame_paddings, labels,
                                (labels == BLANK).astype(jnp.float32), blank_id=BLANK)
        return jnp.where(fits, losses / jnp.maximum(label_lengths, 1), 0.0)

    def predict_outputs(self, outputs: tuple, rows: dict[str, jax.Array]) -> jax.Array:
        """float32 [b, T, 2]: each output frame's most likely symbol (-1 after the utterance's output frames, and
        on to the T input frames) and the utterance's loss."""
        logits, frames = outputs
        rows_count, length = rows["features"].shape[:2]
        ids = jnp.argmax(logits, axis=-1)
        ids = jnp.where(jnp.arange(ids.shape[1])[None, :] < frames[:, None], ids, -1)
        ids = jnp.pad(ids, ((0, 0), (0, length - ids.shape[1])), constant_values=-1).astype(jnp.float32)
        losses = jnp.broadcast_to(self.unit_losses(outputs, rows)[:, None], (rows_count, length))
        return jnp.stack([ids, losses], axis=-1)


def feasible(frames: jax.Array, labels: jax.Array) -> jax.Array:
    """bool [b]: whether T' frames can align the transcript: one frame a symbol, and a blank between repeats."""
    repeats = ((labels[:, 1:] == labels[:, :-1]) & (labels[:, 1:] != BLANK)).sum(axis=1)
    return frames >= (labels != BLANK).sum(axis=1) + repeats

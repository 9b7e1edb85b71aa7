"""Text-to-text training in Keras (TensorFlow): the cross-entropy of an encoder-decoder's logits over the target
tokens, and the SavedModel that decodes greedily in its graph."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tpuplex.models import t5
from tpuplex.models.t5 import INPUTS
from tpuplex.tasks import tf as tasks_tf


class Module(tasks_tf.TaskModule):
    def model_inputs(self, batch: dict[str, tf.Tensor]) -> tuple[tf.Tensor, ...]:
        """The model's call: input_ids, attention_mask int32 [B, S], decoder_input_ids [B, T]."""
        return tuple(batch[name] for name in INPUTS)

    def unit_losses(self, outputs: tf.Tensor, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        """Per-target-token cross-entropy [B, T] of logits [B, T, V]."""
        return tasks_tf.token_losses(outputs, batch["labels"])

    def predict_outputs(self, outputs: tf.Tensor, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        """float32 [B, T, 2]: each target token's cross-entropy and 1.0 where it is the most likely token."""
        return tasks_tf.token_outputs(outputs, batch["labels"])

    def serving(self, model: Any, data: Any) -> tuple[Any, list[tf.TensorSpec]]:
        """The SavedModel's `serving_default`: input_ids, attention_mask int32 [batch, S] (the tokenizer runs beside
        the server: each input's tokens then </s>, right-padded to the run's `data.max_length` S; T5's relative
        positions are laid out for that static length) -> sequences int32 [batch, T]: the T target tokens (the
        run's target length) greedy decoding writes, </s> then padding after each text's end."""
        length, targets = next((split.input_ids.shape[1], split.labels.shape[1])
                               for split in (data.train, *data.eval.values()) if split is not None)

        def serve(input_ids: tf.Tensor, attention_mask: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"sequences": greedy(model, input_ids, attention_mask, targets)}

        return serve, [tf.TensorSpec([None, length], tf.int32, name=name) for name in INPUTS[:2]]


def greedy(model: Any, input_ids: tf.Tensor, attention_mask: tf.Tensor, new_tokens: int) -> tf.Tensor:
    """int32 [B, new_tokens]: greedy decoding inside the graph (`tpuplex.models.search` runs on the host instead):
    the encoder once, then one decoder step a token in a while loop over the self-attention cache; each row pads
    after its </s>."""
    ops, params, arch = model.ops(), model.params(), model.arch
    cross = t5.cross_keys(ops, params, arch, t5.encode(ops, params, arch, input_ids, attention_mask))
    rows = tf.shape(input_ids)[0]
    shape = tf.stack([rows, new_tokens, arch.num_heads, arch.head_dim])
    cache = tuple((tf.zeros(shape, model.compute_dtype),) * 2 for _ in range(arch.decoder_layers))

    def step(position, tokens, done, cache, written):
        logits, cache = t5.decode(ops, params, arch, tokens[:, None], None, attention_mask, cross=cross, cache=cache,
                                  cache_index=position)
        chosen = tf.where(done, arch.pad_id, tf.argmax(logits[:, 0], axis=-1, output_type=tf.int32))
        return position + 1, chosen, done | tf.equal(chosen, arch.eos_id), cache, written.write(position, chosen)

    start = tf.fill([rows], tf.constant(arch.decoder_start_id, tf.int32))
    *_, written = tf.while_loop(lambda position, *_: position < new_tokens, step,
                                (tf.constant(0), start, tf.zeros([rows], tf.bool), cache,
                                 tf.TensorArray(tf.int32, size=new_tokens)))
    return tf.transpose(written.stack())

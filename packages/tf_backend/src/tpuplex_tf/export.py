"""A trained model as a TensorFlow SavedModel for TF Serving: `tpuplex export RUN --format saved_model`.

Written with Keras 3's `keras.export.ExportArchive`. The signature `serving_default` takes what the tokenizer gives
(the text itself would need tokenizer ops that TensorFlow does not ship for every family's tokenizer; `tokenizers`
runs beside the server instead):

    input_ids, token_type_ids, attention_mask   int32 [batch, length], any batch and length up to the model's
    -> logits          float32 [batch, num_labels]
       probabilities   float32 [batch, num_labels] (softmax; for regression, the score itself)
"""

from __future__ import annotations

from pathlib import Path

import keras
import tensorflow as tf

from tpuplex_tf.step import MODEL_INPUTS


def saved_model(model: keras.Model, num_labels: int, folder: Path) -> None:
    """Write the SavedModel of `model` (its forward pass without dropout) into `folder`."""

    def serve(input_ids: tf.Tensor, token_type_ids: tf.Tensor, attention_mask: tf.Tensor) -> dict[str, tf.Tensor]:
        logits = model(input_ids, token_type_ids, attention_mask)
        probabilities = logits if num_labels == 1 else tf.nn.softmax(logits, axis=-1)
        return {"logits": logits, "probabilities": probabilities}

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serving_default", serve,
                         input_signature=[tf.TensorSpec([None, None], tf.int32, name=name) for name in MODEL_INPUTS])
    archive.write_out(str(folder), verbose=False)

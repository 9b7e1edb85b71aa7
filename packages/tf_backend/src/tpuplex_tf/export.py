"""A trained model as a TensorFlow SavedModel for TF Serving: `tpuplex export RUN --format saved_model`.

Written with Keras 3's `keras.export.ExportArchive`. The signature `serving_default` takes what the tokenizer gives
(the text itself would need tokenizer ops that TensorFlow does not ship for every family's tokenizer; `tokenizers`
runs beside the server instead):

    input_ids, token_type_ids, attention_mask   int32 [batch, length], any batch and length up to the model's
    -> the task's serving outputs (`serving_outputs` of its tf module; sequence classification: logits and
       probabilities [batch, num_labels])
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import keras
import tensorflow as tf

from tpuplex.protocol import MODEL_INPUTS


def saved_model(model: keras.Model, task: ModuleType, folder: Path) -> None:
    """Write the SavedModel of `model` (its forward pass without dropout) into `folder`."""

    def serve(input_ids: tf.Tensor, token_type_ids: tf.Tensor, attention_mask: tf.Tensor) -> dict[str, tf.Tensor]:
        return task.serving_outputs(model(input_ids, token_type_ids, attention_mask))

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serving_default", serve,
                         input_signature=[tf.TensorSpec([None, None], tf.int32, name=name) for name in MODEL_INPUTS])
    archive.write_out(str(folder), verbose=False)

"""A trained model as a TensorFlow SavedModel for TF Serving: `tpuplex export RUN --format saved_model`.

Written with Keras 3's `keras.export.ExportArchive`. The signature `serving_default` is the task's: its tf module's
`serving_endpoint(model, data)` when it has one (image classification: encoded image bytes in, see
`tpuplex.tasks.image_classification.tf`), else what the tokenizer gives (the text itself would need tokenizer ops
that TensorFlow does not ship for every family's tokenizer; `tokenizers` runs beside the server instead):

    input_ids, token_type_ids, attention_mask   int32 [batch, length], any batch and length up to the model's
    -> the task's serving outputs (`serving_outputs` of its tf module; sequence classification: logits and
       probabilities [batch, num_labels])
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import keras
import tensorflow as tf

from tpuplex.protocol import MODEL_INPUTS


def saved_model(model: Any, task: ModuleType, folder: Path, data: Any) -> None:
    """Write the SavedModel of `model` (its forward pass in inference mode) into `folder`."""
    if hasattr(task, "serving_endpoint"):
        serve, signature = task.serving_endpoint(model, data)
    else:
        def serve(input_ids: tf.Tensor, token_type_ids: tf.Tensor, attention_mask: tf.Tensor) -> dict[str, tf.Tensor]:
            return task.serving_outputs(model(input_ids, token_type_ids, attention_mask))

        signature = [tf.TensorSpec([None, None], tf.int32, name=name) for name in MODEL_INPUTS]
    archive = keras.export.ExportArchive()
    archive.track(getattr(model, "module", model))  # a model of your own is a wrapper around its Keras module
    archive.add_endpoint("serving_default", serve, input_signature=signature)
    archive.write_out(str(folder), verbose=False)

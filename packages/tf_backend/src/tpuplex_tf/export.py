"""A trained model as a TensorFlow SavedModel for TF Serving: `tpuplex export RUN --format saved_model`.

Written with Keras 3's `keras.export.ExportArchive`. The signature `serving_default` is the task's
(`tpuplex.tasks.tf.TaskModule.serving`): for text, what the tokenizer gives (the text itself would need tokenizer
ops that TensorFlow does not ship for every family's tokenizer; `tokenizers` runs beside the server instead),

    input_ids, token_type_ids, attention_mask   int32 [batch, length], any batch and length up to the model's
    -> the task's serving outputs (sequence classification: logits and probabilities [batch, num_labels])

and for images encoded image bytes (`tpuplex.tasks.image_classification.tf`). A text-to-text run's takes input_ids
and attention_mask at the run's input length and returns the sequences greedy decoding writes, decoded inside the
graph (`tpuplex.tasks.seq2seq.tf`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import keras

from tpuplex.tasks.tf import TaskModule


def saved_model(model: Any, layer: keras.layers.Layer, task: TaskModule, folder: Path, data: Any) -> None:
    """Write the SavedModel of `model` (its forward pass in inference mode) into `folder`; `layer` is the Keras
    object that holds its variables (the model, or the module of your own it wraps)."""
    serve, signature = task.serving(model, data)
    archive = keras.export.ExportArchive()
    archive.track(layer)
    archive.add_endpoint("serving_default", serve, input_signature=signature)
    archive.write_out(str(folder), verbose=False)

"""A trained model as a TensorFlow SavedModel for TF Serving: `tpuplex export RUN --format saved_model`.

Written with Keras 3's `keras.export.ExportArchive`. The endpoints are the task's
(`tpuplex_tf.tasks.TaskModule.serving`); `serving_default` takes, for text, what the tokenizer gives (the text
itself would need tokenizer ops that TensorFlow does not ship for every family's tokenizer; `tokenizers` runs beside
the server instead),

    input_ids, token_type_ids, attention_mask   int32 [batch, length], any batch and length up to the model's
    -> the task's serving outputs (sequence classification: logits and probabilities [batch, num_labels])

and for images encoded image bytes (`tpuplex_tf.tasks.image_classification`). A text-to-text run's takes texts and
returns the texts greedy decoding writes, tokenized, decoded and detokenized inside the graph (its `token_ids`
endpoint takes the ids; `tpuplex_tf.tasks.seq2seq`); load it after `import tensorflow_text`, whose ops it runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import keras

from tpuplex_tf.tasks import TaskModule


def saved_model(model: Any, layer: keras.layers.Layer, task: TaskModule, folder: Path, data: Any) -> None:
    """Write the SavedModel of `model` (its forward pass in inference mode) into `folder`; `layer` is the Keras
    object that holds its variables (the model, or the module of your own it wraps)."""
    serving = task.serving(model, data)
    archive = keras.export.ExportArchive()
    for tracked in (layer, *serving.resources):
        archive.track(tracked)
    for name, (function, signature) in serving.endpoints.items():
        archive.add_endpoint(name, function, input_signature=signature)
    archive.write_out(str(folder), verbose=False)

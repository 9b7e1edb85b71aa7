"""TextCNN as a Keras 3 model (see textcnn/__init__.py)."""

from __future__ import annotations

import keras

from native_textcnn import DROPOUT, EMBEDDING_SIZE, FILTERS, WIDTHS


class TextCNN(keras.Model):
    def __init__(self, vocab_size: int, num_labels: int, **kwargs):
        super().__init__(**kwargs)
        self.embedding = keras.layers.Embedding(vocab_size, EMBEDDING_SIZE)
        self.convolutions = [keras.layers.Conv1D(FILTERS, width, padding="same", activation="relu")
                             for width in WIDTHS]
        self.dropout = keras.layers.Dropout(DROPOUT)
        self.classifier = keras.layers.Dense(num_labels)

    def call(self, input_ids, token_type_ids, attention_mask, training=False):
        tokens = self.embedding(input_ids)  # [B, L, E]
        real = keras.ops.cast(attention_mask, tokens.dtype)[:, :, None]
        # ReLU outputs are >= 0, so zeroing padded positions leaves the maximum over real ones unchanged.
        pooled = [keras.ops.max(conv(tokens) * real, axis=1) for conv in self.convolutions]
        return self.classifier(self.dropout(keras.ops.concatenate(pooled, axis=-1), training=training))

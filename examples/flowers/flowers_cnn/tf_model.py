"""FlowersCNN as a Keras model (see flowers_cnn/__init__.py). Batch norm as torch's BatchNorm2d computes it
(momentum 0.1 there is 0.9 here, epsilon 1e-5), so the three frameworks train the same network."""

from __future__ import annotations

import keras

from flowers_cnn import CHANNELS, DROPOUT


class FlowersCNN(keras.Model):
    def __init__(self, num_labels: int, image_shape: tuple[int, int, int], **kwargs):
        super().__init__(**kwargs)
        self.convolutions = [keras.layers.Conv2D(width, 3, padding="same", use_bias=False) for width in CHANNELS]
        self.norms = [keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5) for _ in CHANNELS]
        self.pool = keras.layers.MaxPooling2D(2)
        self.dropout = keras.layers.Dropout(DROPOUT)
        self.classifier = keras.layers.Dense(num_labels)

    def call(self, images, training=False):
        x = images  # [B, H, W, C]
        for convolution, norm in zip(self.convolutions, self.norms, strict=True):
            x = self.pool(keras.ops.relu(norm(convolution(x), training=training)))
        pooled = keras.ops.mean(x, axis=(1, 2))
        return self.classifier(self.dropout(pooled, training=training))

"""The flowers lesson's convolutional classifier, written from scratch once per framework (`{backend}_model.py`).

Four blocks of 3x3 convolution -> batch norm -> ReLU -> 2x2 max pooling (channels CHANNELS), global average
pooling, dropout, and a dense layer to the classes. Inputs are RGB in [0, 1]: [B, 3, H, W] in torch, [B, H, W, 3]
in JAX and Keras (tpuplex's image task module scales the uint8 pixels on the device).
"""

CHANNELS = (16, 32, 64, 128)
DROPOUT = 0.3

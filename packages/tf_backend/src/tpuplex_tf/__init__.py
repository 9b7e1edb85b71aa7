"""tpuplex TensorFlow backend: TPUStrategy / MirroredStrategy / OneDeviceStrategy, XLA-compiled steps."""

"""Image classification in Keras (TensorFlow): what the model (an image family, or your own) is called with, the
loss of each image, and the SavedModel's serving endpoint."""

from __future__ import annotations

import tensorflow as tf

from tpuplex_tf import tasks as tasks_tf


def decode_and_resize(encoded: tf.Tensor, height: int, width: int) -> tf.Tensor:
    """One encoded JPEG/PNG (a string scalar) -> uint8 [height, width, 3], as `tpuplex prepare` makes it
    (`tpuplex.data.images.RESIZE_RULE`): libjpeg's accurate integer IDCT (Pillow's), the centred crop of the target
    aspect ratio, TensorFlow's antialiased bilinear resize, rounded half to even and clipped."""
    image = tf.cond(tf.io.is_jpeg(encoded),
                    lambda: tf.io.decode_jpeg(encoded, channels=3, dct_method="INTEGER_ACCURATE"),
                    lambda: tf.io.decode_image(encoded, channels=3, expand_animations=False))
    shape = tf.shape(image)
    rows, columns = shape[0], shape[1]
    crop_columns = tf.maximum(1, tf.minimum(columns, rows * width // height))
    crop_rows = tf.maximum(1, tf.minimum(rows, columns * height // width))
    top, left = (rows - crop_rows) // 2, (columns - crop_columns) // 2
    cropped = image[top : top + crop_rows, left : left + crop_columns]
    resized = tf.image.resize(cropped, (height, width), method="bilinear", antialias=True)
    return tf.cast(tf.clip_by_value(tf.round(resized), 0.0, 255.0), tf.uint8)


class Module(tasks_tf.TaskModule):
    def model_inputs(self, batch: dict[str, tf.Tensor]) -> tuple[tf.Tensor]:
        """images uint8 [B, H, W, 3] -> float32 [B, H, W, 3] in [0, 1], scaled on the device."""
        return (tf.cast(batch["images"], tf.float32) / 255.0,)


    def unit_losses(self, outputs: tf.Tensor, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        """Cross-entropy per image [B] from logits [B, classes]."""
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.cast(batch["labels"], tf.int32),
                                                              logits=tf.cast(outputs, tf.float32))


    def predict_outputs(self, outputs: tf.Tensor, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        """Logits float32 [B, classes]."""
        return tf.cast(outputs, tf.float32)

    def serving(self, model, data) -> tasks_tf.Serving:
        """`serving_default` of an image run's SavedModel: `images`, a string [batch] of encoded JPEG/PNG files ->
        `classes` int32 [batch] (the best class), `probabilities` float32 [batch, classes] and `class_names` string
        [batch], decoded and resized as `tpuplex prepare` does (`decode_and_resize`)."""
        height, width, _ = data.image_shape
        names = tf.constant(list(data.classes))

        def serve(images: tf.Tensor) -> dict[str, tf.Tensor]:
            pixels = tf.map_fn(lambda encoded: decode_and_resize(encoded, height, width), images,
                               fn_output_signature=tf.TensorSpec([height, width, 3], tf.uint8))
            logits = tf.cast(model(*self.model_inputs({"images": pixels})), tf.float32)
            classes = tf.argmax(logits, axis=-1, output_type=tf.int32)
            return {"classes": classes, "probabilities": tf.nn.softmax(logits, axis=-1),
                    "class_names": tf.gather(names, classes)}

        return tasks_tf.Serving({"serving_default": (serve, [tf.TensorSpec([None], tf.string, name="images")])})

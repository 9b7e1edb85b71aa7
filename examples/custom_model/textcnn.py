"""Kim (2014)'s convolutional sentence classifier, written once over tpuplex's op table: the same class, and the
same initial weights, on the jax, tf and torch backends (docs/own-model.md).

(input_ids, token_type_ids, attention_mask) int [B, L] -> token embeddings [B, L, E] -> for each width w, a
"same" 1-D convolution with `FILTERS` outputs and ReLU -> the maximum over real (unpadded) positions ->
concatenation [B, FILTERS * len(WIDTHS)] -> dropout -> linear -> logits float32 [B, num_labels].
"""

from __future__ import annotations

from tpuplex import nn

EMBEDDING_SIZE = 128
FILTERS = 100
WIDTHS = (3, 5, 7)
DROPOUT = 0.5


class TextCNN(nn.Network):
    def __init__(self, vocab_size: int, num_labels: int):
        self.vocab_size, self.num_labels = vocab_size, num_labels

    def params(self) -> dict[str, nn.Param]:
        """Keras' default initialisers: embeddings U(+-0.05), kernels Glorot-uniform, biases zero."""
        declared = {"embedding.weight": nn.Param((self.vocab_size, EMBEDDING_SIZE), nn.uniform(0.05))}
        for index, width in enumerate(WIDTHS):
            declared[f"convolutions.{index}.weight"] = nn.Param((FILTERS, EMBEDDING_SIZE, width), nn.glorot_uniform())
            declared[f"convolutions.{index}.bias"] = nn.Param((FILTERS,), nn.zeros())
        declared["classifier.weight"] = nn.Param((self.num_labels, FILTERS * len(WIDTHS)), nn.glorot_uniform())
        declared["classifier.bias"] = nn.Param((self.num_labels,), nn.zeros())
        return declared

    def __call__(self, ops, params, input_ids, token_type_ids, attention_mask):
        tokens = ops.embed(params["embedding.weight"], input_ids)  # [B, L, E]
        real = attention_mask[:, :, None] > 0
        # ReLU outputs are >= 0, so zeroing padded positions leaves the maximum over real ones unchanged.
        pooled = [ops.max(ops.where(real, ops.activation("relu", ops.conv1d(
            tokens, params[f"convolutions.{index}.weight"], params[f"convolutions.{index}.bias"])), 0.0), (1,))
            for index in range(len(WIDTHS))]
        features = ops.dropout(ops.concat(pooled, -1), DROPOUT, site=0)
        return ops.linear(features, params["classifier.weight"], params["classifier.bias"])

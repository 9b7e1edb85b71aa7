"""A network written once over the op table (`tpuplex.nn`), unlike the example's TextCNN: token embeddings, a
LayerNorm'd GELU feed-forward block with a residual, attention pooling over the real tokens (a learned query's
softmax), then a linear classifier; dropout at two sites. The tests name it `written_once:AttentionPool`."""

from __future__ import annotations

from tpuplex import nn

WIDTH = 64
HIDDEN = 256
"""Wide enough that the feed-forward weights ([256, 64]) split over `fsdp` (`tpuplex.sharding.MIN_SHARDED_ELEMENTS`)."""
DROPOUT = 0.1


class AttentionPool(nn.Network):
    def __init__(self, vocab_size: int, num_labels: int):
        self.vocab_size, self.num_labels = vocab_size, num_labels

    def params(self) -> dict[str, nn.Param]:
        return {
            "embedding.weight": nn.Param((self.vocab_size, WIDTH), nn.normal(0.5)),
            "block.norm.weight": nn.Param((WIDTH,), nn.ones()),
            "block.norm.bias": nn.Param((WIDTH,), nn.zeros()),
            "block.up.weight": nn.Param((HIDDEN, WIDTH), nn.glorot_uniform()),
            "block.up.bias": nn.Param((HIDDEN,), nn.zeros()),
            "block.down.weight": nn.Param((WIDTH, HIDDEN), nn.glorot_uniform()),
            "block.down.bias": nn.Param((WIDTH,), nn.zeros()),
            "pool.query": nn.Param((WIDTH,), nn.normal(0.2)),
            "classifier.weight": nn.Param((self.num_labels, WIDTH), nn.fan_in_uniform()),
            "classifier.bias": nn.Param((self.num_labels,), nn.constant(0.1)),
        }

    def __call__(self, ops, params, input_ids, token_type_ids, attention_mask):
        tokens = ops.embed(params["embedding.weight"], input_ids)                                # [B, L, W]
        normed = ops.layer_norm(tokens, params["block.norm.weight"], params["block.norm.bias"], 1e-5)
        hidden = ops.activation("gelu", ops.linear(normed, params["block.up.weight"], params["block.up.bias"]))
        tokens = tokens + ops.dropout(ops.linear(hidden, params["block.down.weight"], params["block.down.bias"]),
                                      DROPOUT, site=0)
        scores = ops.einsum("blw,w->bl", tokens, params["pool.query"])                          # [B, L]
        weights = ops.softmax(ops.where(attention_mask > 0, scores, -1e9))
        pooled = ops.sum(tokens * weights[:, :, None], (1,))                                    # [B, W]
        return ops.linear(ops.dropout(pooled, DROPOUT, site=1), params["classifier.weight"],
                          params["classifier.bias"])

"""A text encoder written once: the forward pass of every BERT-like family (`tpuplex.models.FAMILIES`: BERT,
RoBERTa, DistilBERT, ELECTRA, ALBERT) over the operations each framework gives (`tpuplex.models.ops.Ops`), so the
three backends run one function on one set of parameters:

    embeddings   word [+ token type] + position (from `position_offset`) -> LayerNorm -> dropout
                 [-> projection E->H: ELECTRA's and ALBERT's factorised embeddings]
    blocks       post-LayerNorm, in `block_schedule` order (ALBERT applies its shared blocks again):
                 x = norm(x + dropout(attention(x)));  x = norm(x + dropout(output(act(intermediate(x)))))
                 attention over the keys `attention_mask` keeps (rows right-padded, as tpuplex's batches are)

The task's head (`tpuplex.tasks.base.Head.forward`, one per task, written over the same table) takes the hidden
states. Parameters have the canonical names of `tpuplex.models.encoder_architecture.canonical_shapes`
(`block.3.query.weight`) in the portable layout (a Linear [out, in]), which a `Family` maps to its HF names; a
framework module holds them under those names and calls `forward`.

Dropout sites (the stateless TensorFlow table draws one mask per site): 0 after the embeddings, then
`DROPOUT_SITES` per applied layer (the attention probabilities, the attention's output, the feed-forward output);
a head's own sites are negative.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from tpuplex.models.encoder_architecture import Architecture
from tpuplex.models.ops import Ops

DROPOUT_SITES = 3
"""Dropout sites per applied layer, after the embeddings' site 0."""


def forward(ops: Ops, p: Mapping[str, Any], arch: Architecture, input_ids: Any, token_type_ids: Any,
            attention_mask: Any, layer: Callable[..., Any] | None = None) -> Any:
    """The hidden states [B, L, hidden] of input_ids, token_type_ids, attention_mask int [B, L] (1 on real tokens,
    0 on the right padding; token types read only where the family feeds them, `Architecture.token_types`).

    p: canonical name -> parameter (the framework's tensors, portable layout). layer(index, x, attention_mask,
    site) -> x: how a framework runs parameter block `index` (torch calls it as a module, so FSDP2 gathers its
    weights first); `block` over `p` by default.
    """
    length = ops.shape(input_ids)[1]
    x = ops.embed(p["embeddings.word.weight"], input_ids)
    if arch.token_types:
        x = x + ops.embed(p["embeddings.token_type.weight"], token_type_ids)
    elif arch.type_vocab_size:  # RoBERTa adds type 0 everywhere, as HF's default token_type_ids do
        x = x + ops.cast_like(p["embeddings.token_type.weight"][0], x)
    x = x + ops.embed(p["embeddings.position.weight"], ops.arange(length)[None, :] + arch.position_offset)
    x = ops.layer_norm(x, p["embeddings.norm.weight"], p["embeddings.norm.bias"], arch.layer_norm_eps)
    x = ops.dropout(x, arch.embedding_dropout, 0)
    if arch.embedding_projection:
        x = ops.linear(x, p["embeddings.projection.weight"], p["embeddings.projection.bias"])
    run = layer or (lambda index, *args: block(ops, p, arch, index, *args))
    for applied, index in enumerate(arch.block_schedule):
        x = run(index, x, attention_mask, 1 + DROPOUT_SITES * applied)
    return x


def block(ops: Ops, p: Mapping[str, Any], arch: Architecture, index: int, x: Any, attention_mask: Any,
          site: int) -> Any:
    """Parameter block `index` applied once, its dropout sites from `site`: x [B, L, hidden] -> [B, L, hidden]."""
    rows, length = ops.shape(x)[:2]
    hidden, heads = arch.hidden_size, arch.num_heads
    size = hidden // heads
    name = f"block.{index}"

    def linear(module: str, h: Any) -> Any:
        return ops.linear(h, p[f"{name}.{module}.weight"], p[f"{name}.{module}.bias"])

    query, key, value = (ops.reshape(linear(part, x), (rows, length, heads, size))
                         for part in ("query", "key", "value"))
    context = ops.padded_attention(query, key, value, attention_mask, 1 / math.sqrt(size), arch.attention_dropout,
                                   site)
    attended = linear("attention_output", ops.reshape(context, (rows, length, hidden)))
    x = norm(ops, p, arch, f"{name}.attention_norm", x + ops.dropout(attended, arch.attention_output_dropout,
                                                                      site + 1))
    out = linear("output", ops.activation(arch.hidden_act, linear("intermediate", x)))
    return norm(ops, p, arch, f"{name}.output_norm", x + ops.dropout(out, arch.ffn_output_dropout, site + 2))


def norm(ops: Ops, p: Mapping[str, Any], arch: Architecture, module: str, x: Any) -> Any:
    return ops.layer_norm(x, p[f"{module}.weight"], p[f"{module}.bias"], arch.layer_norm_eps)

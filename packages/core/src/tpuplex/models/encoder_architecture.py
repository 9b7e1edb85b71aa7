"""An encoder's architecture in one framework-free form, shared by every family and backend.

Every supported family is the same network up to names and a few switches:

    embeddings   word [+ position (offset)] [+ token type] -> LayerNorm -> dropout [-> projection E->H]
    blocks       post-LayerNorm transformer blocks, applied in `block_schedule` order (ALBERT reuses blocks)

The head on top belongs to the task (`tpuplex.tasks`): a classifier, a masked-LM head, ...
Parameters have *canonical* names (`embeddings.word.weight`, `block.3.query.bias`, `head.out.weight`, ...) in torch
layout (Linear weights are [out, in]); a `Family` maps them to the HF names its checkpoints use. The forward pass is
written once (`tpuplex.models.encoder`), over canonical names; a backend holds the parameters under the HF names
the family gives and never spells one itself.
"""

from __future__ import annotations

import dataclasses

from tpuplex import flops, initializers
from tpuplex.slices import SliceReader

BLOCK_MODULES = ("query", "key", "value", "attention_output", "attention_norm", "intermediate", "output",
                 "output_norm")
"""The modules of one transformer block, in canonical names (`block.<b>.<module>`)."""


@dataclasses.dataclass(frozen=True)
class Architecture:
    """Sizes and switches of one encoder, read from an HF `config.json` by its `Family`.

    type_vocab_size: rows of the token type table (0: the family has none).
    token_types: whether the batch's token_type_ids are fed; False uses type 0 everywhere (RoBERTa) or, without a
        table, nothing (DistilBERT).
    position_offset: added to 0..L-1 to get position ids (RoBERTa: padding_idx + 1).
    embedding_projection: a Linear embedding_size -> hidden_size after the embeddings (ELECTRA, ALBERT).
    block_schedule: the parameter block each applied layer uses; BERT (0, 1, ..., n-1), ALBERT shares them.
    blocks_per_group: ALBERT's inner_group_num (the HF names of block b are group b // k, layer b % k); else 1.
    *_dropout: rates where each family applies dropout (0 where it applies none).
    """

    family: str
    vocab_size: int
    embedding_size: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    max_positions: int
    type_vocab_size: int
    token_types: bool
    position_offset: int
    layer_norm_eps: float
    hidden_act: str
    embedding_projection: bool
    block_schedule: tuple[int, ...]
    blocks_per_group: int
    embedding_dropout: float
    attention_dropout: float
    attention_output_dropout: float
    ffn_output_dropout: float
    initializer_range: float

    @property
    def num_blocks(self) -> int:
        """Distinct parameter blocks (fewer than applied layers when blocks are shared)."""
        return max(self.block_schedule) + 1

    @property
    def max_length(self) -> int:
        """The longest sequence the position table covers."""
        return self.max_positions - self.position_offset

    def forward_flops(self, rows: int, length: int) -> float:
        """Forward FLOPs of the encoder over [rows, length] tokens (`tpuplex.flops`): the embedding projection and
        every applied layer (a shared ALBERT block counts each time it is applied)."""
        layer = flops.encoder_layer_flops(rows, length, self.hidden_size, self.intermediate_size)
        projection = 2.0 * rows * length * self.embedding_size * self.hidden_size if self.embedding_projection else 0.0
        return projection + len(self.block_schedule) * layer

    def without_dropout(self) -> Architecture:
        """The same network with every dropout rate 0."""
        return dataclasses.replace(self, embedding_dropout=0.0, attention_dropout=0.0, attention_output_dropout=0.0,
                                   ffn_output_dropout=0.0)


def canonical_shapes(arch: Architecture) -> dict[str, tuple[int, ...]]:
    """Every encoder parameter's canonical name and torch-layout shape, in a fixed order (embeddings, blocks)."""
    embed, hidden, inner = arch.embedding_size, arch.hidden_size, arch.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.word.weight": (arch.vocab_size, embed),
        "embeddings.position.weight": (arch.max_positions, embed),
    }
    if arch.type_vocab_size:
        shapes["embeddings.token_type.weight"] = (arch.type_vocab_size, embed)
    shapes |= _linear("embeddings.norm", embed)
    if arch.embedding_projection:
        shapes |= _linear("embeddings.projection", hidden, embed)
    block_shapes = {"query": (hidden, hidden), "key": (hidden, hidden), "value": (hidden, hidden),
                    "attention_output": (hidden, hidden), "attention_norm": (hidden,),
                    "intermediate": (inner, hidden), "output": (hidden, inner), "output_norm": (hidden,)}
    for block in range(arch.num_blocks):
        for module in BLOCK_MODULES:
            shapes |= _linear(f"block.{block}.{module}", *block_shapes[module])
    return shapes


def initial_params(arch: Architecture, seed: int) -> dict[str, SliceReader]:
    """Every encoder parameter as HF's `_init_weights` draws a BERT-style encoder: Linear weights and embeddings
    from N(0, initializer_range), biases 0, norms 1."""
    return initializers.drawn_as_hf(canonical_shapes(arch), seed, lambda module: arch.initializer_range)


def _linear(module: str, out: int, into: int | None = None) -> dict[str, tuple[int, ...]]:
    """A Linear's weight [out, into] and bias [out]; a LayerNorm's weight and bias [out] when `into` is None."""
    return {f"{module}.weight": (out,) if into is None else (out, into), f"{module}.bias": (out,)}

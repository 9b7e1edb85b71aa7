"""Each family's masked-LM head (`AutoModelForMaskedLM`), under its HF names, and its forward pass written once
over `tpuplex.models.ops.Ops` (`MaskedLMHead.forward`):

    dense H->E -> activation -> LayerNorm(E) -> decoder E->V tied to the word embeddings, + bias[V]

on the masked positions only (E the embedding size: the hidden size for BERT, RoBERTa and DistilBERT). The
decoder's weight is the word embedding table itself, as in HF: one parameter in the portable checkpoint and in the
optimizer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tpuplex.models import Architecture, Family
from tpuplex.models.ops import Ops
from tpuplex.tasks.base import Head


@dataclasses.dataclass(frozen=True)
class MaskedLMHead(Head):
    """activation: after the dense layer (HF's spelling); embedding_size, vocab_size: the decoder's [V, E];
    layer_norm_eps: the head's LayerNorm."""

    activation: str = "gelu"
    embedding_size: int = 0
    vocab_size: int = 0
    layer_norm_eps: float = 1e-12

    def forward(self, ops: Ops, p: Mapping[str, Any], hidden: Any, masked_positions: Any = None) -> Any:
        """Logits float32 [B, P, V] of hidden [B, L, H] at `masked_positions` int [B, P] (every position without
        them)."""
        if masked_positions is not None:
            hidden = ops.take(hidden, masked_positions)
        x = ops.activation(self.activation, ops.linear(hidden, p["head.transform.weight"], p["head.transform.bias"]))
        x = ops.layer_norm(x, p["head.norm.weight"], p["head.norm.bias"], self.layer_norm_eps)
        return ops.float32(ops.linear(x, p["embeddings.word.weight"], p["head.bias"]))


@dataclasses.dataclass(frozen=True)
class _FamilyHead:
    hf_classes: tuple[str, ...]
    transform: str
    norm: str
    bias: str
    activation: str | None  # None: the encoder's hidden_act


FAMILY_HEADS: dict[str, _FamilyHead] = {
    "bert": _FamilyHead(("BertForMaskedLM",), "cls.predictions.transform.dense",
                        "cls.predictions.transform.LayerNorm", "cls.predictions", None),
    "roberta": _FamilyHead(("RobertaForMaskedLM", "XLMRobertaForMaskedLM"), "lm_head.dense", "lm_head.layer_norm",
                           "lm_head", "gelu"),
    "distilbert": _FamilyHead(("DistilBertForMaskedLM",), "vocab_transform", "vocab_layer_norm", "vocab_projector",
                              None),
    "electra": _FamilyHead(("ElectraForMaskedLM",), "generator_predictions.dense", "generator_predictions.LayerNorm",
                           "generator_lm_head", "gelu"),
    "albert": _FamilyHead(("AlbertForMaskedLM",), "predictions.dense", "predictions.LayerNorm", "predictions", None),
}


def masked_lm_head(family: Family, arch: Architecture) -> MaskedLMHead:
    """`family`'s masked-LM head (every text family has one); transform, norm and bias are drawn when the
    checkpoint lacks them."""
    found = FAMILY_HEADS[family.name]
    embed, hidden = arch.embedding_size, arch.hidden_size
    return MaskedLMHead(
        modules={"head.transform": found.transform, "head.norm": found.norm, "head": found.bias},
        shapes={"head.transform.weight": (embed, hidden), "head.transform.bias": (embed,),
                "head.norm.weight": (embed,), "head.norm.bias": (embed,), "head.bias": (arch.vocab_size,)},
        drawn=(("head.transform", "linear"), ("head.norm", "norm"), ("head", "bias")),
        tied={"head.decoder.weight": "embeddings.word.weight"},
        activation=found.activation or arch.hidden_act, embedding_size=embed, vocab_size=arch.vocab_size,
        layer_norm_eps=arch.layer_norm_eps)

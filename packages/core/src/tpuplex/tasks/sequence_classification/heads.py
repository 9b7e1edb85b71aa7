"""Each family's classifier head (`AutoModelForSequenceClassification`), under its HF names, and its forward pass
written once over `tpuplex.models.ops.Ops` (`ClassifierHead.forward`):

    [dropout] -> dense H->H -> activation -> dropout -> out H->num_labels, on the first token

BERT and ALBERT use their pooler as the dense layer; RoBERTa and ELECTRA have no pooler and put dropout before
the dense layer too; DistilBERT's is `pre_classifier` with ReLU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from tpuplex.models import Architecture, Family
from tpuplex.models.config_reader import ConfigReader
from tpuplex.models.ops import Ops
from tpuplex.tasks.base import Head


@dataclasses.dataclass(frozen=True)
class ClassifierHead(Head):
    """num_labels: outputs (1: regression); activation: after the dense layer (HF's spelling); dropout_first:
    dropout before the dense layer too; dropout: the rate at each dropout site."""

    num_labels: int = 2
    activation: str = "tanh"
    dropout_first: bool = False
    dropout: float = 0.1

    def without_dropout(self) -> ClassifierHead:
        return dataclasses.replace(self, dropout=0.0)

    def forward(self, ops: Ops, p: Mapping[str, Any], hidden: Any) -> Any:
        """Logits float32 [B, num_labels] of the first token of hidden [B, L, H]."""
        first = hidden[:, 0]
        if self.dropout_first:
            first = ops.dropout(first, self.dropout, -2)
        pooled = ops.activation(self.activation, ops.linear(first, p["head.dense.weight"], p["head.dense.bias"]))
        pooled = ops.dropout(pooled, self.dropout, -1)
        return ops.float32(ops.linear(pooled, p["head.out.weight"], p["head.out.bias"]))


def hidden_dropout(config: ConfigReader) -> float:
    """`classifier_dropout`, falling back to `hidden_dropout_prob` as HF's BERT-style classifiers do."""
    rate = config.get("classifier_dropout", float, None)
    return config.get("hidden_dropout_prob", float, 0.1) if rate is None else rate


@dataclasses.dataclass(frozen=True)
class _FamilyHead:
    hf_classes: tuple[str, ...]
    dense: str
    out: str
    activation: str
    dropout_first: bool
    dropout: Callable[[ConfigReader], float]


FAMILY_HEADS: dict[str, _FamilyHead] = {
    "bert": _FamilyHead(("BertForSequenceClassification",), "bert.pooler.dense", "classifier", "tanh", False,
                        hidden_dropout),
    "roberta": _FamilyHead(("RobertaForSequenceClassification", "XLMRobertaForSequenceClassification"),
                           "classifier.dense", "classifier.out_proj", "tanh", True, hidden_dropout),
    "distilbert": _FamilyHead(("DistilBertForSequenceClassification",), "pre_classifier", "classifier", "relu",
                              False, lambda config: config.get("seq_classif_dropout", float, 0.2)),
    "electra": _FamilyHead(("ElectraForSequenceClassification",), "classifier.dense", "classifier.out_proj", "gelu",
                           True, hidden_dropout),
    "albert": _FamilyHead(("AlbertForSequenceClassification",), "albert.pooler", "classifier", "tanh", False,
                          lambda config: config.get("classifier_dropout_prob", float, 0.1)),
}


def classifier_head(family: Family | None, arch: Architecture | None, hf_config: Mapping[str, Any],
                    num_labels: int) -> ClassifierHead:
    """`family`'s classifier for `num_labels` outputs; `head.dense` then `head.out` are drawn when missing. A
    user model (`family` None) has its own head: only `num_labels` is said."""
    if family is None:
        return ClassifierHead(modules={}, shapes={}, drawn=(), num_labels=num_labels)
    found = FAMILY_HEADS[family.name]
    hidden = arch.hidden_size
    return ClassifierHead(
        modules={"head.dense": found.dense, "head.out": found.out},
        shapes={"head.dense.weight": (hidden, hidden), "head.dense.bias": (hidden,),
                "head.out.weight": (num_labels, hidden), "head.out.bias": (num_labels,)},
        drawn=(("head.dense", "linear"), ("head.out", "linear")),
        num_labels=num_labels, activation=found.activation, dropout_first=found.dropout_first,
        dropout=found.dropout(ConfigReader(hf_config, "config.json")))

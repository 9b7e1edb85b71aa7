"""Each family's token classifier (`AutoModelForTokenClassification`), under its HF names, and its forward pass
written once over `tpuplex.models.ops.Ops` (`TokenClassifierHead.forward`):

    dropout -> out H->num_labels, on every position

The module is `classifier` in every family; only where the dropout rate comes from differs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from tpuplex.models import Architecture, Family
from tpuplex.models.config_reader import ConfigReader
from tpuplex.models.ops import Ops
from tpuplex.tasks.base import Head
from tpuplex.tasks.sequence_classification.heads import hidden_dropout


@dataclasses.dataclass(frozen=True)
class TokenClassifierHead(Head):
    """num_labels: tags; dropout: the rate before the classifier."""

    num_labels: int = 2
    dropout: float = 0.1

    def without_dropout(self) -> TokenClassifierHead:
        return dataclasses.replace(self, dropout=0.0)

    def forward(self, ops: Ops, p: Mapping[str, Any], hidden: Any) -> Any:
        """Logits float32 [B, L, num_labels] of hidden [B, L, H]."""
        hidden = ops.dropout(hidden, self.dropout, -1)
        return ops.float32(ops.linear(hidden, p["head.out.weight"], p["head.out.bias"]))


@dataclasses.dataclass(frozen=True)
class _FamilyHead:
    hf_classes: tuple[str, ...]
    dropout: Callable[[ConfigReader], float]


def _albert_dropout(config: ConfigReader) -> float:
    rate = config.get("classifier_dropout_prob", float, None)
    return config.get("hidden_dropout_prob", float, 0.0) if rate is None else rate


FAMILY_HEADS: dict[str, _FamilyHead] = {
    "bert": _FamilyHead(("BertForTokenClassification",), hidden_dropout),
    "roberta": _FamilyHead(("RobertaForTokenClassification", "XLMRobertaForTokenClassification"), hidden_dropout),
    "distilbert": _FamilyHead(("DistilBertForTokenClassification",),
                              lambda config: config.get("dropout", float, 0.1)),
    "electra": _FamilyHead(("ElectraForTokenClassification",), hidden_dropout),
    "albert": _FamilyHead(("AlbertForTokenClassification",), _albert_dropout),
}


def token_classifier_head(family: Family, arch: Architecture, hf_config: Mapping[str, Any],
                          num_labels: int) -> TokenClassifierHead:
    """`family`'s token classifier for `num_labels` tags; `head.out` is drawn when the checkpoint lacks it."""
    hidden = arch.hidden_size
    return TokenClassifierHead(
        modules={"head.out": "classifier"},
        shapes={"head.out.weight": (num_labels, hidden), "head.out.bias": (num_labels,)},
        drawn=(("head.out", "linear"),),
        num_labels=num_labels, dropout=FAMILY_HEADS[family.name].dropout(ConfigReader(hf_config, "config.json")))

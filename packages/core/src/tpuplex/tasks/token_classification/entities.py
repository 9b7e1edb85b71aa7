"""Entity-level scores as the CoNLL script and `seqeval`'s default mode count them.

A tag is `O` or `<prefix>-<type>` with prefix B, I (IOB2) or also E, S (IOBES). An entity is a maximal span that
starts where a chunk starts and ends where a chunk ends (the rules of conlleval, as `seqeval.metrics.
sequence_labeling.get_entities` writes them), so an ill-formed sequence (an I- with no B- before it, a type change
inside a span) still gives entities, the same ones. A predicted entity is right when its span and type equal a gold
entity's. Sentences are scored apart (no entity crosses a sentence boundary).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from tpuplex.errors import DataError

TAG = re.compile(r"^(O|[BIES]-.+)$")
_ENDS_BEFORE = {("B", "B"), ("B", "S"), ("B", "O"), ("I", "B"), ("I", "S"), ("I", "O")}
_STARTS_AFTER = {("E", "E"), ("E", "I"), ("S", "E"), ("S", "I"), ("O", "E"), ("O", "I")}


def check_scheme(tags: Sequence[str], where: str) -> None:
    """A TpuplexError unless every tag is O or B-/I-/E-/S- and a type."""
    for tag in tags:
        if not TAG.match(tag):
            raise DataError(f"{where} has the tag {tag!r}, which is in no tag scheme tpuplex scores: use IOB2 "
                            "(B-TYPE, I-TYPE, O) or IOBES (B-, I-, E-, S-, O) tags")


def entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """The entities (type, first word, last word) of one sentence's tags."""
    found = []
    previous, previous_type, begin = "O", "", 0
    for position, tag in enumerate([*tags, "O"]):
        prefix, kind = tag[0], tag[1:].split("-", maxsplit=1)[-1] or "_"
        type_changed = previous_type != kind
        if previous in "ES" or (previous, prefix) in _ENDS_BEFORE or (previous != "O" and type_changed):
            found.append((previous_type, begin, position - 1))
        if prefix in "BS" or (previous, prefix) in _STARTS_AFTER or (prefix != "O" and type_changed):
            begin = position
        previous, previous_type = prefix, kind
    return found


def scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict[str, float]:
    """precision, recall, f1 over all entities (micro), the same per gold or predicted type (`<type>/f1`...,
    with `<type>/support` the gold count), and `accuracy` over words. 0 where a denominator is 0 (as seqeval)."""
    true, guessed, right = Counter(), Counter(), Counter()
    words = correct_words = 0
    for gold_tags, predicted_tags in zip(gold, predicted, strict=True):
        gold_entities, predicted_entities = set(entities(gold_tags)), set(entities(predicted_tags))
        true.update(kind for kind, _, _ in gold_entities)
        guessed.update(kind for kind, _, _ in predicted_entities)
        right.update(kind for kind, _, _ in gold_entities & predicted_entities)
        words += len(gold_tags)
        correct_words += sum(g == p for g, p in zip(gold_tags, predicted_tags, strict=True))
    result = _precision_recall_f1(sum(right.values()), sum(guessed.values()), sum(true.values()))
    for kind in sorted(true | guessed):
        per_type = _precision_recall_f1(right[kind], guessed[kind], true[kind])
        result |= {f"{kind}/{name}": value for name, value in per_type.items()}
        result[f"{kind}/support"] = float(true[kind])
    return result | {"accuracy": correct_words / words if words else 0.0}


def _precision_recall_f1(right: int, guessed: int, true: int) -> dict[str, float]:
    precision = right / guessed if guessed else 0.0
    recall = right / true if true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}

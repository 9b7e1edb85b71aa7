"""Any value in any field of a config.json tpuplex reads, and any `generate` option, is either taken as a setting the
model can use or refused in one `TpuplexError` naming it: never another exception (the CLI's "a tpuplex bug"
line) and never a number that is accepted but meaningless (a negative size, a dropout of 1.5, an infinite epsilon).
Hypothesis draws the values; the fields are the ones each family's reader asks for."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from tpuplex import models
from tpuplex.commands.generate import check_options
from tpuplex.errors import TpuplexError
from tpuplex.models.config_reader import ConfigReader

REPO = Path(__file__).resolve().parents[2]
SIZES = {"vocab_size": 50, "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
         "intermediate_size": 16, "max_position_embeddings": 20}
CONFIGS = {
    "bert": {"model_type": "bert", **SIZES},
    "roberta": {"model_type": "roberta", **SIZES, "type_vocab_size": 1, "pad_token_id": 1},
    "electra": {"model_type": "electra", **SIZES, "embedding_size": 4},
    "distilbert": {"model_type": "distilbert", "vocab_size": 50, "dim": 8, "n_layers": 2, "n_heads": 2,
                   "hidden_dim": 16, "max_position_embeddings": 20},
    "albert": {"model_type": "albert", **SIZES, "embedding_size": 4, "num_hidden_groups": 1},
    "gpt2": json.loads((REPO / "examples" / "shakespeare_char" / "gpt-cpu" / "config.json").read_text()),
    "llama": {"model_type": "llama", **SIZES, "num_key_value_heads": 1},
    "conformer": json.loads((REPO / "examples" / "speech" / "conformer-s" / "config.json").read_text()),
}


def fields_read(config: dict) -> list[str]:
    """The config.json keys the family's reader asks for (every one it knows, given or defaulted)."""
    asked: list[str] = []
    original = ConfigReader.get

    def recording(reader, key, *args, **kwargs):
        asked.append(key)
        return original(reader, key, *args, **kwargs)

    with mock.patch.object(ConfigReader, "get", recording):
        models.architecture_of(config)
    return sorted(set(asked) - {"model_type"})


FIELDS = [(family, key) for family, config in CONFIGS.items() for key in fields_read(config)]
VALUES = st.one_of(st.integers(-2**70, 2**70), st.integers(-3, 3), st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([0.0, -0.5, 1.5, 1e-12, 1e308]), st.booleans(), st.none(), st.text(max_size=4),
                   st.lists(st.integers(0, 3), max_size=2))


def check_usable(arch: object) -> None:
    """Every number of an accepted architecture is one a model can be built from."""
    for field in dataclasses.fields(arch):
        value = getattr(arch, field.name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        assert math.isfinite(value) and value >= 0, (field.name, value)
        if "dropout" in field.name:
            assert value <= 1, (field.name, value)


@settings(max_examples=1000, deadline=None)
@given(st.sampled_from(FIELDS), VALUES)
def test_any_config_json_value_is_used_or_refused_in_one_line(field, value):
    family, key = field
    try:
        _, arch = models.architecture_of({**CONFIGS[family], key: value})
    except TpuplexError as error:
        assert "\n" not in str(error)
        return
    check_usable(arch)


@settings(max_examples=300, deadline=None)
@given(st.integers(-5, 10**6), st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 10**6),
       st.integers(-2**70, 2**70), st.lists(st.text(max_size=3), max_size=3))
def test_any_generate_option_is_used_or_refused_in_one_line(tokens, temperature, top_k, seed, prompts):
    try:
        check_options(tokens, temperature, top_k, seed, prompts)
    except TpuplexError as error:
        assert "\n" not in str(error)
        return
    assert tokens >= 1 and math.isfinite(temperature) and temperature >= 0 and top_k >= 0
    assert 0 <= seed < 2**63 and prompts and all(prompts)

"""LoRA's framework-free half (`tpuplex.models.lora`): `[model.lora]` read against a decoder, PEFT's target
matching and initialisation, the merged weights, and the one-line refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tpuplex import config as config_module
from tpuplex import models
from tpuplex.errors import TpuplexError
from tpuplex.models.lora import Lora, MergedWeight, fingerprint

LLAMA = {"model_type": "llama", "vocab_size": 40, "max_position_embeddings": 16, "hidden_size": 16,
         "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
GPT2 = {"model_type": "gpt2", "vocab_size": 40, "n_positions": 16, "n_embd": 16, "n_layer": 2, "n_head": 4}


def read(table: dict, hf_config: dict = LLAMA) -> tuple[Lora, object]:
    family, arch = models.architecture_of(hf_config)
    return Lora.read(table, family, arch), arch


def test_peft_defaults_for_llama_and_gpt2() -> None:
    """An empty field set takes PEFT's LoraConfig defaults: rank 8, alpha 8, no dropout, the family's targets."""
    lora, arch = read({"rank": 8})
    assert (lora.rank, lora.alpha, lora.dropout, lora.scale) == (8, 8.0, 0.0, 1.0)
    assert [hf for _, hf in lora.modules] == [f"model.layers.{b}.self_attn.{p}_proj" for b in (0, 1) for p in "qv"]
    assert lora.shapes(arch)["model.layers.0.self_attn.q_proj.lora_A.weight"] == (8, 16)
    assert lora.shapes(arch)["model.layers.0.self_attn.v_proj.lora_B.weight"] == (8, 8)  # 2 kv heads x 4
    gpt2, arch = read({"alpha": 16}, GPT2)
    assert [hf for _, hf in gpt2.modules] == ["transformer.h.0.attn.c_attn", "transformer.h.1.attn.c_attn"]
    assert gpt2.in_out and gpt2.shapes(arch)["transformer.h.0.attn.c_attn.lora_B.weight"] == (48, 8)


def test_targets_match_as_peft_matches_them() -> None:
    """A list matches a module's name or its last parts; a string is a regular expression over the whole name."""
    by_suffix, _ = read({"targets": ["mlp.down_proj", "1.self_attn.o_proj"]})
    assert [canonical for canonical, _ in by_suffix.modules] == ["block.0.down", "block.1.attention_output",
                                                                 "block.1.down"]
    by_pattern, _ = read({"targets": r".*\.1\.self_attn\.(q|k)_proj"})
    assert [canonical for canonical, _ in by_pattern.modules] == ["block.1.query", "block.1.key"]


def test_adapters_start_as_peft_draws_them_and_merge_exactly() -> None:
    """A ~ U(-1/sqrt(in), 1/sqrt(in)) keyed by the seed and its name, B = 0; merging folds scale * B A into each
    weight in the family's layout and drops the adapters."""
    lora, arch = read({"rank": 4, "alpha": 8, "targets": ["q_proj", "down_proj"]})
    first, again = lora.initial(arch, seed=3), lora.initial(arch, seed=3)
    assert all(np.array_equal(np.asarray(first[name]), np.asarray(again[name])) for name in first)
    a = np.asarray(first["model.layers.0.mlp.down_proj.lora_A.weight"])
    assert a.shape == (4, 24) and np.abs(a).max() <= 1 / np.sqrt(24) and a.std() > 0.5 / np.sqrt(3 * 24)
    assert not np.asarray(first["model.layers.0.mlp.down_proj.lora_B.weight"]).any()
    rng = np.random.default_rng(0)
    base = {"model.layers.0.mlp.down_proj.weight": rng.standard_normal((16, 24)).astype(np.float32)}
    adapters = {"model.layers.0.mlp.down_proj.lora_A.weight": a,
                "model.layers.0.mlp.down_proj.lora_B.weight": rng.standard_normal((16, 4)).astype(np.float32)}
    only_down = Lora(4, 8.0, 0.0, ("down_proj",), (("block.0.down", "model.layers.0.mlp.down_proj"),))
    merged = only_down.merged({**base, **adapters})
    assert list(merged) == ["model.layers.0.mlp.down_proj.weight"]
    x = rng.standard_normal((3, 24))
    expected = x @ base["model.layers.0.mlp.down_proj.weight"].T + 2.0 * (x @ a.T) @ adapters[
        "model.layers.0.mlp.down_proj.lora_B.weight"].T
    folded = np.asarray(merged["model.layers.0.mlp.down_proj.weight"])
    np.testing.assert_allclose(x @ folded.T, expected, rtol=1e-5, atol=1e-5)


def test_peft_config_names_what_peft_reads() -> None:
    lora, _ = read({"rank": 4, "alpha": 16, "dropout": 0.05, "targets": ["q_proj"]})
    written = lora.peft_config("CAUSAL_LM", "/models/base")
    assert {key: written[key] for key in ("peft_type", "r", "lora_alpha", "lora_dropout", "target_modules",
                                          "base_model_name_or_path")} == {
        "peft_type": "LORA", "r": 4, "lora_alpha": 16.0, "lora_dropout": 0.05, "target_modules": ["q_proj"],
        "base_model_name_or_path": "/models/base"}
    json.dumps(written)


@pytest.mark.parametrize(("table", "message"), [
    ({"rank": 0}, "model.lora.rank = 0 is not allowed: use an integer greater than 0"),
    ({"rank": 4.5}, "model.lora.rank = 4.5 is not allowed"),
    ({"alpha": -1}, "model.lora.alpha = -1 is not allowed: use a finite number greater than 0"),
    ({"alpha": float("inf")}, "model.lora.alpha = inf is not allowed: use a finite number greater than 0"),
    ({"alpha": float("nan")}, "model.lora.alpha = nan is not allowed"),
    ({"targets": "("}, "model.lora.targets = '(' is not a regular expression (missing ), unterminated subpattern"),
    ({"rank": 10**9}, "model.lora.rank = 1000000000 is more than 8, the smaller dimension of "
                      "model.layers.0.self_attn.v_proj: an adapter's rank can be at most its projection's min(in, "
                      "out); use a rank <= 8"),
    ({"dropout": 1.0}, "model.lora.dropout = 1.0 is not allowed: use a number in [0, 1)"),
    ({"targets": []}, "model.lora.targets = [] is not allowed: use a list of module names"),
    ({"targets": ["embed_tokens"]}, "matches none of the model's projections: use some of down_proj, gate_proj"),
    ({"ranks": 4}, "unknown config field model.lora.ranks: [model.lora] has rank, alpha, dropout, targets"),
])
def test_bad_lora_fields_are_refused_in_one_line(table: dict, message: str) -> None:
    with pytest.raises(TpuplexError) as error:
        read(table)
    assert message in str(error.value)


def test_lora_on_a_text_encoder_is_refused(tmp_path) -> None:
    """[model.lora] adapts decoders: an encoder (MiniLM) run with it is refused before any data is read."""
    from tpuplex import kinds, tasks

    config = config_module.from_dict({"model": {"lora": {"rank": 4}}})
    assert config.model.lora == {"rank": 4}
    with pytest.raises(TpuplexError, match="model.lora adapts decoder models, not a text model"):
        kinds.resolve(config, tasks.get("sequence_classification"))
    with pytest.raises(TpuplexError, match=r"model.lora = 4 is not allowed: use a table, e.g. \{rank = 8\}"):
        config_module.from_dict({"model": {"lora": 4}})


def test_the_fingerprint_sees_every_byte_name_and_shape() -> None:
    weights = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(2, np.float32)}
    same = fingerprint(weights)
    assert fingerprint(dict(reversed(list(weights.items())))) == same
    assert fingerprint({**weights, "a": weights["a"].reshape(3, 2)}) != same
    assert fingerprint({**weights, "b": weights["b"] * 2}) != same
    assert fingerprint({"c": weights["a"], "b": weights["b"]}) != same


@pytest.mark.parametrize("in_out", [False, True], ids=["out_in", "in_out"])
def test_a_merged_weight_is_read_a_block_at_a_time(in_out) -> None:
    """W + scale * B A (transposed for an [in, out] weight), any block equal to that block of the whole sum."""
    rng = np.random.default_rng(1)
    out, into, rank = 12, 20, 4
    weight = rng.standard_normal((into, out) if in_out else (out, into)).astype(np.float32)
    a, b = rng.standard_normal((rank, into)).astype(np.float32), rng.standard_normal((out, rank)).astype(np.float32)
    merged = MergedWeight(weight, a, b, 0.5, in_out)
    delta = 0.5 * (b.astype(np.float64) @ a.astype(np.float64))
    whole = (weight + (delta.T if in_out else delta)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(merged), whole)
    np.testing.assert_array_equal(merged[3:7, 5:11], whole[3:7, 5:11])

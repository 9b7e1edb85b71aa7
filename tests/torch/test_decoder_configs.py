"""A decoder checkpoint's config.json, LM head and weights read as transformers 5 reads them: each family's defaults
are its transformers config class's, removing any one key from a saved config.json gives transformers' numbers or
a one-line refusal, the rope table of a config with both `rope_parameters` and the legacy `rope_scaling` is the one
transformers reads, a tied head with a distinct `lm_head.weight` is untied as transformers unties it, a missing
untied head and a NaN in the weights are refused in one line (exit 2 from the CLI)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import transformers
from decoder_checks import CONFIGS
from helpers import backend as torch_backend
from rope_checks import checkpoint_spec, reference, reference_losses, rows

import torch
from tpuplex import models
from tpuplex.commands import cli
from tpuplex.errors import TpuplexError
from tpuplex.models import gemma2, gpt2, llama, mistral, phi3, qwen2
from tpuplex.protocol import OptimizerSpec


@pytest.fixture(scope="module")
def backend():
    return torch_backend()


DEFAULTS = {"llama": (llama.DEFAULTS, transformers.LlamaConfig), "qwen2": (qwen2.DEFAULTS, transformers.Qwen2Config),
            "mistral": (mistral.DEFAULTS, transformers.MistralConfig),
            "gemma2": (gemma2.DEFAULTS, transformers.Gemma2Config), "phi3": (phi3.DEFAULTS, transformers.Phi3Config),
            "gpt2": (gpt2.DEFAULTS, transformers.GPT2Config)}


@pytest.mark.parametrize("family", DEFAULTS)
def test_each_family_s_defaults_are_its_transformers_config_class_s(family: str) -> None:
    defaults, config_class = DEFAULTS[family]
    declared = {field.name: field.default for field in dataclasses.fields(config_class)}
    assert {key: declared[key] for key in defaults} == defaults


NON_DEFAULT = {
    "llama": {"rms_norm_eps": 1e-3, "attention_bias": True, "mlp_bias": True, "head_dim": 12, "hidden_act": "gelu",
              "max_position_embeddings": 64, "tie_word_embeddings": True,
              "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100.0}},
    "qwen2": {"rms_norm_eps": 1e-3, "use_sliding_window": True, "sliding_window": 5, "max_window_layers": 1,
              "max_position_embeddings": 64, "hidden_act": "gelu_new",
              "rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 100.0}},
    "mistral": {"rms_norm_eps": 1e-3, "sliding_window": 6, "head_dim": 12, "max_position_embeddings": 16,
                "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 100.0,
                                    "original_max_position_embeddings": 8}},
    "gemma2": {"rms_norm_eps": 1e-3, "head_dim": 12, "query_pre_attn_scalar": 16, "sliding_window": 5,
               "attn_logit_softcapping": 0.5, "final_logit_softcapping": 2.0, "hidden_activation": "gelu",
               "attention_bias": True, "max_position_embeddings": 64,
               "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8,
                                   "rope_theta": 100.0}},
    "phi3": {"rms_norm_eps": 1e-3, "sliding_window": 7, "partial_rotary_factor": 0.5, "max_position_embeddings": 64,
             "original_max_position_embeddings": 8,
             "rope_parameters": {"rope_type": "longrope", "short_factor": [1.0, 2.0], "long_factor": [3.0, 5.0],
                                 "rope_theta": 100.0}},
    "gpt2": {"n_inner": 40, "activation_function": "relu", "layer_norm_epsilon": 1e-3, "tie_word_embeddings": False,
             "n_positions": 64},
}
"""Each family's tiny checkpoint with every key it reads away from its default where that shows in 20 positions."""


def saved(folder: Path, family: str) -> Path:
    """The family's tiny `*ForCausalLM`, drawn by transformers with NON_DEFAULT (noise on top, so each key shows in
    the losses) and saved."""
    settings = {key: value for key, value in CONFIGS[family].items() if key != "model_type"} | NON_DEFAULT[family]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(family, **settings))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    model.save_pretrained(folder)
    return folder


TOKEN_IDS = {"pad_token_id", "bos_token_id", "eos_token_id"}
"""Keys that do not change the network, which the walk leaves (transformers' own default pad_token_id for Phi-3,
32000, lies outside the tiny vocabulary, which its embedding refuses)."""


def tpuplex_losses(backend, folder: Path, batch) -> np.ndarray:
    return backend.predict(backend.init(checkpoint_spec(folder), OptimizerSpec()), batch)[..., 0]


@pytest.mark.parametrize("family", NON_DEFAULT)
def test_a_config_json_missing_any_key_reads_as_transformers_reads_it(backend, tmp_path: Path, family: str) -> None:
    """Each key of a saved config.json removed in turn: tpuplex gives transformers' per-token losses (1e-4) over 20
    positions (past every original length above), or, where transformers cannot build or load the model either,
    refuses in one line."""
    folder = saved(tmp_path / "model", family)
    whole = json.loads((folder / "config.json").read_text())
    batch = rows(20)
    np.testing.assert_allclose(tpuplex_losses(backend, folder, batch), reference_losses(reference(folder), batch),
                               atol=1e-4, rtol=0)
    outcomes = {}
    for key in set(whole) - TOKEN_IDS:
        (folder / "config.json").write_text(json.dumps({k: v for k, v in whole.items() if k != key}))
        try:
            expected = reference_losses(reference(folder), batch)
        except Exception:  # noqa: BLE001 - transformers cannot build or load it: tpuplex must refuse
            expected = None
        try:
            found = tpuplex_losses(backend, folder, batch)
        except TpuplexError as error:
            assert "\n" not in str(error), key
            outcomes[key] = "refused"
            continue
        assert expected is not None, f"without {key}: transformers cannot load the checkpoint, tpuplex did"
        np.testing.assert_allclose(found, expected, atol=1e-4, rtol=0, err_msg=f"without {key}")
        outcomes[key] = "same"
    assert set(NON_DEFAULT[family]) <= outcomes.keys()  # every key set away from its default was walked


def test_a_qwen2_config_with_rope_parameters_and_a_legacy_rope_scaling_reads_the_legacy_table(backend,
                                                                                            tmp_path: Path) -> None:
    """transformers 5 reads `rope_scaling` over `rope_parameters` when both are set, and the rope_theta of
    `rope_parameters` with it is lost (10,000, or a top-level rope_theta): tpuplex reads the same table."""
    folder = saved(tmp_path, "qwen2")
    config = json.loads((folder / "config.json").read_text())
    config |= {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
               "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}}
    (folder / "config.json").write_text(json.dumps(config))
    rope = checkpoint_spec(folder).arch.rope
    assert (rope.kind, rope.theta, rope.factor) == ("yarn", 10_000.0, 4.0)
    batch = rows(20)
    np.testing.assert_allclose(tpuplex_losses(backend, folder, batch), reference_losses(reference(folder), batch),
                               atol=1e-4, rtol=0)


@pytest.mark.parametrize(("family", "table", "refusal"), [
    ("phi3", {"rope_type": "linear", "factor": 2.0}, "not one Phi-3 takes"),
    ("llama", {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8}, "lacks low_freq_factor"),
    ("llama", {"rope_type": "ntk-by-parts", "factor": 2.0}, "is not supported"),
    ("llama", {"rope_type": "longrope", "short_factor": [1.0] * 3, "long_factor": [2.0] * 3},
     "must be 4 positive numbers"),
])
def test_a_rope_table_transformers_cannot_build_is_refused_in_one_line(tmp_path: Path, family, table,
                                                                       refusal) -> None:
    config = {**CONFIGS[family], "rope_parameters": table}
    with pytest.raises(TpuplexError, match=refusal) as error:
        models.architecture_of(config)
    assert "\n" not in str(error.value)
    settings = {key: value for key, value in config.items() if key != "model_type"}
    with pytest.raises(Exception):  # noqa: B017, PT011 - transformers refuses too, each in its own words
        transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(family, **settings))(
            input_ids=torch.zeros((1, 4), dtype=torch.long))


def test_a_tied_config_with_a_distinct_head_is_untied_as_transformers_unties_it(backend, tmp_path: Path) -> None:
    """`tie_word_embeddings = true` over weights with an `lm_head.weight` of their own: transformers 5 does not tie
    them and reads that head; so does tpuplex (the run's config.json then says false)."""
    folder = saved(tmp_path, "gpt2")  # untied: model.safetensors holds lm_head.weight
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    spec = checkpoint_spec(folder)
    assert not spec.arch.tied and spec.hf_config["tie_word_embeddings"] is False
    batch = rows(12)
    np.testing.assert_allclose(tpuplex_losses(backend, folder, batch), reference_losses(reference(folder), batch),
                               atol=1e-4, rtol=0)


def test_an_untied_head_the_weights_lack_is_refused_in_one_line(tmp_path: Path) -> None:
    """`tie_word_embeddings = false` and a causal LM's weights without `lm_head.weight`: one line naming it, not a
    head drawn at random."""
    folder = saved(tmp_path, "llama")
    config = json.loads((folder / "config.json").read_text())  # saved tied: no lm_head.weight in the weights
    (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    with pytest.raises(TpuplexError, match="lack lm_head.weight, the LM head that config.json's") as error:
        checkpoint_spec(folder)
    assert "\n" not in str(error.value)


def test_a_nan_in_the_weights_is_refused_at_load_naming_the_tensor(tmp_path: Path, capsys) -> None:
    """A NaN in `model.norm.weight`: `tpuplex train` stops with exit 2 before any step, its one line naming the
    tensor and the file."""
    model = transformers.LlamaForCausalLM(transformers.AutoConfig.for_model(
        **{**CONFIGS["llama"], "vocab_size": 65}))
    with torch.no_grad():
        model.model.norm.weight[3] = float("nan")
    model.save_pretrained(tmp_path / "model")
    (tmp_path / "input.txt").write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 40)
    (tmp_path / "config.toml").write_text(
        '[task]\nname = "causal_lm"\ntokenizer = "characters"\n'
        f'[model]\ncheckpoint = {json.dumps(str(tmp_path / "model"))}\n'
        f'[data]\ndataset = "citizen"\ntrain_file = {json.dumps(str(tmp_path / "input.txt"))}\nmax_length = 16\n'
        '[train]\nmax_steps = 2\nglobal_batch = 2\n'
        f'[runtime]\noutput_dir = {json.dumps(str(tmp_path / "run"))}\n')
    assert cli.main(["train", str(tmp_path / "config.toml"), "--backend", "torch"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert any("model.norm.weight in" in line and "holds NaN or infinite values" in line for line in error), error
    assert not (tmp_path / "run" / "results.json").exists()

"""The family descriptions, framework-free: names, shapes, head initialisation, config errors, the CLI's line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tpuplex import initializers, models
from tpuplex.checkpoints import read_hf_config
from tpuplex.commands import cli
from tpuplex.data.tokenize import load_tokenizer
from tpuplex.errors import TpuplexError
from tpuplex.kinds.text import expected_shapes, initial_params
from tpuplex.testing.specs import classifier

SIZES = {"vocab_size": 50, "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
         "intermediate_size": 16, "max_position_embeddings": 20}
CONFIGS = {
    "bert": {"model_type": "bert", **SIZES},
    "roberta": {"model_type": "roberta", **SIZES, "type_vocab_size": 1, "pad_token_id": 1},
    "xlm-roberta": {"model_type": "xlm-roberta", **SIZES, "type_vocab_size": 1, "pad_token_id": 1},
    "distilbert": {"model_type": "distilbert", "vocab_size": 50, "dim": 8, "n_layers": 2, "n_heads": 2,
                   "hidden_dim": 16, "max_position_embeddings": 20},
    "electra": {"model_type": "electra", **SIZES, "embedding_size": 4},
    "albert": {"model_type": "albert", **SIZES, "num_hidden_layers": 4, "embedding_size": 4,
               "num_hidden_groups": 2, "inner_group_num": 2},
}
# A few HF names per family, as transformers' *ForSequenceClassification spells them.
HF_NAMES = {
    "bert": ["bert.encoder.layer.1.attention.self.query.weight", "bert.pooler.dense.weight", "classifier.bias"],
    "roberta": ["roberta.embeddings.token_type_embeddings.weight", "classifier.dense.weight",
                "classifier.out_proj.bias"],
    "xlm-roberta": ["roberta.encoder.layer.0.output.LayerNorm.weight", "classifier.out_proj.weight"],
    "distilbert": ["distilbert.transformer.layer.1.attention.q_lin.weight",
                   "distilbert.transformer.layer.0.ffn.lin2.bias",
                   "distilbert.transformer.layer.0.sa_layer_norm.weight", "pre_classifier.weight", "classifier.weight"],
    "electra": ["electra.embeddings_project.weight", "electra.encoder.layer.1.intermediate.dense.bias",
                "classifier.dense.weight", "classifier.out_proj.weight"],
    "albert": ["albert.encoder.embedding_hidden_mapping_in.weight",
               "albert.encoder.albert_layer_groups.1.albert_layers.1.ffn_output.weight",
               "albert.encoder.albert_layer_groups.0.albert_layers.0.full_layer_layer_norm.bias",
               "albert.pooler.weight", "classifier.weight"],
}
ABSENT = {"roberta": "roberta.pooler.dense.weight",
          "distilbert": "distilbert.embeddings.token_type_embeddings.weight",
          "electra": "electra.pooler.dense.weight",
          "albert": "albert.encoder.albert_layer_groups.2.albert_layers.0.ffn.weight"}


@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_hf_names_are_the_family_s(model_type):
    shapes = expected_shapes(CONFIGS[model_type], classifier(CONFIGS[model_type], 3))
    assert set(HF_NAMES[model_type]) <= set(shapes)
    assert ABSENT.get(model_type) not in shapes
    assert len(set(shapes)) == len(shapes)


def test_family_quirks():
    family, roberta = models.architecture_of(CONFIGS["roberta"])
    assert family.name == "roberta" and roberta.position_offset == 2 and roberta.max_length == 18
    assert not roberta.token_types and classifier(CONFIGS["roberta"], 2).dropout_first
    distil = models.architecture_of(CONFIGS["distilbert"])[1]
    assert distil.type_vocab_size == 0 and classifier(CONFIGS["distilbert"], 2).activation == "relu"
    assert distil.attention_output_dropout == 0
    electra = models.architecture_of(CONFIGS["electra"])[1]
    assert electra.embedding_projection and classifier(CONFIGS["electra"], 2).activation == "gelu"
    albert = models.architecture_of(CONFIGS["albert"])[1]
    assert albert.block_schedule == (0, 1, 0, 1, 2, 3, 2, 3) and albert.num_blocks == 4
    assert albert.hidden_act == "gelu_new" and albert.ffn_output_dropout == 0
    shapes = expected_shapes(CONFIGS["albert"], classifier(CONFIGS["albert"], 2))
    assert shapes["albert.embeddings.word_embeddings.weight"] == (50, 4)
    assert shapes["albert.encoder.embedding_hidden_mapping_in.weight"] == (8, 4)


def write_base_checkpoint(folder, model_type, extra=None):
    """config.json and model.safetensors with base-model names (no prefix), no head, plus `extra` tensors."""
    config = CONFIGS[model_type]
    family, head = models.family_of(config), classifier(config, 1)
    rng = np.random.default_rng(0)
    weights = {name.removeprefix(f"{family.prefix}."): rng.standard_normal(shape).astype(np.float32)
               for name, shape in expected_shapes(config, head).items()
               if not name.startswith(("classifier", "pre_classifier"))
               and name not in (head.hf_name("head.dense.weight"), head.hf_name("head.dense.bias"))}
    folder.mkdir(parents=True, exist_ok=True)
    save_file({**weights, **(extra or {})}, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_initial_params_add_the_prefix_drop_pretraining_heads_and_draw_the_head(tmp_path, model_type):
    folder = write_base_checkpoint(tmp_path, model_type, extra={"lm_head.bias": np.zeros(50, np.float32),
                                                                 "embeddings.position_ids": np.zeros(20, np.float32)})
    params = initial_params(folder, read_hf_config(folder), classifier(CONFIGS[model_type], 3), seed=5)
    shapes = expected_shapes(CONFIGS[model_type], classifier(CONFIGS[model_type], 3))
    assert {name: array.shape for name, array in params.items()} == shapes
    head = classifier(CONFIGS[model_type], 3)
    dense, out = (head.hf_name(f"head.{m}.weight") for m in ("dense", "out"))
    for name in (dense, out):  # each drawn from N(0, 0.02^2) keyed by the seed and its name
        np.testing.assert_array_equal(np.asarray(params[name]), np.asarray(initializers.normal(5, name, shapes[name],
                                                                                               0.02)))
    assert not np.asarray(params[head.hf_name("head.out.bias")]).any()


@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_a_folder_with_config_json_alone_draws_the_encoder_as_hf_does(tmp_path, model_type):
    (tmp_path / "config.json").write_text(json.dumps(CONFIGS[model_type]))
    head = classifier(CONFIGS[model_type], 3)
    params = initial_params(tmp_path, CONFIGS[model_type], head, seed=5)
    assert {name: array.shape for name, array in params.items()} == expected_shapes(CONFIGS[model_type], head)
    family, arch = models.architecture_of(CONFIGS[model_type])
    query, norm, bias = (np.asarray(params[family.hf_name(name, arch)]) for name in
                         ("block.0.query.weight", "block.0.output_norm.weight", "block.0.query.bias"))
    assert abs(query.std() - 0.02) < 0.005 and (norm == 1).all() and not bias.any()
    again = initial_params(tmp_path, CONFIGS[model_type], head, seed=5)
    assert all(np.array_equal(np.asarray(params[name]), np.asarray(again[name])) for name in params)


def test_a_missing_encoder_weight_is_named(tmp_path):
    folder = write_base_checkpoint(tmp_path, "roberta")
    weights = load_file(folder / "model.safetensors")
    del weights["encoder.layer.1.attention.self.key.weight"]
    save_file(weights, folder / "model.safetensors")
    with pytest.raises(TpuplexError, match=r"missing: roberta\.encoder\.layer\.1\.attention\.self\.key\.weight"):
        initial_params(folder, read_hf_config(folder), classifier(read_hf_config(folder), 2), 0)


@pytest.mark.parametrize(("config", "fragment"), [
    ({**CONFIGS["bert"], "model_type": "bart"}, "model_type 'bart' in"),
    ({k: v for k, v in CONFIGS["bert"].items() if k != "hidden_size"}, "lacks 'hidden_size'"),
    ({**CONFIGS["bert"], "hidden_size": 9}, "not divisible by 2 attention heads"),
    ({**CONFIGS["bert"], "hidden_act": "swish"}, "hidden_act = 'swish'"),
    ({**CONFIGS["bert"], "num_hidden_layers": "six"}, "num_hidden_layers = 'six'"),
    ({**CONFIGS["bert"], "position_embedding_type": "relative_key"}, "absolute position embeddings"),
    ({**CONFIGS["distilbert"], "sinusoidal_pos_embds": True}, "sinusoidal_pos_embds"),
])
def test_bad_config_json_is_one_clear_error(tmp_path, config, fragment):
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(TpuplexError, match=fragment):
        read_hf_config(tmp_path)


def test_an_unsupported_model_type_is_one_line_naming_the_supported(write_config, tiny_model, tmp_path, capsys):
    model = tmp_path / "bart"
    model.mkdir()
    for name in ("model.safetensors", "tokenizer.json", "vocab.txt"):
        if (tiny_model / name).exists():
            (model / name).write_bytes((tiny_model / name).read_bytes())
    (model / "config.json").write_text(json.dumps({**CONFIGS["bert"], "model_type": "bart"}))
    code = cli.main(["train", str(write_config(model__checkpoint=str(model))), "--backend", "numpy"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "model_type 'bart'" in err and "bert, roberta, xlm-roberta, distilbert, electra, albert" in err
    assert not (tmp_path / "run").exists()


def copy_model(source, target, **config_changes):
    target.mkdir()
    for path in source.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    config = json.loads((source / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, **config_changes}))
    return target


def test_a_tokenizer_larger_than_the_embedding_table_is_one_line(write_config, tiny_model, tmp_path, capsys):
    model = copy_model(tiny_model, tmp_path / "small-vocab", vocab_size=20)
    weights = load_file(model / "model.safetensors")
    weights["embeddings.word_embeddings.weight"] = weights["embeddings.word_embeddings.weight"][:20]
    save_file(weights, model / "model.safetensors")
    assert cli.main(["train", str(write_config(model__checkpoint=str(model))), "--backend", "numpy"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "but the model has 20 word embeddings" in err
    assert not (tmp_path / "run").exists()


def test_a_folder_with_only_a_slow_tokenizer_says_how_to_convert(tmp_path):
    (tmp_path / "vocab.json").write_text("{}")
    (tmp_path / "merges.txt").write_text("")
    with pytest.raises(TpuplexError, match=r"only a slow tokenizer \(vocab.json, merges.txt\).*save_pretrained"):
        load_tokenizer(tmp_path, 16)


def a_list_model(vocab_size: int, num_labels: int) -> list[int]:
    return [vocab_size, num_labels]


def test_a_user_model_of_another_framework_is_named() -> None:
    from tpuplex.models import user

    arguments = {"vocab_size": 10, "num_labels": 2}
    assert user.build(f"{__name__}:a_list_model", "numpy", arguments, list, "list") == [10, 2]
    with pytest.raises(TpuplexError, match=rf"model.architecture = '{__name__}:a_list_model' built a list, not a "
                                           r"torch.nn.Module: the torch backend trains torch.nn.Module models"):
        user.build(f"{__name__}:a_list_model", "torch", arguments, dict, "torch.nn.Module")
    image_call = r"could not be built as a_list_model\(num_labels=2, image_shape=\(8, 8, 3\)\)"
    with pytest.raises(TpuplexError, match=image_call):
        user.build(f"{__name__}:a_list_model", "numpy", {"num_labels": 2, "image_shape": (8, 8, 3)}, list, "list")

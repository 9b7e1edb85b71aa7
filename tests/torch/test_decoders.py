"""GPT-2 and Llama on the torch backend, at a small size (the shared tests are tests/common/decoder_checks.py's),
and what only the torch session can check: checkpoints transformers saved, a non-decoder's refusal to generate,
and a causal-LM run killed and resumed."""

import csv
import json

import numpy as np
import pytest
import transformers
from chat_data import conversation, write_jsonl, write_tokenizer
from decoder_checks import (  # noqa: F401  (collected here)
    CONFIGS,
    decoder_spec,
    pretrained_spec,
    smollm2,
    test_a_chat_batch_s_answer_targets_alone_give_the_whole_forward_s_losses,
    test_generation_matches_transformers,
    test_logits_match_transformers,
    test_lora_training_follows_torch,
    test_smollm2_converted_weights_are_transformers_gguf_load,
    test_smollm2_from_its_gguf_matches_transformers_gguf_load,
    test_smollm2_tokenizer_matches_transformers_gguf_load,
    test_training_follows_torch,
    token_batch,
)
from gguf_files import BYTE_TEXTS, LLAMA3, SENTENCEPIECE, SENTENCEPIECE_TEXT, byte_vocabulary, gguf_of_model
from helpers import backend as torch_backend
from helpers import tiny_spec
from kill_campaign import run_campaign

import torch
import tpuplex
from tpuplex import models
from tpuplex.checkpoints import resolve_checkpoint
from tpuplex.commands import cli
from tpuplex.data.corpus import prepare_corpus
from tpuplex.errors import TpuplexError
from tpuplex.kinds.decoder import initial_decoder_params
from tpuplex.models import gguf
from tpuplex.protocol import OptimizerSpec, Prompts
from tpuplex.tasks.causal_lm import TASK


@pytest.fixture(scope="module")
def backend():
    return torch_backend()


def hf_config(model_type):
    settings = dict(CONFIGS[model_type])
    return transformers.AutoConfig.for_model(settings.pop("model_type"), **settings)


def test_a_saved_causal_lm_is_read_as_it_is(tmp_path):
    model = transformers.GPT2LMHeadModel(hf_config("gpt2"))
    model.save_pretrained(tmp_path)
    family, arch = models.architecture_of(CONFIGS["gpt2"])
    params = initial_decoder_params(tmp_path, family, arch, seed=0)
    state = {name: tensor.numpy() for name, tensor in model.state_dict().items() if name != "lm_head.weight"}
    assert params.keys() == state.keys()
    assert all(np.array_equal(params[name], state[name]) for name in state)


def test_a_base_model_gets_its_prefix_and_a_drawn_lm_head(tmp_path):
    base = transformers.LlamaModel(hf_config("llama"))
    base.save_pretrained(tmp_path)
    family, arch = models.architecture_of(CONFIGS["llama"])
    params = initial_decoder_params(tmp_path, family, arch, seed=0)
    assert params.keys() == family.hf_shapes(arch).keys()
    np.testing.assert_array_equal(params["model.norm.weight"], base.state_dict()["norm.weight"].numpy())
    assert np.asarray(params["lm_head.weight"]).std() > 0


@pytest.mark.parametrize("model_type", ["gpt2", "llama"])
def test_training_attends_without_a_mask_and_padded_prompts_with_one(backend, tmp_path, monkeypatch, model_type):
    """A training batch of causal-LM rows has no padding that a real token sees (padding sits after every real
    token), so each attention call gets no mask and `is_causal`: on a GPU, the flash and cuDNN kernels' unmasked
    path. Left-padded prompts get the [B, 1, T, S] mask that hides their padding."""
    calls = []
    attend = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append((kwargs["attn_mask"], kwargs["is_causal"]))
        return attend(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    spec = decoder_spec(tmp_path, model_type)
    state = backend.init(spec, OptimizerSpec())
    backend.train_step(state, token_batch(rows=4, length=8), 1e-3)
    layers = spec.arch.num_layers
    assert [(given is None, causal) for given, causal in calls] == [(True, True)] * layers
    calls.clear()
    prompt_mask = np.array([[0, 0, 1, 1], [1, 1, 1, 1]], np.int32)
    backend.generate(state, Prompts(np.where(prompt_mask, 5, 0).astype(np.int32), prompt_mask, 1, 0.0, 0,
                                    np.zeros((2, 1), np.float32)))
    assert [(None if given is None else tuple(given.shape), causal) for given, causal in calls] == [
        ((2, 1, 4, 5), False)] * layers


def test_a_text_encoder_refuses_to_generate(tmp_path):
    backend = torch_backend()
    state = backend.init(tiny_spec(tmp_path), OptimizerSpec())
    prompts = Prompts(np.ones((1, 4), np.int32), np.ones((1, 4), np.int32), 2, 0.0, 0, np.zeros((1, 2), np.float32))
    with pytest.raises(TpuplexError, match="generates no text: tpuplex generate needs a decoder"):
        backend.generate(state, prompts)


def test_a_causal_lm_run_killed_twice_resumes_bit_for_bit(shared_text, tmp_path):
    """nanoGPT's sampling (random windows drawn from (seed, step)) and dropout on: a kill inside a checkpoint write
    and one at a step after a checkpoint, then resumed, end as the uninterrupted run."""
    text = (shared_text / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")[:5000]
    (tmp_path / "input.txt").write_text(text, encoding="utf-8")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({**CONFIGS["gpt2"], "vocab_size": 65}))
    (tmp_path / "config.toml").write_text(
        '[task]\nname = "causal_lm"\ntokenizer = "characters"\nsampling = "random_windows"\n'
        f'[model]\ncheckpoint = {json.dumps(str(tmp_path / "model"))}\n'
        f'[data]\ndataset = "shakespeare"\ntrain_file = {json.dumps(str(tmp_path / "input.txt"))}\nmax_length = 16\n'
        '[train]\nlearning_rate = 3e-3\nmax_steps = 8\nglobal_batch = 4\n'
        '[runtime]\ncheckpoint_every = 1\nkeep_checkpoints = 2\neval_every = 4\n')
    killed, whole = tmp_path / "killed", tmp_path / "whole"

    def argv(output_dir):
        return ["train", str(tmp_path / "config.toml"), "--backend", "torch",
                "--set", f"runtime.output_dir={json.dumps(str(output_dir))}"]

    landed = run_campaign(argv(killed), killed, argv(whole), whole, "tpuplex_torch.backend:TorchBackend",
                          kills=2, startup_seconds=4.0)
    assert landed[0] == "write" and landed[1].startswith("step-")


def test_a_prepared_causal_corpus_trains_as_the_text_in_memory(shared_text, tmp_path):
    """`tpuplex prepare --task causal_lm` (in several units and worker processes), then trained on: the losses and
    validation metrics of the same documents in a .csv table read in memory, bit for bit (each document followed by
    the tokenizer's end-of-text)."""
    from tokenizers import ByteLevelBPETokenizer

    lines = (shared_text / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8").split("\n\n")[:300]
    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(lines, vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False)
    (tmp_path / "model").mkdir()
    tokenizer.save(str(tmp_path / "model" / "tokenizer.json"))
    (tmp_path / "model" / "config.json").write_text(json.dumps({**CONFIGS["gpt2"], "vocab_size": 300}))
    for name, documents in (("train", lines[:250]), ("held-out", lines[250:])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in documents))
        with (tmp_path / f"{name}.csv").open("w", newline="") as handle:
            csv.writer(handle).writerows([["text"], *([d] for d in documents)])
    report = prepare_corpus(str(tmp_path / "train.jsonl"), tmp_path / "train-prepared",
                            TASK.corpus_encoder(tmp_path / "model"), 16, workers=2, unit_bytes=5_000)
    assert report.units > 4 and report.workers == 2
    assert cli.main(["prepare", str(tmp_path / "held-out.jsonl"), "--out", str(tmp_path / "held-out-prepared"),
                     "--task", "causal_lm", "--tokenizer", str(tmp_path / "model"), "--max-length", "16"]) == 0
    results = {}
    for form, train, held_out in (("csv", "train.csv", "held-out.csv"),
                                  ("prepared", "train-prepared", "held-out-prepared")):
        (tmp_path / f"{form}.toml").write_text(
            f'[task]\nname = "causal_lm"\n[model]\ncheckpoint = {json.dumps(str(tmp_path / "model"))}\n'
            f'[data]\ndataset = "shakespeare"\nmax_length = 16\ntrain_file = {json.dumps(str(tmp_path / train))}\n'
            f'eval_files = [{json.dumps(str(tmp_path / held_out))}]\n'
            '[train]\nlearning_rate = 3e-3\nmax_steps = 6\nglobal_batch = 4\n'
            f'[runtime]\noutput_dir = {json.dumps(str(tmp_path / form))}\nlog_every = 1\n')
        assert cli.main(["train", str(tmp_path / f"{form}.toml"), "--backend", "torch"]) == 0
        results[form] = json.loads((tmp_path / form / "results.json").read_text())
    assert results["prepared"]["losses"] == results["csv"]["losses"]
    assert list(results["prepared"]["metrics"].values()) == list(results["csv"]["metrics"].values())


def test_a_llama_learns_the_answers_of_conversations(tmp_path, capsys):
    """`tpuplex train` on a .jsonl of conversations (rendered by the tokenizer's chat template, one row each, the
    loss on the answers alone): a tiny Llama from scratch learns to answer "Say W." with W, its held-out answers'
    loss falling far below the 5.55 of a uniform guess over the 258 tokens, most of them answered exactly (all 8
    when measured: `answer_accuracy`, the share greedy decoding answers token for token); `generate --chat` answers
    as the held-out evaluation does."""
    words = ["apple", "river", "stone", "cloud", "tiger", "piano", "lemon", "glass"]
    records = [conversation(f"Say {word}.", word) for word in words * 8]
    write_jsonl(tmp_path / "chat.jsonl", records)
    model = write_tokenizer(tmp_path / "model")
    (model / "config.json").write_text(json.dumps({**CONFIGS["llama"], "vocab_size": 258,
                                                   "max_position_embeddings": 128}))
    (tmp_path / "config.toml").write_text(
        '[task]\nname = "causal_lm"\nvalidation_fraction = 0.125\n'
        f'[model]\ncheckpoint = {json.dumps(str(model))}\ndropout = false\n'
        f'[data]\ndataset = "say"\ntrain_file = {json.dumps(str(tmp_path / "chat.jsonl"))}\nmax_length = 96\n'
        '[train]\nlearning_rate = 1e-2\nepochs = 12\nglobal_batch = 8\nwarmup_ratio = 0.05\n'
        f'[runtime]\noutput_dir = {json.dumps(str(tmp_path / "run"))}\n')
    assert cli.main(["train", str(tmp_path / "config.toml"), "--backend", "torch"]) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    held_out = results["metrics"]["validation"]
    assert held_out["loss"] < 1.0 and held_out["answer_accuracy"] >= 0.5, held_out
    # `generate --chat`: the messages in the chat template, each answer up to the end-of-turn token.
    capsys.readouterr()
    assert cli.main(["generate", str(tmp_path / "run"), "--backend", "torch", "--chat", "--tokens", "12",
                     "--prompt", "Say apple.", "--prompt", "Say tiger."]) == 0
    assert capsys.readouterr().out.splitlines() == ["apple", "tiger"]


def test_chat_prompts_take_a_system_message_and_what_the_model_can_take(tmp_path, capsys):
    """A run trained one step at data.max_length = 48 answers --chat prompts over half of it (a system message
    adds 22 tokens here, as SmolLM2's template adds its own) in a wider window, up to half the model's 128
    positions; one over those is refused in one line, and so is --system without --chat."""
    write_jsonl(tmp_path / "chat.jsonl", [conversation(f"Say {word}.", word) for word in ["apple", "river"] * 4])
    model = write_tokenizer(tmp_path / "model")
    (model / "config.json").write_text(json.dumps({**CONFIGS["llama"], "vocab_size": 258,
                                                   "max_position_embeddings": 128}))
    (tmp_path / "config.toml").write_text(
        '[task]\nname = "causal_lm"\nvalidation_fraction = 0.25\n'
        f'[model]\ncheckpoint = {json.dumps(str(model))}\n'
        f'[data]\ndataset = "say"\ntrain_file = {json.dumps(str(tmp_path / "chat.jsonl"))}\nmax_length = 48\n'
        '[train]\nmax_steps = 1\nglobal_batch = 2\n'
        f'[runtime]\noutput_dir = {json.dumps(str(tmp_path / "run"))}\n')
    assert cli.main(["train", str(tmp_path / "config.toml"), "--backend", "torch"]) == 0
    run = tpuplex.Run.open(tmp_path / "run")
    system = "Be a parrot."
    assert isinstance(run.generate("Say apple.", tokens=4, chat=True, system=system), str)  # 51 tokens > 24
    capsys.readouterr()
    assert cli.main(["generate", str(tmp_path / "run"), "--chat", "--system", system * 4, "--tokens", "2",
                     "--prompt", "Say apple."]) == 2
    assert ("a --chat prompt is 87 tokens in the chat template, more than half the 128 positions the model takes"
            in capsys.readouterr().err)
    with pytest.raises(TpuplexError, match="a system message .* is a chat's: add --chat"):
        run.generate("Say apple.", system=system)


_GGUF_SIZE = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 64, "initializer_range": 0.5}
GGUF_MODELS = {
    "gpt2": ("gpt2", byte_vocabulary("gpt-2"), {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 1024,
                                                "initializer_range": 0.5}),
    "llama3": ("llama", LLAMA3, {**_GGUF_SIZE, "rope_theta": 500000.0, "tie_word_embeddings": False}),
    "qwen2": ("qwen2", byte_vocabulary("qwen2"), {**_GGUF_SIZE, "tie_word_embeddings": False}),
    "mistral": ("mistral", SENTENCEPIECE, {**_GGUF_SIZE, "head_dim": 12}),
    "mistral-nemo": ("mistral", byte_vocabulary("tekken"), {**_GGUF_SIZE, "head_dim": 12}),
    "gemma2": ("gemma2", SENTENCEPIECE, {**_GGUF_SIZE, "head_dim": 256, "query_pre_attn_scalar": 256,
                                         "sliding_window": 5}),
    "phi3": ("phi3", SENTENCEPIECE, _GGUF_SIZE),
}
"""A model of each family as llama.cpp's files have them, drawn by transformers at initializer_range 0.5 (logits
of ~10, so that a row order or an offset undone wrongly shows): GPT-2 (its own pre-tokenizer; n_positions 1024, the
only one transformers' GGUF load builds), Llama 3 (its BPE vocabulary, pre-tokenizer and BOS; rope theta 500000, an
untied head), Qwen2 (biases, its pre-tokenizer), Mistral (a "llama" file with a SentencePiece vocabulary and a head
size not hidden / heads; Mistral Nemo's with its byte-level Tekken vocabulary), Gemma 2 (norms stored as
1 + weight, tied, a window the rows exceed; head_dim 256 and query_pre_attn_scalar 256, which transformers' GGUF
load assumes and tpuplex reads as llama.cpp does, from the head size) and Phi-3 (fused projections, its own
word-start rule)."""


@pytest.mark.parametrize("name", GGUF_MODELS)
def test_a_gguf_reads_as_transformers_reads_it(backend, name, tmp_path, monkeypatch) -> None:
    """A GGUF file written from a model transformers drew, read by tpuplex, is what transformers' own GGUF load
    (`from_pretrained(folder, gguf_file=...)`) makes of it: the same class and every tensor bit for bit, the same
    token ids for texts that tell the pre-tokenizers, special tokens and byte fallbacks apart, and on the backend
    per-token losses within 1e-4 of the cross-entropy of its logits, the same predicted tokens."""
    model_type, vocabulary, settings = GGUF_MODELS[name]
    monkeypatch.setenv(gguf.CACHE_ENV, str(tmp_path / "cache"))
    config = transformers.AutoConfig.for_model(model_type, vocab_size=len(vocabulary.tokens), **settings,
                                               bos_token_id=vocabulary.bos, eos_token_id=vocabulary.eos,
                                               pad_token_id=vocabulary.pad)
    torch.manual_seed(0)
    gguf_of_model(tmp_path / "model.gguf", transformers.AutoModelForCausalLM.from_config(config), vocabulary)
    folder = resolve_checkpoint(str(tmp_path / "model.gguf"))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="model.gguf",
                                                               dtype=torch.float32).eval()
    converted = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
    assert type(theirs).__name__ == json.loads((folder / "config.json").read_text())["architectures"][0]
    assert converted.keys() == theirs.state_dict().keys()
    for weight, tensor in theirs.state_dict().items():
        torch.testing.assert_close(converted[weight], tensor, rtol=0, atol=0, msg=weight)

    texts = BYTE_TEXTS if vocabulary.model == "gpt2" else [SENTENCEPIECE_TEXT, " ab", "  hi", "abc"]
    ours, expected = (transformers.AutoTokenizer.from_pretrained(folder),
                      transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="model.gguf"))
    assert [ours(text)["input_ids"] for text in texts] == [expected(text)["input_ids"] for text in texts]

    ids = np.random.default_rng(0).integers(0, len(vocabulary.tokens), (4, 17)).astype(np.int32)
    batch = {"input_ids": ids[:, :-1], "labels": ids[:, 1:], "weight": np.ones((4, 16), np.float32)}
    with torch.no_grad():
        logits = theirs(input_ids=torch.from_numpy(batch["input_ids"]).long()).logits
    losses = torch.nn.functional.cross_entropy(logits.flatten(0, 1), torch.from_numpy(batch["labels"]).long()
                                               .flatten(), reduction="none").reshape(batch["labels"].shape)
    outputs = backend.predict(backend.init(pretrained_spec(folder), OptimizerSpec()), batch)
    np.testing.assert_allclose(outputs[..., 0], losses.numpy(), atol=1e-4, rtol=0)
    np.testing.assert_array_equal(outputs[..., 1], (logits.argmax(-1).numpy() == batch["labels"]).astype(np.float32))


def test_a_llama_3_1_gguf_rotates_by_its_llama3_rope(backend, tmp_path, monkeypatch) -> None:
    """A Llama 3.1-style file keeps its llama3 rope table only as llama.cpp's per-frequency factors (`rope_freqs`):
    tpuplex reads the table back, so the converted model is the drawn one (transformers' own GGUF load drops the
    factors, 0.34 off in logits here: not the reference), its per-token losses within 1e-4 on the backend."""
    monkeypatch.setenv(gguf.CACHE_ENV, str(tmp_path / "cache"))
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}  # head_dim 8: every band of it
    config = transformers.LlamaConfig(vocab_size=len(LLAMA3.tokens), **{**_GGUF_SIZE, "rope_parameters": rope},
                                      bos_token_id=LLAMA3.bos, eos_token_id=LLAMA3.eos)
    torch.manual_seed(0)
    drawn = transformers.AutoModelForCausalLM.from_config(config).eval()
    folder = resolve_checkpoint(str(gguf_of_model(tmp_path / "model.gguf", drawn, LLAMA3)))
    assert json.loads((folder / "config.json").read_text())["rope_scaling"] == {
        key: value for key, value in rope.items() if key != "rope_theta"}
    ids = np.random.default_rng(0).integers(0, len(LLAMA3.tokens), (4, 17)).astype(np.int32)
    batch = {"input_ids": ids[:, :-1], "labels": ids[:, 1:], "weight": np.ones((4, 16), np.float32)}
    with torch.no_grad():
        logits = drawn(input_ids=torch.from_numpy(batch["input_ids"]).long()).logits
    losses = torch.nn.functional.cross_entropy(logits.flatten(0, 1), torch.from_numpy(batch["labels"]).long()
                                               .flatten(), reduction="none").reshape(batch["labels"].shape)
    outputs = backend.predict(backend.init(pretrained_spec(folder), OptimizerSpec()), batch)
    np.testing.assert_allclose(outputs[..., 0], losses.numpy(), atol=1e-4, rtol=0)

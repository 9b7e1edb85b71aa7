"""Eager training: equality with a hand-written torch loop, gradient accumulation, exact evaluation, exact resume
in a fresh process, and clear errors for bad input."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch.nn.functional as F
from helpers import assert_params_close, backend, encoded, learning_rates, model_spec, run, tiny_spec, train_batches
from transformers import BertConfig, BertForSequenceClassification

import torch
from tpuplex.config import RuntimeConfig
from tpuplex.data.batching import Batcher
from tpuplex.engine import checkpoint, schedule
from tpuplex.errors import TpuplexError
from tpuplex.protocol import OptimizerSpec, PortableState, decays
from tpuplex_torch.backend import TorchBackend


def hand_written_loop(spec, batches, rates, optimizer: OptimizerSpec) -> dict[str, np.ndarray]:
    """Plain PyTorch: HF model, torch.optim.AdamW with a decay/no-decay split, clip by global norm (no 1e-6)."""
    config = BertConfig(**spec.hf_config, num_labels=spec.num_labels)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    model = BertForSequenceClassification(config)
    model.load_state_dict({name: torch.from_numpy(np.asarray(a)) for name, a in spec.params.items()}, strict=True)
    model.train()
    named = list(model.named_parameters())
    adamw = torch.optim.AdamW(
        [{"params": [p for n, p in named if decays(n)], "weight_decay": optimizer.weight_decay},
         {"params": [p for n, p in named if not decays(n)], "weight_decay": 0.0}],
        lr=0.0, betas=(optimizer.beta1, optimizer.beta2), eps=optimizer.epsilon)
    for batch, rate in zip(batches, rates, strict=True):
        logits = model(**{k: torch.from_numpy(batch[k]).long()
                          for k in ("input_ids", "token_type_ids", "attention_mask")}).logits
        F.cross_entropy(logits, torch.from_numpy(batch["labels"]).long()).backward()
        norm = torch.sqrt(sum((p.grad ** 2).sum() for _, p in named))
        for _, p in named:
            p.grad.mul_(min(1.0, optimizer.clip_norm / norm.item()))
        for group in adamw.param_groups:
            group["lr"] = rate
        adamw.step()
        adamw.zero_grad()
    return {name: p.detach().numpy() for name, p in named}


def test_minilm_steps_equal_a_hand_written_torch_loop(minilm_dir):
    spec = model_spec(minilm_dir)
    batches = [{k: v[:, :32] if v.ndim == 2 else v for k, v in b.items()}
               for b in train_batches(8, 3, seed=1)]
    for b in batches:
        b["input_ids"] = (b["input_ids"] * 97) % 30000  # spread the ids over the real vocabulary
    rates = [schedule.warmup_linear_decay(step, peak=5e-4, warmup=1, total=4) for step in range(3)]
    optimizer = OptimizerSpec(clip_norm=0.5)  # small enough that clipping happens
    state, _ = run(torch_backend := backend(), spec, batches, rates, optimizer)
    expected = hand_written_loop(spec, batches, rates, optimizer)
    assert_params_close(torch_backend.state_to_arrays(state), PortableState(expected, {}, {}, 3), atol=1e-5)
    assert torch_backend.state_to_arrays(state).step == 3


def test_gradient_accumulation_equals_the_whole_batch(tmp_path):
    spec = tiny_spec(tmp_path)
    batches, rates = train_batches(8, 3), learning_rates(3)
    whole, _ = run(torch_backend := backend(), spec, batches, rates)
    split, _ = run(torch_backend, spec, batches, rates, OptimizerSpec(grad_accum=4))
    assert_params_close(torch_backend.state_to_arrays(whole), torch_backend.state_to_arrays(split), atol=1e-6)


def test_gradient_accumulation_with_gradients_copied_out_of_graph_memory_equals_the_whole_batch(tmp_path):
    """Under CUDA graphs the first micro-batch's gradients are copied out of the graph's output memory and the
    others add into the copies; the arithmetic is the same as without the copy (the replay itself needs a GPU)."""
    spec = tiny_spec(tmp_path)
    batches, rates = train_batches(8, 3), learning_rates(3)
    whole, _ = run(torch_backend := backend(), spec, batches, rates)
    torch_backend.placement.replays_graphs = True
    split, _ = run(torch_backend, spec, batches, rates, OptimizerSpec(grad_accum=4))
    assert_params_close(torch_backend.state_to_arrays(whole), torch_backend.state_to_arrays(split), atol=1e-6)


def test_a_program_run_without_its_cuda_graph_is_said_once(tmp_path, capsys):
    """torch.compile falls back from a CUDA graph silently (it counts the fallback; TORCH_LOGS=cudagraphs says
    why): under torch_mode "cuda_graphs" the next step says so, once. Counted here as torch.compile counts it."""
    from torch._dynamo.utils import counters

    torch_backend = backend()
    torch_backend.placement.replays_graphs = True
    state = torch_backend.init(tiny_spec(tmp_path), OptimizerSpec())
    batches, rates = train_batches(8, 3), learning_rates(3)
    torch_backend.train_steps(state, batches[:1], rates[:1])
    assert capsys.readouterr().err == ""
    counters["inductor"]["cudagraph_skips"] += 1
    torch_backend.train_steps(state, batches[1:], rates[1:])
    assert capsys.readouterr().err == (
        'tpuplex: warning: runtime.torch_mode = "cuda_graphs", but torch.compile runs at least 1 of this run\'s '
        'compiled programs without a CUDA graph (as "compile"); TORCH_LOGS=cudagraphs says why\n')


def test_evaluation_of_a_ragged_split_counts_every_example_once(tmp_path):
    spec, data = tiny_spec(tmp_path), encoded(23, seed=5)
    torch_backend = backend()
    state = torch_backend.init(spec, OptimizerSpec())
    gathered, seen = np.zeros((len(data), 2), np.float32), np.zeros(len(data), int)
    for evaluation in Batcher(data, 8, 1, (8,)).eval_batches():
        logits = torch_backend.predict(state, evaluation.batch)
        real = evaluation.index >= 0
        gathered[evaluation.index[real]] = logits[real]
        seen[evaluation.index[real]] += 1
    assert np.all(seen == 1)
    unpadded = {"input_ids": data.input_ids, "token_type_ids": data.token_type_ids,
                "attention_mask": (np.arange(data.max_length)[None] < data.lengths[:, None]).astype(np.int32),
                "labels": data.labels}
    np.testing.assert_allclose(gathered, torch_backend.predict(state, unpadded), atol=1e-5, rtol=0)


RESUME = textwrap.dedent("""
    import sys
    from helpers import backend, learning_rates, tiny_spec, train_batches
    from tpuplex.engine import checkpoint
    from tpuplex.protocol import OptimizerSpec

    checkpoint_dir, model_dir, out, dropout = sys.argv[1:5]
    portable, trainer = checkpoint.load(checkpoint_dir)
    torch_backend = backend()
    spec = tiny_spec(model_dir, dropout=dropout == "1")
    state = torch_backend.state_from_arrays(torch_backend.init(spec, OptimizerSpec()), portable)
    start = trainer["position"]
    state, _ = torch_backend.train_steps(state, train_batches(8, 4)[start:], learning_rates(4)[start:])
    checkpoint.save(out, torch_backend.state_to_arrays(state), {"position": 4}, keep=1)
""")


@pytest.mark.parametrize("dropout", [False, True])
def test_resume_in_a_fresh_process_equals_an_uninterrupted_run(tmp_path, dropout):
    spec = tiny_spec(tmp_path / "model", dropout=dropout)
    batches, rates = train_batches(8, 4), learning_rates(4)
    torch_backend = backend()
    uninterrupted, _ = run(torch_backend, spec, batches, rates)
    interrupted, _ = run(torch_backend, spec, batches[:2], rates[:2])
    saved = checkpoint.save(tmp_path / "ckpt", torch_backend.state_to_arrays(interrupted), {"position": 2}, keep=1)
    script = tmp_path / "resume.py"
    script.write_text(RESUME)
    # The child uses this process's thread count (the noxfile sets OMP_NUM_THREADS): torch splits a reduction over
    # its threads, so only the same count gives the same bits.
    threads = {name: os.environ[name] for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if name in os.environ}
    env = {"PYTHONPATH": str(Path(__file__).parent), "HF_HUB_OFFLINE": "1", "PATH": "", **threads}
    subprocess.run([sys.executable, str(script), str(saved), str(tmp_path / "model"), str(tmp_path / "resumed"),
                    "1" if dropout else "0"], check=True, env=env, timeout=300)
    resumed, _ = checkpoint.load(checkpoint.latest(tmp_path / "resumed"))
    expected = torch_backend.state_to_arrays(uninterrupted)
    assert_params_close(expected, resumed, atol=0)
    for kind in ("exp_avg", "exp_avg_sq"):  # Adam's moments too: a resume that dropped them would drift later
        want, got = getattr(expected, kind), getattr(resumed, kind)
        assert got.keys() == want.keys() and want, kind
        assert all(np.array_equal(got[name], want[name]) for name in want), kind


def test_a_checkpoint_that_does_not_fit_the_model_is_rejected(tmp_path):
    torch_backend = backend()
    state = torch_backend.init(tiny_spec(tmp_path), OptimizerSpec())
    portable = torch_backend.state_to_arrays(state)
    portable.params["classifier.weight"] = np.zeros((3, 32), np.float32)
    portable.exp_avg["bert.extra.weight"] = np.zeros(2, np.float32)
    with pytest.raises(TpuplexError, match=r"parameters does not match the model \(wrong shape: classifier\.weight"):
        torch_backend.state_from_arrays(state, portable)
    portable.params["classifier.weight"] = np.zeros((2, 32), np.float32)
    with pytest.raises(TpuplexError, match=r"exp_avg moments does not match the model \(unexpected: bert\.extra"):
        torch_backend.state_from_arrays(state, portable)


def test_grad_accum_that_does_not_divide_the_batch_is_rejected(tmp_path):
    torch_backend = backend()
    state = torch_backend.init(tiny_spec(tmp_path), OptimizerSpec(grad_accum=3))
    with pytest.raises(TpuplexError, match="train.grad_accum = 3 does not divide the 8 rows"):
        torch_backend.train_step(state, train_batches(8, 1)[0], 1e-3)


def test_xla_without_torch_xla_names_the_install_command():
    # Distribution metadata, not find_spec: the tests/torch_xla folder would pass for a namespace package.
    if any(dist.metadata["Name"] == "torch_xla" for dist in importlib.metadata.distributions()):
        pytest.skip("torch_xla is installed in this environment")
    with pytest.raises(TpuplexError, match=r"pip install '\./packages/torch_backend\[xla\]'"):
        TorchBackend(RuntimeConfig(torch_mode="xla"))


@pytest.mark.parametrize(("runtime", "message"), [
    (RuntimeConfig(device="tpu"), "device 'tpu' was asked for, but none was found"),
    (RuntimeConfig(cpu_devices=4), 'cpu_devices = 4 needs torch_mode = "xla"'),
])
def test_devices_that_are_not_there_are_rejected(runtime, message):
    with pytest.raises(TpuplexError, match=message):
        TorchBackend(runtime)


def test_topology_reports_the_mode_and_why():
    topology = backend().topology()
    assert (topology.kind, topology.device_count, topology.process_index) == ("cpu", 1, 0)
    assert "torch eager; runtime.torch_mode = eager" in topology.report()
    assert topology.report().isprintable()  # one line


def test_eager_compiles_nothing_and_profiles_into_the_log_dir(tmp_path):
    torch_backend = backend()
    state = torch_backend.init(tiny_spec(tmp_path), OptimizerSpec())
    torch_backend.start_profile(tmp_path / "trace")
    torch_backend.train_step(state, train_batches(8, 1)[0], 1e-3)
    torch_backend.stop_profile()
    assert torch_backend.compile_count() == 0
    # What TensorBoard's torch profiler plugin reads: <logdir>/<worker>.<time>.pt.trace.json (Chrome trace events)
    traces = list((tmp_path / "trace").glob("*.pt.trace.json"))
    assert len(traces) == 1 and json.loads(traces[0].read_text())["traceEvents"]


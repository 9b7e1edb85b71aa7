"""`runtime.torch_mode = "compile"`: the same training as eager mode (dropout on, so the masks must match too),
one compiled program per batch shape and none after the shapes have been seen; with `train.bf16`, training near
eager float32 on every task. (One file: one process pays torch.compile's start.)"""

from __future__ import annotations

import decoder_checks
import hf_families as families
import image_family_checks
import mlm_checks
import ner_checks
import numpy as np
import pytest
from helpers import assert_params_close, backend, learning_rates, run, tiny_spec, train_batches

import torch
from tpuplex.config import RuntimeConfig
from tpuplex.errors import TpuplexError
from tpuplex.protocol import OptimizerSpec
from tpuplex.testing.specs import image_family_spec
from tpuplex_torch.backend import TorchBackend

pytestmark = pytest.mark.started_first


@pytest.fixture(scope="module")
def compiled_run(tmp_path_factory) -> dict:
    """The tiny BERT with dropout on, trained by `torch_mode = "compile"` on 6 batches of both bucket lengths: the
    reference of eager mode (below) and of "cuda_graphs", which compiles the same programs again and finds them in
    inductor's cache (a compile of this model costs 15-30 s of the 2-core machine, a cache hit a few)."""
    spec = tiny_spec(tmp_path_factory.mktemp("tiny-bert"), dropout=True)
    batches = train_batches(8, 6)
    rates = learning_rates(len(batches))
    compiled = backend("compile")
    state, losses = run(compiled, spec, batches, rates, OptimizerSpec(seed=3))
    return {"spec": spec, "batches": batches, "rates": rates, "backend": compiled, "state": state, "losses": losses}


def test_compiled_training_matches_eager_and_compiles_once_per_shape(compiled_run):
    spec, batches, rates = compiled_run["spec"], compiled_run["batches"], compiled_run["rates"]
    shapes = {batch["input_ids"].shape for batch in batches}
    assert len(shapes) == 2, "the batches should use both bucket lengths"
    eager = backend("eager")
    eager_state, eager_losses = run(eager, spec, batches, rates, OptimizerSpec(seed=3))
    compiled, compiled_state, compiled_losses = (compiled_run[key] for key in ("backend", "state", "losses"))

    np.testing.assert_allclose(compiled_losses, eager_losses, rtol=1e-6)
    assert_params_close(compiled.state_to_arrays(compiled_state), eager.state_to_arrays(eager_state), atol=1e-6)
    assert compiled.compile_count() == len(shapes)
    compiled.train_steps(compiled_state, batches, rates)
    assert compiled.compile_count() == len(shapes)
    assert eager.compile_count() == 0
    assert "torch eager + torch.compile; runtime.torch_mode = compile" in compiled.topology().report()


def test_cuda_graphs_on_the_cpu_warns_once_and_trains_as_compile(compiled_run, capsys):
    # Dynamo's guards hold for a second model of the same structure (its parameters are the programs' inputs), so
    # this process would run the "compile" programs again without compiling: forget them, as a new process would.
    torch._dynamo.reset()
    capsys.readouterr()
    graphs = backend("cuda_graphs")
    assert capsys.readouterr().err == ('tpuplex: warning: runtime.torch_mode = "cuda_graphs" replays CUDA graphs on '
                                       'a GPU; on the cpu it runs as "compile"\n')
    assert not graphs.placement.replays_graphs
    assert "torch eager + torch.compile; runtime.torch_mode = cuda_graphs" in graphs.topology().report()
    _, losses = run(graphs, compiled_run["spec"], compiled_run["batches"], compiled_run["rates"], OptimizerSpec(seed=3))
    assert losses == compiled_run["losses"]


def dropout_kernels(torch_backend, state, batch, rate) -> int:
    """The eager dropout kernels one training step of `state` runs, from torch's profiler."""
    with torch.profiler.profile() as profile:
        torch_backend.train_steps(state, [batch], [rate])
    return sum(event.name in ("aten::native_dropout", "aten::bernoulli_") for event in profile.events())


def test_compiled_random_draws_the_masks_inside_the_compiled_kernels_reproducibly(compiled_run):
    # One batch shape (the fixture's five long batches): one compile more, the default's program found compiled.
    spec, default = compiled_run["spec"], compiled_run["backend"]
    batches = [batch for batch in compiled_run["batches"] if batch["input_ids"].shape[1] == 16]
    rates = learning_rates(len(batches))
    inductor = TorchBackend(RuntimeConfig(torch_mode="compile", torch_random="compiled"))
    state, losses = run(inductor, spec, batches, rates, OptimizerSpec(seed=3))
    half, first = run(inductor, spec, batches[:2], rates[:2], OptimizerSpec(seed=3))
    resumed = inductor.state_from_arrays(inductor.init(spec, OptimizerSpec(seed=3)), inductor.state_to_arrays(half))
    _, rest = inductor.train_steps(resumed, batches[2:], rates[2:])
    default_state, default_losses = run(default, spec, batches, rates, OptimizerSpec(seed=3))

    assert first + rest == losses, "a run resumed half-way draws the uninterrupted run's masks (its seed's)"
    assert losses != default_losses, "Inductor's masks are its own, not torch's generator's"
    np.testing.assert_allclose(losses, default_losses, rtol=0.02)
    assert dropout_kernels(inductor, state, batches[0], rates[-1]) == 0
    assert dropout_kernels(default, default_state, batches[0], rates[-1]) > 0


def test_compiled_random_without_a_compiled_mode_is_refused():
    with pytest.raises(TpuplexError, match='torch_random = "compiled" draws dropout\'s masks in torch.compile\'s '
                                           'kernels, but runtime.torch_mode = "eager" compiles nothing'):
        TorchBackend(RuntimeConfig(torch_mode="eager", torch_random="compiled"))


def task_runs(task: str, folder) -> tuple:
    """A small model of each task's kind and 6 of its training batches of one shape (dropout off)."""
    if task == "sequence_classification":
        return tiny_spec(folder), [batch for batch in train_batches(8, 12) if batch["input_ids"].shape[1] == 8][:6]
    if task == "causal_lm":
        spec = decoder_checks.decoder_spec(folder, "gpt2")
        tokens = np.random.default_rng(0).integers(0, spec.arch.vocab_size, (6, 4, 9)).astype(np.int32)
        return spec, [{"input_ids": rows[:, :-1], "labels": rows[:, 1:], "weight": np.ones((4, 8), np.float32)}
                      for rows in tokens]
    if task == "image_classification":
        spec = image_family_spec(image_family_checks.write_config(folder, image_family_checks.TRAINING["resnet-cifar"]),
                                 image_family_checks.NUM_LABELS, dropout=False)
        labels = np.random.default_rng(0).integers(0, image_family_checks.NUM_LABELS, (6, 8)).astype(np.int32)
        return spec, [{"images": image_family_checks.images(8, seed=step), "labels": labels[step],
                       "weight": np.ones(8, np.float32)} for step in range(6)]
    checkpoint = families.write_checkpoint("bert", folder)
    checks = {"masked_lm": mlm_checks, "token_classification": ner_checks}[task]
    return checks.spec(checkpoint), checks.batches(checkpoint, 4, 6)


ENCODER_AGAIN = ("masked_lm", "token_classification")
"""The BERT encoder of sequence classification under other heads: long tier only. The fast tier compiles each
family once (the encoder, convolutions with batch norm, the decoder): each task's compile takes 15-21 s of the
2-core machine."""


@pytest.mark.parametrize("task", ["sequence_classification", "image_classification", "causal_lm",
                                  *(pytest.param(task, marks=pytest.mark.long) for task in ENCODER_AGAIN)])
def test_every_task_compiled_in_bf16_trains_as_eager_float32(task, tmp_path):
    """The bound docs/benchmarks.md states ("Compiled steps and bf16"): `torch_mode = "compile"` with `train.bf16`
    (bf16 autocast, float32 weights and optimizer state) keeps every loss within 2e-2 relative of eager float32.
    (Compiled float32 equals eager within 1e-6: above.)"""
    spec, batches = task_runs(task, tmp_path)
    rates = learning_rates(len(batches))
    _, eager = run(backend("eager"), spec, batches, rates, OptimizerSpec(seed=3))
    compiled = backend("compile")
    _, bf16 = run(compiled, spec, batches, rates, OptimizerSpec(seed=3, bf16=True))
    np.testing.assert_allclose(bf16, eager, rtol=2e-2)
    assert bf16 != eager, "bf16 must change the arithmetic"
    assert compiled.compile_count() == 1

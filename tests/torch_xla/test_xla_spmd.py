"""torch_xla SPMD on 4 CPU devices (PJRT_DEVICE=CPU, CPU_NUM_DEVICES=4, set by the tests-torch-xla session):
equality with one device and with eager, a compile count bounded by the buckets, exact evaluation, errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    BUCKETS,
    assert_params_close,
    backend,
    encoded,
    learning_rates,
    model_spec,
    run,
    tiny_spec,
    train_batches,
)

from tpuplex.config import RuntimeConfig
from tpuplex.data.batching import Batcher
from tpuplex.errors import TpuplexError
from tpuplex.protocol import OptimizerSpec, PortableState
from tpuplex.testing.tiny_bert import write_tiny_bert

GLOBAL_BATCH = 8


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    return tiny_spec(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def two_epochs(spec):
    """Two epochs of training, each followed by evaluation of a ragged split, on 4 devices.

    Returns compile counts (before, after epoch 1, after epoch 2), the epoch-2 logits gathered by example index,
    how often each example was seen in that evaluation, the split and the final state.
    """
    xla = backend("xla", cpu_devices=4)
    data, split = encoded(GLOBAL_BATCH * 6, seed=7), encoded(21, seed=8)
    batcher, evaluator = Batcher(data, GLOBAL_BATCH, 4, BUCKETS), Batcher(split, GLOBAL_BATCH, 4, BUCKETS)
    state = xla.init(spec, OptimizerSpec())
    counts = [xla.compile_count()]
    for epoch in range(2):
        batches = list(batcher.train_batches(epoch))
        state, _ = xla.train_steps(state, batches, learning_rates(len(batches)))
        gathered, seen = np.zeros((len(split), 2), np.float32), np.zeros(len(split), int)
        for evaluation in evaluator.eval_batches():
            real = evaluation.index >= 0
            gathered[evaluation.index[real]] = xla.predict(state, evaluation.batch)[real]
            seen[evaluation.index[real]] += 1
        counts.append(xla.compile_count())
    return counts, gathered, seen, split, xla.state_to_arrays(state)


def test_compiles_one_program_per_bucket_and_none_after_the_first_epoch(two_epochs):
    (before, first, second), *_ = two_epochs
    train_buckets = predict_buckets = len(BUCKETS) + 1  # the buckets below max_length, and max_length
    assert first - before == train_buckets + predict_buckets
    assert second == first


def test_evaluation_of_a_ragged_split_counts_every_example_once(spec, two_epochs):
    _, gathered, seen, split, final = two_epochs
    assert np.all(seen == 1)
    single = backend("xla", 1)
    state = single.state_from_arrays(single.init(spec, OptimizerSpec()), final)
    unpadded = {"input_ids": split.input_ids, "token_type_ids": split.token_type_ids,
                "attention_mask": (np.arange(split.max_length)[None] < split.lengths[:, None]).astype(np.int32),
                "labels": split.labels}
    np.testing.assert_allclose(gathered, single.predict(state, unpadded), atol=1e-5, rtol=0)


EAGER_TWIN = """
import sys
import numpy as np
from helpers import backend, learning_rates, run, tiny_spec, train_batches
from tpuplex.protocol import OptimizerSpec
eager = backend()
state, losses = run(eager, tiny_spec(sys.argv[1]), train_batches({batch}, 2, replicas=4), learning_rates(2, {peak}),
                    OptimizerSpec(optimizer="{optimizer}"))
np.savez(sys.argv[2], losses=np.array(losses), **eager.state_to_arrays(state).params)
print("torch_xla" in sys.modules)
"""


SGD_PEAK = 0.1
"""SGD's usual learning rate is ~100x AdamW's: at AdamW's the SGD step moves parameters too little to compare."""


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_spmd_on_4_devices_equals_1_device_and_eager(spec, tmp_path, optimizer):
    peak = SGD_PEAK if optimizer == "sgd" else 1e-3
    batches, rates = train_batches(GLOBAL_BATCH, 2, replicas=4), learning_rates(2, peak)
    finals = {}
    for name, torch_backend in (("xla x4", backend("xla", 4)), ("xla x1", backend("xla", 1))):
        state, losses = run(torch_backend, spec, batches, rates, OptimizerSpec(optimizer=optimizer))
        finals[name] = (torch_backend.state_to_arrays(state).params, losses)
    moved = max(np.abs(finals["xla x4"][0][name] - spec.params[name]).max() for name in spec.params)
    assert moved > 1e-4, f"{optimizer} must train"
    # Eager in a process of its own (one torch mode per process), which must never load torch_xla.
    twin = EAGER_TWIN.format(batch=GLOBAL_BATCH, optimizer=optimizer, peak=peak)
    command = [sys.executable, "-c", twin, str(tmp_path), str(tmp_path / "eager.npz")]
    found = subprocess.run(command, capture_output=True, text=True, check=True, timeout=300,
                           cwd=Path(__file__).resolve().parents[1] / "torch")
    assert found.stdout.strip().splitlines()[-1] == "False"
    eager = dict(np.load(tmp_path / "eager.npz"))
    finals["eager"] = (eager, list(eager.pop("losses")))
    for name in ("xla x1", "eager"):
        assert_params_close(PortableState(finals["xla x4"][0], {}, {}, 2), PortableState(finals[name][0], {}, {}, 2),
                            atol=1e-5)
        np.testing.assert_allclose(finals["xla x4"][1], finals[name][1], atol=1e-5)


def test_fsdp_splits_the_large_parameters_and_their_moments_and_trains_as_replicated(tmp_path):
    """runtime.mesh = {fsdp = 4} on the 4 devices: each parameter of 16,384 elements or more (the tiny BERT's MLP
    with 512 inner units) and both its moments split 4 ways on the dimension the core's layout names, the rest
    replicated; 2 AdamW steps end as data = 4's within 1e-5."""
    import torch_xla
    from tpuplex_torch.backend import TorchBackend

    spec = model_spec(write_tiny_bert(tmp_path, intermediate_size=512))
    batches, rates = train_batches(GLOBAL_BATCH, 2, replicas=4), learning_rates(2)
    finals = {}
    for mesh in ({"data": 4}, {"fsdp": 4}):
        torch_backend = TorchBackend(RuntimeConfig(torch_mode="xla", cpu_devices=4, mesh=mesh))
        state = torch_backend.init(spec, OptimizerSpec())
        if mesh == {"fsdp": 4}:
            held = dict(state.model.named_parameters())
            split = held["bert.encoder.layer.0.intermediate.dense.weight"]  # [512, 32]: its rows split
            moments = state.optimizer.state[split]
            for tensor in (split, moments["exp_avg"], moments["exp_avg_sq"]):
                assert torch_xla._XLAC._get_xla_sharding_spec(tensor).startswith("{devices=[4,1]")
            assert torch_xla._XLAC._get_xla_sharding_spec(held["bert.pooler.dense.weight"]) == "{replicated}"
            whole = sum(3 * p.numel() * 4 for p in held.values())
            mlp = sum(3 * p.numel() * 4 for name, p in held.items() if ".dense.weight" in name and 512 in p.shape)
            assert torch_backend.state_bytes(state) == whole - mlp + mlp // 4
        state, losses = torch_backend.train_steps(state, batches, rates)
        finals[str(mesh)] = (torch_backend.state_to_arrays(state).params, losses)
    (replicated, replicated_losses), (sharded, sharded_losses) = finals.values()
    np.testing.assert_allclose(sharded_losses, replicated_losses, rtol=1e-5)
    assert_params_close(PortableState(sharded, {}, {}, 2), PortableState(replicated, {}, {}, 2), atol=1e-5)


def test_eager_mode_is_refused_where_torch_xla_already_runs():
    backend("xla", 4)
    with pytest.raises(TpuplexError, match="use one torch mode per process"):
        backend()


def test_topology_names_spmd_and_why():
    report = backend("xla", 4).topology().report()
    assert report.startswith("cpu x4 (1 process) via torch_xla PJRT CPU")
    assert "torch_xla SPMD, mesh data=4 x copy=1; runtime.torch_mode = xla" in report


def test_a_batch_that_does_not_divide_by_the_replicas_is_rejected(spec):
    xla = backend("xla", 4)
    state = xla.init(spec, OptimizerSpec())
    batch = {key: value[:6] for key, value in train_batches(GLOBAL_BATCH, 1, replicas=4)[0].items()}
    with pytest.raises(TpuplexError, match="train.global_batch = 6 does not divide by the 4 replicas"):
        xla.train_step(state, batch, 1e-3)


def test_replicas_that_do_not_divide_the_devices_are_rejected():
    with pytest.raises(TpuplexError, match="runtime.cpu_devices = 3 does not fit the 4 XLA CPU devices"):
        backend("xla", 3)


def test_bf16_predicts_close_to_float32(spec):
    xla = backend("xla", 4)
    batch = train_batches(4, 1, replicas=4)[0]
    full = xla.predict(xla.init(spec, OptimizerSpec()), batch)
    half = xla.predict(xla.init(spec, OptimizerSpec(bf16=True)), batch)
    assert not np.array_equal(full, half)  # bf16 really ran
    np.testing.assert_allclose(half, full, atol=3e-2, rtol=0)


def test_profiler_writes_a_trace(spec, tmp_path):
    xla = backend("xla", 4)
    state = xla.init(spec, OptimizerSpec())
    batch = train_batches(4, 1, replicas=4)[0]
    xla.start_profile(tmp_path)
    xla.predict(state, batch)
    xla.stop_profile()
    assert any(path.is_file() for path in Path(tmp_path).rglob("*"))



def test_speech_recognition_is_refused_on_torch_xla_in_one_line(tmp_path):
    """torch's CTC has no XLA lowering: the speech task is refused when the model is built, naming why and what to
    use instead (the jax backend runs it on a TPU)."""
    from tpuplex.kinds.speech import SpeechFamilies
    from tpuplex.models.conformer import CONFORMER, ConformerArch, initial_params
    from tpuplex.protocol import ModelSpec
    from tpuplex.tasks.speech_recognition import TASK, SpeechHead

    arch, head = ConformerArch(hidden_size=8, num_layers=1, num_heads=2, subsampling_channels=4), SpeechHead(5, 16)
    kind = SpeechFamilies(tmp_path, {"model_type": "conformer_ctc"}, CONFORMER, arch)
    spec = ModelSpec(kind=kind, task=TASK, head=head, inputs=TASK.inputs, family=CONFORMER, arch=arch,
                     params=initial_params(arch, 16, 5, 0))
    with pytest.raises(TpuplexError, match=r"the speech_recognition task does not run on torch_xla: torch's "
                                           r"ctc_loss has no XLA lowering .*use --backend jax"):
        backend("xla", 4).init(spec, OptimizerSpec())

"""The Trainer driving the numpy backend, and the numpy backend's update rule, on arrays built here."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tpuplex import config as config_lib
from tpuplex.data.batching import Encoded
from tpuplex.engine import checkpoint
from tpuplex.engine import trainer as trainer_module
from tpuplex.engine.run_log import Reporter
from tpuplex.engine.schedule import warmup_cosine_decay, warmup_linear_decay, warmup_steps
from tpuplex.engine.trainer import Trainer
from tpuplex.errors import TpuplexError
from tpuplex.protocol import ModelSpec, OptimizerSpec, decays
from tpuplex.tasks.base import TaskData
from tpuplex.tasks.sequence_classification import mean_loss
from tpuplex.testing.numpy_backend import NumpyBackend
from tpuplex.testing.specs import classifier_spec
from tpuplex.testing.tiny_bert import TINY_CONFIG

VOCAB = TINY_CONFIG["vocab_size"]
MAX_LENGTH = 24


def split(count: int, seed: int, num_labels: int = 2) -> Encoded:
    """Rows of 3-20 tokens. Class 1 draws its tokens from the upper half of the vocabulary and class 0 from the
    lower half, so mean-pooled embeddings separate the classes; regression targets are the class as a float."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 21, count).astype(np.int32)
    classes = rng.integers(0, 2, count)
    half = VOCAB // 2
    ids = rng.integers(5, half, (count, MAX_LENGTH)) + classes[:, None] * (half - 5)
    ids = np.where(np.arange(MAX_LENGTH)[None, :] < lengths[:, None], ids, 0).astype(np.int32)
    labels = classes.astype(np.float32) if num_labels == 1 else classes.astype(np.int32)
    return Encoded(ids, np.zeros_like(ids), lengths, labels)


def accuracy(logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    return {"accuracy": float(np.mean(logits.argmax(axis=1) == labels))}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from tpuplex.testing.tiny_bert import write_tiny_bert

    return write_tiny_bert(tmp_path_factory.mktemp("tiny"), seed=0)


def model_spec(model_dir: Path, num_labels: int = 2) -> ModelSpec:
    return classifier_spec(model_dir, TINY_CONFIG, num_labels, seed=1)


def make_config(tmp_path: Path, *overrides: str) -> config_lib.Config:
    return config_lib.load(None, [
        f"runtime.output_dir={json.dumps(str(tmp_path / 'run'))}", "train.global_batch=8", "train.epochs=2",
        "train.learning_rate=0.05", "data.max_length=24", "data.buckets=[8, 16]", "runtime.log_every=2",
        *overrides,
    ])


class SpyBackend(NumpyBackend):
    """The numpy backend, recording each update's batch shape and learning rate, and each train_steps group."""

    def __init__(self, runtime):
        super().__init__(runtime)
        self.steps: list[tuple[tuple[int, int], float]] = []
        self.groups: list[tuple[int, list[tuple[int, int]]]] = []  # (updates done before, shapes)

    def train_step(self, state, batch, learning_rate):
        self.steps.append((batch["input_ids"].shape, learning_rate))
        return super().train_step(state, batch, learning_rate)

    def train_steps(self, state, batches, learning_rates):
        self.groups.append((state.step, [b["input_ids"].shape for b in batches]))
        return super().train_steps(state, batches, learning_rates)


@dataclasses.dataclass
class SplitData(TaskData):
    """Sequence-classification splits scored by `metric_fn` (and the mean loss, as the task scores them)."""

    name: str
    train: Encoded
    eval: dict[str, Encoded]
    metric_fn: Any

    def metrics(self, split, outputs, labels, weight):
        return {**self.metric_fn(outputs, labels), "loss": mean_loss(outputs, labels)}


def fit(tmp_path: Path, model_dir: Path, *overrides: str, backend_cls=SpyBackend, train=None, dev=None,
        metric_fn=accuracy, counted: bool = False):
    """Train the tiny classifier on `backend_cls`; `counted`: the Trainer knows the model, so it counts its FLOPs
    and reports MFU."""
    config = make_config(tmp_path, *overrides)
    backend = backend_cls(config.runtime)
    data = SplitData("tiny", train or split(120, seed=1), {"dev": dev or split(37, seed=2)}, metric_fn)
    spec = model_spec(model_dir)
    trainer = Trainer(backend, config, data, tmp_path / "run", model=spec if counted else None)
    optimizer = OptimizerSpec(seed=config.train.seed, optimizer=config.train.optimizer,
                              momentum=config.train.momentum, nesterov=config.train.nesterov)
    state = backend.init(spec, optimizer)
    with Reporter(tmp_path / "run") as reporter:
        return trainer, backend, trainer.fit(state, reporter)


def log_records(tmp_path: Path, event: str) -> list[dict]:
    lines = (tmp_path / "run" / "log.jsonl").read_text().splitlines()
    return [record for record in map(json.loads, lines) if record["event"] == event]


# -- the numpy backend's update rule --------------------------------------------------------------------------


def one_batch(data: Encoded, rows: slice, weight: np.ndarray | None = None) -> dict[str, np.ndarray]:
    mask = (np.arange(MAX_LENGTH)[None, :] < data.lengths[rows, None]).astype(np.int32)
    count = len(data.lengths[rows])
    return {"input_ids": data.input_ids[rows], "token_type_ids": data.token_type_ids[rows], "attention_mask": mask,
            "labels": data.labels[rows], "weight": np.ones(count, np.float32) if weight is None else weight}


@pytest.mark.parametrize("num_labels", [2, 1])
def test_first_moment_is_the_gradient_of_the_loss(model_dir, num_labels: int) -> None:
    """After one step from zero moments exp_avg = (1 - beta1) * g; g must match central finite differences of
    the weighted mean loss computed from `predict`, and exp_avg_sq must be (1 - beta2) * g^2."""
    backend = NumpyBackend(config_lib.RuntimeConfig())
    spec = model_spec(model_dir, num_labels)
    optimizer = OptimizerSpec(clip_norm=0.0)
    state = backend.init(spec, optimizer)
    batch = one_batch(split(8, seed=3, num_labels=num_labels), slice(0, 8))
    stepped, loss = backend.train_step(state, batch, 1e-3)
    assert loss == pytest.approx(mean_loss(backend.predict(state, batch), batch["labels"]), rel=1e-6)
    grad = {name: stepped.exp_avg[name] / (1 - optimizer.beta1) for name in ("classifier.weight", "classifier.bias")}
    assert np.allclose(stepped.exp_avg_sq["classifier.weight"], (1 - optimizer.beta2) * grad["classifier.weight"] ** 2,
                       rtol=1e-4, atol=1e-12)
    h = 0.05
    for name, g in grad.items():
        for index in np.ndindex(g.shape):
            losses = []
            for sign in (1, -1):
                shifted = dict(state.params)
                shifted[name] = state.params[name].copy()
                shifted[name][index] += sign * h
                probe = dataclasses.replace(state, params=shifted)
                losses.append(mean_loss(backend.predict(probe, batch), batch["labels"]))
            assert (losses[0] - losses[1]) / (2 * h) == pytest.approx(float(g[index]), rel=2e-2, abs=2e-5)


def test_first_adamw_step_moves_each_weight_by_the_learning_rate(model_dir) -> None:
    """With zero moments, m_hat = g and sqrt(v_hat) = |g|, so p1 = p0 - lr * g / (|g| + eps) - lr * wd * p0 (no
    decay on the bias): a step of about lr per weight. The step lowers the loss."""
    backend = NumpyBackend(config_lib.RuntimeConfig())
    optimizer = OptimizerSpec(weight_decay=0.1)
    state = backend.init(model_spec(model_dir), optimizer)
    batch = one_batch(split(8, seed=4), slice(0, 8))
    lr = 1e-3
    stepped, loss = backend.train_step(state, batch, lr)
    for name, decay in (("classifier.weight", 0.1), ("classifier.bias", 0.0)):
        before, after = state.params[name].astype(np.float64), stepped.params[name].astype(np.float64)
        g = stepped.exp_avg[name].astype(np.float64) / (1 - optimizer.beta1)
        assert np.allclose(after, before - lr * g / (np.abs(g) + optimizer.epsilon) - lr * decay * before,
                           rtol=1e-5, atol=1e-8)
    assert mean_loss(backend.predict(stepped, batch), batch["labels"]) < loss
    assert stepped.step == 1


def test_clipping_bounds_the_global_gradient_norm(model_dir) -> None:
    backend = NumpyBackend(config_lib.RuntimeConfig())
    batch = one_batch(split(8, seed=5), slice(0, 8))

    def first_moment_norm(clip_norm: float) -> float:
        state = backend.init(model_spec(model_dir), OptimizerSpec(clip_norm=clip_norm))
        stepped, _ = backend.train_step(state, batch, 1e-3)
        return math.sqrt(sum(float(np.sum(m.astype(np.float64) ** 2)) for m in stepped.exp_avg.values())) / 0.1

    unclipped = first_moment_norm(0.0)
    assert first_moment_norm(unclipped / 4) == pytest.approx(unclipped / 4, rel=1e-5)
    assert first_moment_norm(unclipped * 4) == pytest.approx(unclipped, rel=1e-6)


def test_replica_and_micro_batch_gradients_are_averaged(model_dir) -> None:
    """Two replicas: g = (g(rows 0-3) + g(rows 4-7)) / 2, each a weighted mean over its own rows."""
    data = split(8, seed=6)
    weight = np.array([1, 1, 1, 0, 1, 0, 0, 0], np.float32)
    optimizer = OptimizerSpec(clip_norm=0.0)
    spec = model_spec(model_dir)
    single = NumpyBackend(config_lib.RuntimeConfig())

    def first_moment(backend, batch):
        state, _ = backend.train_step(backend.init(spec, optimizer), batch, 1e-3)
        return state.exp_avg["classifier.weight"]

    halves = [first_moment(single, one_batch(data, rows, weight[rows])) for rows in (slice(0, 4), slice(4, 8))]
    for runtime, grad_accum in ((config_lib.RuntimeConfig(cpu_devices=2), 1), (config_lib.RuntimeConfig(), 2)):
        backend = NumpyBackend(runtime)
        state = backend.init(spec, dataclasses.replace(optimizer, grad_accum=grad_accum))
        stepped, _ = backend.train_step(state, one_batch(data, slice(0, 8), weight), 1e-3)
        assert np.allclose(stepped.exp_avg["classifier.weight"], (halves[0] + halves[1]) / 2, rtol=1e-5, atol=1e-10)


def test_state_round_trip_and_mismatch(model_dir) -> None:
    backend = NumpyBackend(config_lib.RuntimeConfig())
    state = backend.init(model_spec(model_dir), OptimizerSpec())
    state, _ = backend.train_step(state, one_batch(split(8, seed=7), slice(0, 8)), 1e-2)
    arrays = backend.state_to_arrays(state)
    restored = backend.state_from_arrays(backend.init(model_spec(model_dir), OptimizerSpec()), arrays)
    assert restored.step == 1
    assert all(np.array_equal(restored.params[n], state.params[n]) for n in state.params)
    assert all(np.array_equal(restored.exp_avg[n], state.exp_avg[n]) for n in state.exp_avg)
    three_labels = backend.init(model_spec(model_dir, num_labels=3), OptimizerSpec())
    with pytest.raises(TpuplexError, match=r"wrong shape: classifier.bias \(2,\) != \(3,\)"):
        backend.state_from_arrays(three_labels, arrays)


# -- the Trainer ------------------------------------------------------------------------------------------------


def test_schedule_warmup_then_linear_decay() -> None:
    assert warmup_steps(30, 0.1) == 3 and warmup_steps(31, 0.1) == 4 and warmup_steps(30, 0.0) == 0
    rates = [warmup_linear_decay(i, peak=1.0, warmup=4, total=20) for i in range(21)]
    assert rates[:5] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert rates[20] == 0.0 and all(a > b for a, b in itertools.pairwise(rates[4:21]))


def test_every_step_gets_the_scheduled_learning_rate(tmp_path, model_dir) -> None:
    trainer, backend, result = fit(tmp_path, model_dir, "train.warmup_ratio=0.25")
    total = 2 * trainer.steps_per_epoch
    assert result.step == trainer.total_steps == total == len(backend.steps) == len(result.losses)
    warmup = math.ceil(total * 0.25)
    assert [lr for _, lr in backend.steps] == [warmup_linear_decay(i, peak=0.05, warmup=warmup, total=total)
                                              for i in range(total)]


def test_the_cosine_schedule_is_followed_when_chosen(tmp_path, model_dir) -> None:
    trainer, backend, _ = fit(tmp_path, model_dir, "train.warmup_ratio=0.25", 'train.schedule="cosine"')
    total, warmup = trainer.total_steps, trainer.warmup
    rates = [lr for _, lr in backend.steps]
    assert rates == [warmup_cosine_decay(i, peak=0.05, warmup=warmup, total=total) for i in range(total)]
    assert rates != [warmup_linear_decay(i, peak=0.05, warmup=warmup, total=total) for i in range(total)]
    assert max(rates) == rates[warmup] == 0.05


def test_weight_decay_spares_biases_and_every_norm() -> None:
    spared = ["bert.encoder.layer.0.output.LayerNorm.weight", "vit.layers.3.layernorm_before.weight",
              "vit.layernorm.weight", "resnet.encoder.stages.0.layers.0.layer.1.normalization.weight",
              "distilbert.transformer.layer.0.sa_layer_norm.weight", "classifier.1.bias"]
    decayed = ["resnet.embedder.embedder.convolution.weight", "vit.layers.0.attention.q_proj.weight",
               "vit.embeddings.position_embeddings", "classifier.1.weight", "bert.embeddings.word_embeddings.weight"]
    assert not any(decays(name) for name in spared) and all(decays(name) for name in decayed)


def test_sgd_keeps_its_momentum_in_exp_avg(tmp_path, model_dir) -> None:
    """train.optimizer = "sgd" reaches the backend: the checkpoint holds a momentum buffer and no second moment
    (the backends' SGD is checked against torch.optim.SGD in tests/*/test_image_families.py)."""
    _, _, result = fit(tmp_path, model_dir, 'train.optimizer="sgd"', "train.momentum=0.8")
    arrays, _ = checkpoint.load(checkpoint.latest(tmp_path / "run" / "checkpoints"))
    assert any(np.abs(v).max() > 0 for v in arrays.exp_avg.values())
    assert all(not np.any(v) for v in arrays.exp_avg_sq.values()) and all(np.isfinite(result.losses))


def test_max_steps_overrides_epochs(tmp_path, model_dir) -> None:
    trainer, backend, result = fit(tmp_path, model_dir, "train.max_steps=5", "train.epochs=9")
    assert trainer.total_steps == result.step == len(backend.steps) == 5
    info = json.loads((checkpoint.latest(tmp_path / "run" / "checkpoints") / "trainer.json").read_text())
    assert (info["step"], info["epoch"], info["position"]) == (5, 0, 5)


def test_training_learns_the_separable_task(tmp_path, model_dir) -> None:
    _, _, result = fit(tmp_path, model_dir, "train.epochs=6", "train.learning_rate=0.5")
    assert np.mean(result.losses[-5:]) < np.mean(result.losses[:5]) - 0.2
    assert result.metrics["dev"]["loss"] < math.log(2)  # better than the uniform prediction
    assert result.metrics["dev"]["accuracy"] > 0.7  # 37 examples: chance would be 0.5 +- 0.08


def test_while_a_group_runs_the_input_thread_builds_the_next(tmp_path, model_dir, monkeypatch) -> None:
    """`runtime.prefetch` counts calls: a group's batches are all taken before it runs, so with room for only
    `prefetch` batches the thread would stop two into the next group and the device would wait for the rest; and the
    thread goes on into the next epoch while this one's last group runs."""
    built, count = threading.Condition(), [0]
    build = SplitData.train_batch

    def counted(self, batch, step):
        out = build(self, batch, step)
        with built:
            count[0] += 1
            built.notify_all()
        return out

    monkeypatch.setattr(SplitData, "train_batch", counted)
    group, per_epoch, epochs = 5, 15, 2  # 120 rows, 8 a step, all of the one bucket

    class Waiting(SpyBackend):
        def train_steps(self, state, batches, learning_rates):
            wanted = min(state.step + 2 * group, epochs * per_epoch)  # this group's batches and the next one's
            with built:  # the thread's progress, awaited: a timeout only when it cannot get there
                assert built.wait_for(lambda: count[0] >= wanted, timeout=120), (state.step, count[0], wanted)
            return super().train_steps(state, batches, learning_rates)

    trainer, backend, _ = fit(tmp_path, model_dir, "runtime.prefetch=1", f"train.steps_per_execution={group}",
                              "data.buckets=[24]", f"train.epochs={epochs}", backend_cls=Waiting)
    assert trainer.steps_per_epoch == per_epoch
    assert [done for done, _ in backend.groups] == list(range(0, epochs * per_epoch, group))


def test_steps_per_execution_groups_same_shape_batches_and_changes_nothing(tmp_path, model_dir) -> None:
    # Buckets 16 and 24: most batches are [8, 16], so an epoch has runs of three of one shape to group.
    _, plain, plain_result = fit(tmp_path / "plain", model_dir, "runtime.eval_every=7", "data.buckets=[16]")
    trainer, grouped, grouped_result = fit(tmp_path / "grouped", model_dir, "train.steps_per_execution=3",
                                           "runtime.eval_every=7", "data.buckets=[16]")
    assert grouped.groups, "no train_steps call"
    spe, total = trainer.steps_per_epoch, trainer.total_steps
    for done, shapes in grouped.groups:
        assert len(shapes) == 3 and len(set(shapes)) == 1
        # A group never spans an evaluation (every 7 steps) nor an epoch end: no boundary before its last step.
        assert all((done + i) % 7 and (done + i) % spe for i in (1, 2))
    assert plain.steps == grouped.steps
    assert plain_result.losses == grouped_result.losses
    assert all(np.array_equal(plain_result.state.params[n], grouped_result.state.params[n])
               for n in plain_result.state.params)
    expected_evals = list(range(7, total + 1, 7)) + ([total] if total % 7 else [])
    assert [r["step"] for r in log_records(tmp_path / "grouped", "eval")] == expected_evals


def test_evaluation_sees_each_example_once_in_split_order(tmp_path, model_dir) -> None:
    dev = split(37, seed=2)
    seen = []

    def record(logits, labels):
        seen.append((logits.copy(), labels.copy()))
        return accuracy(logits, labels)

    _, backend, result = fit(tmp_path, model_dir, "train.eval_batch=16", dev=dev, metric_fn=record)
    logits, labels = seen[-1]
    assert logits.shape == (37, 2) and np.array_equal(labels, dev.labels)
    alone = np.concatenate([backend.predict(result.state, one_batch(dev, slice(i, i + 1))) for i in range(37)])
    assert np.allclose(logits, alone, atol=1e-6)
    assert result.metrics["dev"]["accuracy"] == accuracy(alone, dev.labels)["accuracy"]
    assert result.metrics["dev"]["loss"] == pytest.approx(mean_loss(alone, dev.labels), rel=1e-5)


def test_cadence_of_logs_evaluations_and_checkpoints(tmp_path, model_dir) -> None:
    trainer, _, result = fit(tmp_path, model_dir, "runtime.log_every=3", "runtime.eval_every=4",
                             "runtime.checkpoint_every=5", "runtime.keep_checkpoints=2")
    total = trainer.total_steps
    assert [r["step"] for r in log_records(tmp_path, "train")] == list(range(3, total + 1, 3))
    assert [r["step"] for r in log_records(tmp_path, "eval")] == \
        list(range(4, total + 1, 4)) + ([total] if total % 4 else [])
    saved = [r["step"] for r in log_records(tmp_path, "checkpoint")]
    assert saved == list(range(5, total + 1, 5)) + ([total] if total % 5 else [])
    kept = checkpoint.checkpoints(tmp_path / "run" / "checkpoints")
    assert [p.name for p in kept] == [f"step-{s:08d}" for s in saved[-2:]]
    info = json.loads((kept[-1] / "trainer.json").read_text())
    assert info["step"] == total and info["seed"] == 42 and info["config_hash"] == trainer.config.hash()
    assert info["metrics"]["dev"] == result.metrics["dev"]
    tensorboard = list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
    assert tensorboard and tensorboard[0].stat().st_size > 0


def test_default_cadence_is_the_end_of_each_epoch(tmp_path, model_dir) -> None:
    trainer, _, _ = fit(tmp_path, model_dir)
    spe = trainer.steps_per_epoch
    assert [r["step"] for r in log_records(tmp_path, "eval")] == [spe, 2 * spe]
    assert [r["step"] for r in log_records(tmp_path, "checkpoint")] == [spe, 2 * spe]
    first = json.loads((tmp_path / "run" / "checkpoints" / f"step-{spe:08d}" / "trainer.json").read_text())
    assert (first["epoch"], first["position"]) == (1, 0)


def test_a_checkpoint_on_the_last_step_holds_the_final_metrics(tmp_path, model_dir) -> None:
    trainer, _, result = fit(tmp_path, model_dir, "runtime.checkpoint_every=5")
    total = trainer.total_steps
    assert total % 5 == 0  # the periodic checkpoint falls on the last step, before the epoch's end
    assert [r["step"] for r in log_records(tmp_path, "eval")] == [trainer.steps_per_epoch, total]
    info = json.loads((checkpoint.latest(tmp_path / "run" / "checkpoints") / "trainer.json").read_text())
    assert info["step"] == total and info["metrics"]["dev"] == result.metrics["dev"]


def test_profile_traces_exactly_the_requested_steps(tmp_path, model_dir) -> None:
    fit(tmp_path, model_dir, "runtime.profile_steps=[3, 5]", "train.steps_per_execution=2")
    trace = json.loads((tmp_path / "run" / "profile" / "numpy_trace.json").read_text())
    assert [entry["step"] for entry in trace] == [3, 4, 5]


class DivergingBackend(NumpyBackend):
    """Reports a NaN loss (and poisons its state) from update `BAD_STEP` on."""

    BAD_STEP = 7

    def train_step(self, state, batch, learning_rate):
        state, loss = super().train_step(state, batch, learning_rate)
        if state.step >= self.BAD_STEP:
            poisoned = {**state.params, "classifier.bias": np.full_like(state.params["classifier.bias"], np.nan)}
            return dataclasses.replace(state, params=poisoned), float("nan")
        return state, loss


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, model_dir) -> None:
    with pytest.raises(TpuplexError) as error:
        fit(tmp_path, model_dir, "runtime.checkpoint_every=3", "runtime.keep_checkpoints=5",
            backend_cls=DivergingBackend)
    root = tmp_path / "run" / "checkpoints"
    assert str(error.value).startswith(f"loss became nan at step 7; last good checkpoint: {root / 'step-00000006'}")
    assert "lower train.learning_rate" in str(error.value)
    assert [p.name for p in checkpoint.checkpoints(root)] == ["step-00000003", "step-00000006"]
    assert not any(p.name.startswith(".") for p in root.iterdir())
    state, _ = checkpoint.load(root / "step-00000006")
    assert all(np.all(np.isfinite(a)) for a in state.params.values())
    assert log_records(tmp_path, "error")[0]["step"] == 7


class SilentlyDivergingBackend(NumpyBackend):
    """Finite losses, but a parameter the loss does not depend on (the pooler) overflows at every update."""

    def train_step(self, state, batch, learning_rate):
        state, loss = super().train_step(state, batch, learning_rate)
        inf = np.full_like(state.params["bert.pooler.dense.bias"], np.inf)
        return dataclasses.replace(state, params={**state.params, "bert.pooler.dense.bias": inf}), loss


def test_non_finite_parameters_are_never_checkpointed(tmp_path, model_dir) -> None:
    with pytest.raises(TpuplexError, match="parameter bert.pooler.dense.bias became non-finite at step 2; last good "
                                           "checkpoint: none"):
        fit(tmp_path, model_dir, "runtime.checkpoint_every=2", backend_cls=SilentlyDivergingBackend)
    assert checkpoint.checkpoints(tmp_path / "run" / "checkpoints") == []


@pytest.mark.parametrize("group_by_length", ["true", "false"])
def test_every_example_trains_once_per_epoch_in_either_order(tmp_path, model_dir, group_by_length) -> None:
    trainer, backend, result = fit(tmp_path, model_dir, f"data.group_by_length={group_by_length}",
                                   train=split(123, seed=1))
    assert trainer.steps_per_epoch == 16 and result.step == len(backend.steps) == 32  # ceil(123 / 8) per epoch
    assert {shape for shape, _ in backend.steps} <= {(8, 8), (8, 16), (8, 24)}
    assert np.all(np.isfinite(result.losses))


def test_a_split_smaller_than_one_batch_trains(tmp_path, model_dir) -> None:
    trainer, backend, result = fit(tmp_path, model_dir, train=split(7, seed=1))
    assert trainer.steps_per_epoch == 1 and len(backend.steps) == 2 and np.all(np.isfinite(result.losses))


def test_a_cpu_s_peak_is_measured_before_the_first_step(tmp_path, model_dir, monkeypatch) -> None:
    """Measured mid-run, the matrix rate shared the cores with the run's own threads: 106 GFLOP/s against 176
    before the first step, and ResNet-20 on CIFAR-10 printed an MFU of 120%."""
    from tpuplex import flops

    events: list[str] = []
    monkeypatch.setattr(flops, "cpu_matmul_flops", lambda: events.append("peak") or 1e11)

    class Recording(SpyBackend):
        def train_step(self, state, batch, learning_rate):
            events.append("step")
            return super().train_step(state, batch, learning_rate)

    trainer, _, _ = fit(tmp_path, model_dir, "train.max_steps=3", backend_cls=Recording)
    assert events[:2] == ["peak", "step"] and events.count("peak") == 1
    assert trainer.peak.flops_per_s == 1e11


class SteadyClock:
    """Simulated seconds, as `time` in the trainer's module: only the backend's steady work advances them."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def steady_fit(tmp_path: Path, model_dir: Path, monkeypatch, *overrides: str, counted: bool = False):
    """`fit` on a backend whose every update takes STEP simulated seconds, alone or in a group, every evaluation
    batch EVALUATION_BATCH and every checkpoint CHECKPOINT: 17 steps of 8 examples an epoch, all of one shape, so
    every window of steps runs at exactly 8 / STEP examples/s whatever cuts the groups."""
    clock = SteadyClock()
    monkeypatch.setattr(trainer_module, "time", clock)

    class Steady(SpyBackend):
        STEP, EVALUATION_BATCH, CHECKPOINT = 0.5, 30.0, 70.0

        def train_step(self, state, batch, learning_rate):
            clock.now += self.STEP
            return super().train_step(state, batch, learning_rate)

        def predict(self, state, batch):
            clock.now += self.EVALUATION_BATCH
            return super().predict(state, batch)

        def state_to_slices(self, state):
            clock.now += self.CHECKPOINT
            return super().state_to_slices(state)

    return fit(tmp_path, model_dir, "data.buckets=[]", "train.epochs=3", *overrides, backend_cls=Steady,
               train=split(17 * 8, seed=1), counted=counted)


# Groups of 10 (steps 1-10 and 41-50) cut short by the epochs' ends (17, 34), a checkpoint (20, 40) and an
# evaluation (25, 50), in log windows of 4 steps whose edges fall inside the groups (steps 9-12, 41-44).
CUT_GROUPS = ("train.steps_per_execution=10", "runtime.log_every=4", "runtime.eval_every=25",
              "runtime.checkpoint_every=20", "runtime.keep_checkpoints=1")


def test_every_window_rates_its_own_steps_however_groups_epochs_evaluations_and_checkpoints_cut_them(
        tmp_path, model_dir, monkeypatch) -> None:
    """Each step is charged its share of its group's time, so every window of the steady run has its steps' time
    (4 x 0.5 s, evaluations and checkpoints left out) and its examples/s is the run's; a group's first step used to
    take the whole group's time, a window of 4 steps inside a group of 10 getting 5 s or none."""
    trainer, backend, result = steady_fit(tmp_path, model_dir, monkeypatch, *CUT_GROUPS)
    assert trainer.steps_per_epoch == 17 and trainer.total_steps == 51
    assert [(done, len(shapes)) for done, shapes in backend.groups] == [(0, 10), (40, 10)]
    assert [r["step"] for r in log_records(tmp_path, "eval")] == [25, 50, 51]
    assert [r["step"] for r in log_records(tmp_path, "checkpoint")] == [20, 40, 51]
    run_rate = result.train.examples / result.train.seconds
    assert result.train.seconds == pytest.approx(51 * 0.5) and run_rate == pytest.approx(16.0)
    windows = log_records(tmp_path, "train")
    assert [w["step"] for w in windows] == [*range(4, 49, 4), 51]  # the last step closes a window of 3
    for window in windows:
        steps = 3 if window["step"] == 51 else 4
        assert window["examples_per_s"] == pytest.approx(run_rate, rel=0.1)
        assert window["examples"] == 8 * steps and window["seconds"] == pytest.approx(0.5 * steps)
    assert sum(w["seconds"] for w in windows) == pytest.approx(51 * 0.5)  # the windows add up to the run's steps


def test_history_and_tensorboard_carry_the_log_s_windows_and_their_mfu(tmp_path, model_dir, monkeypatch) -> None:
    """With the model counted, each window's MFU is its FLOPs over its seconds and the peak, the same in every
    window as over the run; `Run.history` and the TensorBoard scalars hold the numbers of log.jsonl."""
    from tpuplex.commands.api import Run

    trainer, _, result = steady_fit(tmp_path, model_dir, monkeypatch, *CUT_GROUPS, "runtime.peak_tflops=1e-4",
                                    counted=True)
    step_flops = trainer.train_flops({"input_ids": np.zeros((8, MAX_LENGTH), np.int32)}, result.state)
    run_mfu = result.train.summary(trainer.peak.flops_per_s)["mfu"]
    assert run_mfu == pytest.approx(step_flops / 0.5 / 1e8, rel=1e-3) and 0.1 < run_mfu < 1
    windows = log_records(tmp_path, "train")
    assert all(w["mfu"] == pytest.approx(run_mfu, rel=1e-3) for w in windows)
    assert Run(tmp_path / "run").history() == windows
    scalars = tensorboard_scalars(tmp_path / "run" / "tensorboard")
    for name in ("examples_per_s", "seconds", "mfu", "model_tflops_per_s", "loss"):
        assert scalars[f"train/{name}"] == {w["step"]: pytest.approx(w[name], rel=1e-6) for w in windows}


def test_an_mfu_above_the_peak_is_left_out_with_one_line_saying_why(tmp_path, model_dir, monkeypatch,
                                                                    capsys) -> None:
    """A peak below what the steps reach (a CPU's measured under a load that later eased) gives no MFU above
    100%: the records and results leave it out, the model TFLOP/s stay, and one line names the peak's source."""
    trainer, _, result = steady_fit(tmp_path, model_dir, monkeypatch, *CUT_GROUPS, "runtime.peak_tflops=1e-9",
                                    counted=True)
    windows = log_records(tmp_path, "train")
    assert all(w["mfu"] is None and w["model_tflops_per_s"] > 0 for w in windows)
    assert result.train.summary(trainer.peak.flops_per_s)["mfu"] is None
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("MFU left out")]
    assert len(said) == 1 and "runtime.peak_tflops = 1e-09" in said[0], said


def tensorboard_scalars(folder: Path) -> dict[str, dict[int, float]]:
    """tag -> step -> value of the scalars in `folder`'s event files (TFRecord: length, its CRC, the Event
    protobuf, its CRC)."""
    from tensorboardX.proto.event_pb2 import Event

    scalars: dict[str, dict[int, float]] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        at = 0
        while at < len(data):
            length = int.from_bytes(data[at:at + 8], "little")
            event = Event.FromString(data[at + 12:at + 12 + length])
            at += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, {})[event.step] = value.simple_value
    return scalars


def test_the_time_left_is_paced_by_the_steps_after_the_first_group(tmp_path, monkeypatch) -> None:
    """The first group's 30 s are mostly compilation: no time left is shown before a step after it, and then it
    is the pace of those steps (1 s each: 8 s for 8 steps), not 31 s over 2 steps."""
    import io

    from rich.console import Console

    from tpuplex.engine import run_log

    clock = iter([30.0, 31.0, 31.0])
    monkeypatch.setattr(run_log.time, "perf_counter", lambda: next(clock))
    shown = io.StringIO()
    with Reporter(tmp_path, console=Console(file=shown, width=200)) as reporter:
        reporter.start_progress(10, 0)
        reporter.record("train", 1, loss=0.5, examples_per_s=1.0)
        reporter.advance(1, 0.5, 1.0)  # at 30 s
        reporter.record("train", 2, loss=0.5, examples_per_s=1.0)  # at 31 s
    lines = shown.getvalue().splitlines()
    assert "eta" not in lines[0] and lines[1].endswith(" eta 0:00:08"), lines


def test_a_run_shorter_than_log_every_records_its_loss(tmp_path, model_dir) -> None:
    """The last step closes its log window, however short: `Run.history()` is never empty after training."""
    _, _, result = fit(tmp_path, model_dir, "train.max_steps=3", "runtime.log_every=100")
    windows = log_records(tmp_path, "train")
    assert [w["step"] for w in windows] == [3] and windows[0]["loss"] == pytest.approx(np.mean(result.losses))

"""A framework-free backend for testing the core: a linear classifier over frozen, mean-pooled word embeddings.

    features = sum_t(mask[b, t] * E[input_ids[b, t]]) / sum_t(mask[b, t])     float64 [B, H]
    logits   = features @ classifier.weight.T + classifier.bias               float64 [B, num_labels]

Only `classifier.weight` and `classifier.bias` train; every other parameter of the `ModelSpec` is carried through
unchanged, so a checkpoint it writes is a whole `BertForSequenceClassification` state any backend can read. The
update follows `tpuplex.protocol` exactly (per-replica weighted-mean losses, micro-batches, global-norm clip,
AdamW); the math runs in float64 and the state is stored in float32, so a checkpoint round trip is exact and a
resumed run continues bit for bit. `ModelSpec.dropout` and `OptimizerSpec.bf16` have nothing to act on here.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import ClassVar

import numpy as np

from tpuplex.checkpoints import check_names
from tpuplex.config import RuntimeConfig
from tpuplex.errors import TpuplexError
from tpuplex.hardware import Topology
from tpuplex.protocol import (
    BackendBase,
    Batch,
    ModelSpec,
    OptimizerSpec,
    PortableState,
    decays,
)

EMBEDDINGS = "bert.embeddings.word_embeddings.weight"
TRAINED = ("classifier.weight", "classifier.bias")


@dataclasses.dataclass(frozen=True)
class NumpyState:
    """params: every ModelSpec parameter (float32, HF names); exp_avg/exp_avg_sq: Adam moments of `TRAINED`."""

    params: dict[str, np.ndarray]
    exp_avg: dict[str, np.ndarray]
    exp_avg_sq: dict[str, np.ndarray]
    step: int
    num_labels: int
    optimizer: OptimizerSpec


class NumpyBackend(BackendBase):
    """`tpuplex.protocol.Backend` in numpy; `runtime.cpu_devices` sets the replica count (default 1)."""

    name: ClassVar[str] = "numpy"

    def __init__(self, runtime: RuntimeConfig):
        self._replicas = runtime.cpu_devices or 1
        self._programs: set[tuple[str, tuple[int, ...]]] = set()
        self._trace: list[dict] | None = None
        self._trace_dir: Path | None = None

    def topology(self) -> Topology:
        return Topology(kind="cpu", device_count=self._replicas, source="numpy",
                        detail="numpy linear probe over mean-pooled embeddings")

    def init(self, model: ModelSpec, optimizer: OptimizerSpec) -> NumpyState:
        if model.kind.name != "text":
            raise TpuplexError(f"the numpy backend (a linear probe for tests) trains text encoders only, not the "
                               f"{model.kind.name!r} kind of model: use --backend jax, torch or tf")
        if optimizer.bf16:
            print("tpuplex: warning: train.bf16 = true computes in bfloat16 on the jax, torch and tf backends; the "
                  "numpy backend computes in float64 and ignores it", file=sys.stderr)
        hidden = int(model.hf_config["hidden_size"])
        needed = {EMBEDDINGS: (int(model.hf_config["vocab_size"]), hidden),
                  "classifier.weight": (model.num_labels, hidden), "classifier.bias": (model.num_labels,)}
        check_names(needed, {name: model.params[name] for name in needed if name in model.params},
                    "the numpy backend's model parameters")
        params = {name: np.asarray(array, np.float32) for name, array in model.params.items()}
        zeros = {name: np.zeros_like(params[name]) for name in TRAINED}
        return NumpyState(params, zeros, {name: z.copy() for name, z in zeros.items()}, 0, model.num_labels,
                          optimizer)

    def train_step(self, state: NumpyState, batch: Batch, learning_rate: float) -> tuple[NumpyState, float]:
        self._programs.add(("train", batch["input_ids"].shape))
        started = time.perf_counter()
        features = _features(state.params[EMBEDDINGS], batch)
        labels, weight = batch["labels"], _weight(batch)
        weight_matrix, bias = (state.params[name].astype(np.float64) for name in TRAINED)
        # Replica r holds rows [r*B/R, (r+1)*B/R); each is cut into grad_accum equal micro-batches, and the
        # gradients of every micro-batch's weighted-mean loss are averaged (tpuplex.protocol).
        shards = self._replicas * state.optimizer.grad_accum
        grads = [_loss_and_grads(weight_matrix, bias, f, y, w, state.num_labels)[1:]
                 for f, y, w in zip(np.split(features, shards), np.split(labels, shards), np.split(weight, shards),
                                    strict=True)]
        grad = {name: np.mean([g[i] for g in grads], axis=0) for i, name in enumerate(TRAINED)}
        loss = _loss_and_grads(weight_matrix, bias, features, labels, weight, state.num_labels)[0]
        update = _sgd if state.optimizer.optimizer == "sgd" else _adamw
        new_state = update(state, _clip(grad, state.optimizer.clip_norm), learning_rate)
        if self._trace is not None:
            self._trace.append({"step": new_state.step, "shape": list(batch["input_ids"].shape),
                                "ms": 1000 * (time.perf_counter() - started)})
        return new_state, float(loss)

    def predict(self, state: NumpyState, batch: Batch) -> np.ndarray:
        self._programs.add(("predict", batch["input_ids"].shape))
        weight_matrix, bias = (state.params[name].astype(np.float64) for name in TRAINED)
        return (_features(state.params[EMBEDDINGS], batch) @ weight_matrix.T + bias).astype(np.float32)

    def state_to_arrays(self, state: NumpyState) -> PortableState:
        frozen = {name: np.zeros_like(a) for name, a in state.params.items() if name not in TRAINED}
        return PortableState(params=dict(state.params), exp_avg={**frozen, **state.exp_avg},
                             exp_avg_sq={**frozen, **state.exp_avg_sq}, step=state.step)

    def state_from_arrays(self, state: NumpyState, arrays: PortableState) -> NumpyState:
        expected = {name: a.shape for name, a in state.params.items()}
        check_names(expected, arrays.params, "checkpoint parameters")
        check_names(expected, arrays.exp_avg, "checkpoint first moments (exp_avg)")
        check_names(expected, arrays.exp_avg_sq, "checkpoint second moments (exp_avg_sq)")
        return dataclasses.replace(
            state,
            params={name: np.asarray(a, np.float32) for name, a in arrays.params.items()},
            exp_avg={name: np.asarray(arrays.exp_avg[name], np.float32) for name in TRAINED},
            exp_avg_sq={name: np.asarray(arrays.exp_avg_sq[name], np.float32) for name in TRAINED},
            step=arrays.step,
        )

    def compile_count(self) -> int:
        """Distinct (train or predict, batch shape) pairs seen: what a compiling backend would build."""
        return len(self._programs)

    def start_profile(self, logdir: Path) -> None:
        """Record each train step's shape and wall time until `stop_profile` writes `<logdir>/numpy_trace.json`."""
        self._trace, self._trace_dir = [], Path(logdir)

    def stop_profile(self) -> None:
        if self._trace is None or self._trace_dir is None:
            return
        self._trace_dir.mkdir(parents=True, exist_ok=True)
        (self._trace_dir / "numpy_trace.json").write_text(json.dumps(self._trace, indent=1))
        self._trace, self._trace_dir = None, None


def _weight(batch: Batch) -> np.ndarray:
    """float64 [B]: the batch's weights; training batches may omit them (every row real)."""
    if "weight" in batch:
        return np.asarray(batch["weight"], np.float64)
    return np.ones(len(batch["input_ids"]), np.float64)


def _features(embeddings: np.ndarray, batch: Batch) -> np.ndarray:
    """float64 [B, H]: the attention-masked mean of each row's word embeddings."""
    mask = batch["attention_mask"].astype(np.float64)
    summed = np.einsum("bt,bth->bh", mask, embeddings[batch["input_ids"]].astype(np.float64))
    return summed / np.maximum(mask.sum(axis=1, keepdims=True), 1.0)


def _loss_and_grads(weight_matrix: np.ndarray, bias: np.ndarray, features: np.ndarray, labels: np.ndarray,
                    weight: np.ndarray, num_labels: int) -> tuple[float, np.ndarray, np.ndarray]:
    """sum(w * loss_b) / max(sum(w), 1) and its gradients w.r.t. the classifier weight [C, H] and bias [C]."""
    logits = features @ weight_matrix.T + bias
    scale = weight / max(weight.sum(), 1.0)
    if num_labels == 1:
        error = logits[:, 0] - labels.astype(np.float64)
        loss = float(np.sum(scale * error**2))
        d_logits = (2.0 * scale * error)[:, None]
    else:
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        rows = np.arange(len(labels))
        loss = float(-np.sum(scale * log_probs[rows, labels]))
        d_logits = np.exp(log_probs)
        d_logits[rows, labels] -= 1.0
        d_logits *= scale[:, None]
    return loss, d_logits.T @ features, d_logits.sum(axis=0)


def _clip(grad: dict[str, np.ndarray], clip_norm: float) -> dict[str, np.ndarray]:
    """g * min(1, clip_norm / ||g||) over all gradients together; clip_norm 0 turns clipping off."""
    norm = float(np.sqrt(sum(np.sum(g**2) for g in grad.values())))
    if clip_norm <= 0 or norm == 0.0:
        return grad
    factor = min(1.0, clip_norm / norm)
    return {name: g * factor for name, g in grad.items()}


def _adamw(state: NumpyState, grad: dict[str, np.ndarray], learning_rate: float) -> NumpyState:
    opt = state.optimizer
    step = state.step + 1
    params, exp_avg, exp_avg_sq = dict(state.params), {}, {}
    for name in TRAINED:
        m = opt.beta1 * state.exp_avg[name].astype(np.float64) + (1 - opt.beta1) * grad[name]
        v = opt.beta2 * state.exp_avg_sq[name].astype(np.float64) + (1 - opt.beta2) * grad[name] ** 2
        p = state.params[name].astype(np.float64)
        update = (m / (1 - opt.beta1**step)) / (np.sqrt(v / (1 - opt.beta2**step)) + opt.epsilon)
        decay = opt.weight_decay * p if decays(name) else 0.0
        params[name] = (p - learning_rate * update - learning_rate * decay).astype(np.float32)
        exp_avg[name], exp_avg_sq[name] = m.astype(np.float32), v.astype(np.float32)
    return dataclasses.replace(state, params=params, exp_avg=exp_avg, exp_avg_sq=exp_avg_sq, step=step)


def _sgd(state: NumpyState, grad: dict[str, np.ndarray], learning_rate: float) -> NumpyState:
    """torch.optim.SGD with momentum (dampening 0), weight decay added to the gradient; the buffer is exp_avg."""
    opt = state.optimizer
    params, buffers = dict(state.params), {}
    for name in TRAINED:
        p = state.params[name].astype(np.float64)
        g = grad[name] + (opt.weight_decay * p if decays(name) else 0.0)
        buffer = opt.momentum * state.exp_avg[name].astype(np.float64) + g
        params[name] = (p - learning_rate * (g + opt.momentum * buffer if opt.nesterov else buffer)).astype(np.float32)
        buffers[name] = buffer.astype(np.float32)
    return dataclasses.replace(state, params=params, exp_avg=buffers, step=state.step + 1)

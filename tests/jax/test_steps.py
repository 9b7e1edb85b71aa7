"""The train step follows tpuplex.protocol: replicas and micro-batches change nothing, and the update equals the
protocol's formulas written out with torch autograd on HF BertForSequenceClassification."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import backend, batch_of, encoded_split, model_spec
from test_model import torch_reference

import torch
from tpuplex.protocol import OptimizerSpec, decays

LEARNING_RATES = (1e-3, 5e-4)


def run_jax(spec, optimizer, batches, devices: int):
    jax_backend = backend(devices)
    state = jax_backend.init(spec, optimizer)
    losses = []
    for batch, learning_rate in zip(batches, LEARNING_RATES, strict=True):
        state, loss = jax_backend.train_step(state, batch, learning_rate)
        losses.append(loss)
    return jax_backend.state_to_arrays(state), losses


def run_protocol_in_torch(spec, optimizer: OptimizerSpec, batches):
    """The update rule of tpuplex.protocol, step by step, on the HF torch model (dropout off)."""
    model = torch_reference(spec)
    params = dict(model.named_parameters())
    exp_avg = {name: torch.zeros_like(p) for name, p in params.items()}
    exp_avg_sq = {name: torch.zeros_like(p) for name, p in params.items()}
    losses = []
    for step, (batch, learning_rate) in enumerate(zip(batches, LEARNING_RATES, strict=True), start=1):
        model.zero_grad()
        logits = model(**{name: torch.from_numpy(batch[name]).long()
                          for name in ("input_ids", "token_type_ids", "attention_mask")}).logits
        labels, weight = torch.from_numpy(batch["labels"]), torch.from_numpy(batch["weight"])
        per_example = (torch.square(logits[:, 0] - labels) if spec.num_labels == 1
                       else torch.nn.functional.cross_entropy(logits, labels.long(), reduction="none"))
        loss = torch.sum(weight * per_example) / torch.clamp(weight.sum(), min=1.0)
        loss.backward()
        losses.append(float(loss.detach()))
        with torch.no_grad():
            norm = torch.sqrt(sum(torch.sum(p.grad**2) for p in params.values()))
            scale = min(1.0, optimizer.clip_norm / float(norm))
            for name, p in params.items():
                g = p.grad * scale
                exp_avg[name].mul_(optimizer.beta1).add_((1 - optimizer.beta1) * g)
                exp_avg_sq[name].mul_(optimizer.beta2).add_((1 - optimizer.beta2) * g * g)
                m_hat = exp_avg[name] / (1 - optimizer.beta1**step)
                v_hat = exp_avg_sq[name] / (1 - optimizer.beta2**step)
                decay = learning_rate * optimizer.weight_decay * p if decays(name) else 0.0
                p.sub_(learning_rate * m_hat / (torch.sqrt(v_hat) + optimizer.epsilon) + decay)
    as_numpy = lambda tensors: {name: t.detach().numpy() for name, t in tensors.items()}  # noqa: E731
    return as_numpy(params), as_numpy(exp_avg), as_numpy(exp_avg_sq), losses


def assert_trees_close(actual: dict, expected: dict, atol: float) -> None:
    assert actual.keys() == expected.keys()
    worst = max(actual, key=lambda name: np.max(np.abs(actual[name] - expected[name])))
    np.testing.assert_allclose(actual[worst], expected[worst], atol=atol, rtol=0, err_msg=worst)


@pytest.mark.parametrize("num_labels", [2, 1])
def test_two_steps_on_8_replicas_follow_the_protocol(tiny_dir, num_labels):
    spec = model_spec(tiny_dir, num_labels=num_labels)
    data = encoded_split(32, num_labels=num_labels)
    batches = [batch_of(data, slice(0, 16)), batch_of(data, slice(16, 32))]
    # clip_norm below the gradient norm of this model, so clipping is exercised.
    optimizer = OptimizerSpec(weight_decay=0.1, clip_norm=0.05)
    state, losses = run_jax(spec, optimizer, batches, devices=8)
    params, exp_avg, exp_avg_sq, expected_losses = run_protocol_in_torch(spec, optimizer, batches)
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    assert state.step == 2
    assert_trees_close(state.params, params, atol=1e-5)
    assert_trees_close(state.exp_avg, exp_avg, atol=1e-6)
    assert_trees_close(state.exp_avg_sq, exp_avg_sq, atol=1e-8)


def test_one_step_on_8_devices_equals_1_device_with_the_whole_batch(tiny_dir):
    spec = model_spec(tiny_dir)
    batches = [batch_of(encoded_split(16, seed=2))] * 2
    one, one_losses = run_jax(spec, OptimizerSpec(), batches, devices=1)
    assert not np.allclose(one.params["classifier.weight"], spec.params["classifier.weight"])  # it did train
    for grad_accum in (1, 2):  # 2 rows per replica, then 2 micro-batches of 1 row
        eight, eight_losses = run_jax(spec, OptimizerSpec(grad_accum=grad_accum), batches, devices=8)
        np.testing.assert_allclose(eight_losses, one_losses, rtol=1e-6)
        assert_trees_close(eight.params, one.params, atol=1e-5)


def test_weighted_loss_is_exact_across_replicas(tiny_dir):
    """Weights spread unevenly over replicas still give sum(w * loss) / sum(w) of the whole batch."""
    spec = model_spec(tiny_dir)
    batch = batch_of(encoded_split(16, seed=3))
    batch["weight"] = np.array([1.0] * 3 + [0.0] * 13, np.float32)  # only the first replica has real rows
    jax_backend = backend(8)
    state = jax_backend.init(spec, OptimizerSpec())
    logits = jax_backend.predict(state, batch)
    log_probs = logits - np.log(np.sum(np.exp(logits), axis=1, keepdims=True))
    expected = -np.mean(log_probs[np.arange(3), batch["labels"][:3]])
    _, loss = jax_backend.train_step(state, batch, 0.0)
    assert loss == pytest.approx(expected, rel=1e-5)

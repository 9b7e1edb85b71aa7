"""Your own torch.nn.Module through the torch backend: the example TextCNN trains and resumes exactly; a model
that cannot be imported, or returns the wrong shape, is one clear error naming it."""

from __future__ import annotations

import pytest
import user_model_checks as checks
from helpers import backend

import torch
from tpuplex.errors import TpuplexError
from tpuplex.protocol import OptimizerSpec
from tpuplex.tasks.sequence_classification import mean_loss


class WrongShape(torch.nn.Module):
    def __init__(self, vocab_size: int, num_labels: int):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab_size, num_labels + 1)

    def forward(self, input_ids, token_type_ids, attention_mask):
        return self.embedding(input_ids).mean(dim=1)  # one column too many


def test_textcnn_resumes_exactly():
    checks.check_resume_equals_uninterrupted(backend)


def test_parameters_keep_torch_names():
    state = backend().init(checks.spec(), OptimizerSpec())
    names = set(backend().state_to_arrays(state).params)
    assert {"embedding.weight", "convolutions.0.weight", "classifier.bias"} <= names


@pytest.mark.parametrize("dropout", [False, True])
def test_dropout_off_trains_on_the_eval_mode_outputs(dropout):
    """The first step's training loss is the cross-entropy of the eval-mode logits exactly when dropout is off."""
    torch_backend = backend()
    state = torch_backend.init(checks.spec(dropout=dropout), OptimizerSpec())
    batch = checks.batches(1)[0]
    real = batch["weight"] > 0
    expected = mean_loss(torch_backend.predict(state, batch)[real], batch["labels"][real])
    _, loss = torch_backend.train_step(state, batch, 1e-3)
    if dropout:
        assert abs(loss - expected) > 1e-3
    else:
        assert loss == pytest.approx(expected, abs=1e-6)


def test_a_model_with_the_wrong_output_shape_is_named():
    architecture = f"{__name__}:WrongShape"
    torch_backend = backend()
    state = torch_backend.init(checks.spec(architecture), OptimizerSpec())
    with pytest.raises(TpuplexError, match=r"'test_user_model:WrongShape' returned an output of shape \(8, 3\) "
                                           r"for a batch of 8 rows: it must return logits of shape \[8, 2\]"):
        torch_backend.train_step(state, checks.batches(1)[0], 1e-3)


def test_a_model_that_cannot_be_imported_is_named():
    with pytest.raises(TpuplexError, match=r"'no_such_package.models:Net' cannot be imported \(ModuleNotFound"):
        backend().init(checks.spec("no_such_package.models:Net"), OptimizerSpec())


def test_the_framework_counts_the_forward_flops():
    checks.check_the_framework_counts_its_forward_flops(backend(), padding_taps=True, exact=True)


def test_one_of_two_processes_counts_the_whole_batch(monkeypatch):
    """Of two torch processes, each puts half the rows on its device: the count is still the global batch's."""
    torch_backend = backend()
    state = torch_backend.init(checks.spec(), OptimizerSpec())
    batch = checks.batches(1)[0]
    whole = torch_backend.forward_flops(state, batch)
    put = torch_backend.placement.put
    monkeypatch.setattr(torch_backend.placement, "put", lambda rows: {name: tensor[: len(tensor) // 2]
                                                                      for name, tensor in put(rows).items()})
    assert torch_backend.forward_flops(state, batch) == whole

"""Your own Flax module through the JAX backend: the example TextCNN trains and resumes exactly, also over
several devices; a model that cannot be imported, or returns the wrong shape, is one clear error naming it."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import pytest
import user_model_checks as checks
from helpers import backend

from tpuplex.errors import TpuplexError
from tpuplex.protocol import OptimizerSpec


class WrongShape(nn.Module):
    vocab_size: int
    num_labels: int

    @nn.compact
    def __call__(self, input_ids, token_type_ids, attention_mask, deterministic=True):
        return jnp.mean(nn.Embed(self.vocab_size, self.num_labels + 1)(input_ids), axis=1)  # a column too many


def test_textcnn_resumes_exactly():
    checks.check_resume_equals_uninterrupted(lambda: backend(1))


def test_two_devices_train_like_one():
    steps = checks.batches(3)
    _, one = checks.train(backend(1), checks.spec(dropout=False), steps)
    _, two = checks.train(backend(2), checks.spec(dropout=False), steps)
    np.testing.assert_allclose(two, one, rtol=1e-5)


def test_parameters_keep_flax_names_and_layout():
    jax_backend = backend(1)
    params = jax_backend.state_to_arrays(jax_backend.init(checks.spec(), OptimizerSpec())).params
    assert params["Embed_0.embedding"].shape == (checks.VOCAB, 128)
    assert params["Conv_0.kernel"].shape == (3, 128, 100)  # Flax's [width, in, out], not torch's layout


def test_a_model_with_the_wrong_output_shape_is_named():
    with pytest.raises(TpuplexError, match=r"'test_user_model:WrongShape' returned an output of shape \(2, 3\) "
                                           r"for a batch of 2 rows: it must return logits of shape \[2, 2\]"):
        backend(1).init(checks.spec(f"{__name__}:WrongShape"), OptimizerSpec())


def test_a_model_that_cannot_be_imported_is_named():
    with pytest.raises(TpuplexError, match=r"'no_such_package.models:Net' cannot be imported \(ModuleNotFound"):
        backend(1).init(checks.spec("no_such_package.models:Net"), OptimizerSpec())


def test_the_framework_counts_the_forward_flops():
    checks.check_the_framework_counts_its_forward_flops(backend(2), padding_taps=False, exact=False)

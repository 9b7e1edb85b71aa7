"""A portable checkpoint of every family and task, written by any backend, is read by the other two with equal
outputs.

All three backends live in this session's one environment (one CPU device each), so each pair is compared in one
process: a few training steps on the writer (moments and step count non-trivial), `tpuplex.engine.checkpoint.save`,
then `load` + `state_from_arrays` on each reader, whose predict outputs must equal the writer's. The masked-LM
checkpoint holds the decoder once, as the word embeddings, and stays tied on every reader.

The fast tier runs 15 of the 45 (family, writer, task) cases, a Latin square: each family written once by each
backend and once for each task, so every family, task, writer and reader is in it and every (writer, task) pair;
the long tier runs the other 30.
"""

from __future__ import annotations

import hf_families
import mlm_checks
import ner_checks
import numpy as np
import pytest
from hf_families import FAMILIES, write_checkpoint

from tpuplex.config import RuntimeConfig
from tpuplex.engine import checkpoint
from tpuplex.kinds.text import expected_shapes
from tpuplex.protocol import OptimizerSpec
from tpuplex_jax.backend import JaxBackend
from tpuplex_tf.backend import TfBackend
from tpuplex_torch.backend import TorchBackend

BACKENDS = {"torch": TorchBackend, "jax": JaxBackend, "tf": TfBackend}
LOGIT_TOLERANCE = 1e-5  # float32 kernels of three frameworks: same numbers up to summation order


@pytest.fixture(scope="module")
def family_dir(request, tmp_path_factory):
    return write_checkpoint(request.param, tmp_path_factory.mktemp(request.param))


def classification(directory):
    batches = hf_families.train_batches(directory, global_batch=4, count=3)
    return (hf_families.model_spec(directory, num_labels=3), [{**b, "labels": b["labels"] % 3} for b in batches],
            hf_families.eval_batch(directory, num_labels=3))


def masked_lm(directory):
    batches = mlm_checks.batches(directory, 4, 4)
    return mlm_checks.spec(directory), batches[:3], batches[3]


def token_classification(directory):
    batches = ner_checks.batches(directory, 4, 4)
    return ner_checks.spec(directory), batches[:3], batches[3]


TASKS = {"sequence_classification": classification, "masked_lm": masked_lm,
         "token_classification": token_classification}


CASES = [pytest.param(family, writer, task, id=f"{family}-{writer}-{task}",
                      marks=() if (f + w) % len(TASKS) == t else pytest.mark.long)
         for f, family in enumerate(FAMILIES) for w, writer in enumerate(BACKENDS) for t, task in enumerate(TASKS)]


@pytest.mark.parametrize(("family_dir", "writer", "task"), CASES, indirect=["family_dir"])
def test_every_backend_reads_the_checkpoint(family_dir, writer, task, tmp_path):
    spec, steps, batch = TASKS[task](family_dir)
    source = BACKENDS[writer](RuntimeConfig(cpu_devices=1))
    state = source.init(spec, OptimizerSpec())
    for index, train_batch in enumerate(steps):
        state, _ = source.train_step(state, train_batch, 1e-3 * (index + 1))
    written = checkpoint.save(tmp_path / "checkpoints", source.state_to_arrays(state), {"step": 3}, keep=1)
    expected = source.predict(state, batch)
    assert not np.allclose(expected, source.predict(source.init(spec, OptimizerSpec()), batch), atol=1e-4)

    arrays, _ = checkpoint.load(written)
    assert set(arrays.params) == set(expected_shapes(spec.hf_config, spec.head))
    for reader in set(BACKENDS) - {writer}:
        target = BACKENDS[reader](RuntimeConfig(cpu_devices=1))
        restored = target.state_from_arrays(target.init(spec, OptimizerSpec()), arrays)
        np.testing.assert_allclose(target.predict(restored, batch), expected, atol=LOGIT_TOLERANCE, rtol=0,
                                   err_msg=f"{writer} -> {reader}")
        again = target.state_to_arrays(restored)
        assert again.step == 3
        assert all(np.array_equal(again.exp_avg[name], arrays.exp_avg[name]) for name in arrays.exp_avg)
        assert set(again.params) == set(arrays.params)  # the tied decoder is still no parameter of its own

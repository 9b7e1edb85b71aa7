"""`runtime.torch_mode = "compile"`: the same training as eager mode (dropout on, so the masks must match too),
one compiled program per batch shape and none after the shapes have been seen."""

from __future__ import annotations

import numpy as np
from helpers import assert_params_close, backend, learning_rates, run, tiny_spec, train_batches

from tpuplex.protocol import OptimizerSpec


def test_compiled_training_matches_eager_and_compiles_once_per_shape(tmp_path):
    spec = tiny_spec(tmp_path, dropout=True)
    batches = train_batches(8, 6)
    shapes = {batch["input_ids"].shape for batch in batches}
    assert len(shapes) == 2, "the batches should use both bucket lengths"
    rates = learning_rates(len(batches))
    eager = backend("eager")
    eager_state, eager_losses = run(eager, spec, batches, rates, OptimizerSpec(seed=3))
    compiled = backend("compile")
    compiled_state, compiled_losses = run(compiled, spec, batches, rates, OptimizerSpec(seed=3))

    np.testing.assert_allclose(compiled_losses, eager_losses, rtol=1e-6)
    assert_params_close(compiled.state_to_arrays(compiled_state), eager.state_to_arrays(eager_state), atol=1e-6)
    assert compiled.compile_count() == len(shapes)
    compiled.train_steps(compiled_state, batches, rates)
    assert compiled.compile_count() == len(shapes)
    assert eager.compile_count() == 0
    assert "torch eager + torch.compile; runtime.torch_mode = compile" in compiled.topology().report()

"""The learning-rate schedules the core computes (`tpuplex.engine.schedule`) against optax's own."""

from __future__ import annotations

import numpy as np
import optax
import pytest

from tpuplex.engine.schedule import SCHEDULES

TOTAL, WARMUP, PEAK = 37, 5, 3e-3
OPTAX = {
    "linear": optax.join_schedules([optax.linear_schedule(0.0, PEAK, WARMUP),
                                    optax.linear_schedule(PEAK, 0.0, TOTAL - WARMUP)], [WARMUP]),
    "cosine": optax.warmup_cosine_decay_schedule(0.0, PEAK, WARMUP, TOTAL, end_value=0.0),
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_schedule_equals_optax(name):
    ours = [SCHEDULES[name](step, peak=PEAK, warmup=WARMUP, total=TOTAL) for step in range(TOTAL + 1)]
    expected = [float(OPTAX[name](step)) for step in range(TOTAL + 1)]
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-12)  # optax evaluates in float32

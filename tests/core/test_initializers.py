"""The core's initial draw (`tpuplex.initializers`): any block alone equals that block of the whole draw, and a
block is drawn without drawing the rest."""

from __future__ import annotations

import numpy as np
import pytest

from tpuplex import initializers
from tpuplex.initializers import _Stream


def _random_block(rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[slice, ...]:
    starts = [int(rng.integers(0, size)) for size in shape]
    return tuple(slice(start, int(rng.integers(start + 1, size + 1)))
                 for start, size in zip(starts, shape, strict=True))


@pytest.mark.parametrize("shape", [(37, 53, 7), (200, 3), (1000,), (4, 1, 9, 2), ()])
@pytest.mark.parametrize("draw", [lambda shape: initializers.normal(3, "a.weight", shape, 0.02),
                                  lambda shape: initializers.uniform(3, "a.weight", shape, 0.5)],
                         ids=["normal", "uniform"])
def test_a_block_drawn_alone_is_that_block_of_the_whole_draw(shape, draw) -> None:
    parameter = draw(shape)
    whole = np.asarray(parameter)
    assert whole.shape == shape and whole.dtype == np.float32
    rng = np.random.default_rng(0)
    for _ in range(100 if shape else 1):
        block = _random_block(rng, shape)
        np.testing.assert_array_equal(parameter[block], whole[block])


def test_the_draws_have_their_distributions_and_their_keys() -> None:
    normal = np.asarray(initializers.normal(0, "w", (400, 500), 0.02))
    assert abs(normal.mean()) < 2e-4 and abs(normal.std() / 0.02 - 1) < 0.01
    assert 0.31 < np.mean(np.abs(normal) < 0.01) < 0.39  # P(|z| < 0.5) = 0.383 for a normal, 0.5 for a uniform
    clipped = np.asarray(initializers.normal(0, "w", (400, 500), 1.0, clip=2.0))
    assert clipped.max() == 2.0 and clipped.min() == -2.0
    uniform = np.asarray(initializers.uniform(0, "w", (400, 500), 0.5))
    assert -0.5 <= uniform.min() < -0.499 and 0.499 < uniform.max() < 0.5 and abs(uniform.std() * 3**0.5 - 0.5) < 0.01
    again, other_name, other_seed = (np.asarray(initializers.normal(seed, name, (400, 500), 0.02))
                                     for seed, name in ((0, "w"), (0, "v"), (1, "w")))
    assert np.array_equal(normal, again)
    assert abs(np.corrcoef(normal.ravel(), other_name.ravel())[0, 1]) < 0.01
    assert abs(np.corrcoef(normal.ravel(), other_seed.ravel())[0, 1]) < 0.01


def test_a_block_is_drawn_without_drawing_the_rest(monkeypatch) -> None:
    """A block of rows (dimension 0, how fsdp splits a tall matrix) costs exactly its own elements; a block of
    columns reads past the other columns' outputs (no transform) and never goes beyond its rows."""
    read: list[tuple[int, int]] = []
    original = _Stream.read

    def counted(self, offset: int, count: int) -> np.ndarray:
        read.append((offset, count))
        return original(self, offset, count)

    monkeypatch.setattr(_Stream, "read", counted)
    parameter = initializers.normal(0, "embed", (4096, 64), 0.02)
    parameter[1024:2048, :]
    assert sum(count for _, count in read) == 1024 * 64 and min(offset for offset, _ in read) == 1024 * 64
    read.clear()
    parameter[:, 16:32]
    assert sum(count for _, count in read) == 4096 * 16

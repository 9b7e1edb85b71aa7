"""Several sides of one comparison timed in one process, in turn, so machine noise hits every side alike."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "glue" / "configs" / "mrpc.toml"
"""The experiment every round-robin comparison builds its sides from (MRPC, the fixed [32, 128] shape with
`data.bucket_count=0`)."""


def time_in_turn(sides: dict[str, Callable[[int], object]], rounds: int, steps: int,
                 warmup: int = 2) -> dict[str, list[float]]:
    """Milliseconds per call of each side in each round.

    Every side is first called `warmup` times (compiles, allocations, warm caches); then each of `rounds` rounds
    calls every side `steps` times in turn, with call index 0 .. steps - 1. A call must return only once its work
    is done (read a result back to the host).
    """
    for call in sides.values():
        for i in range(warmup):
            call(i)
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, call in sides.items():
            started = time.perf_counter()
            for i in range(steps):
                call(i)
            times[name].append(1000 * (time.perf_counter() - started) / steps)
    return times


def arguments(description: str) -> argparse.Namespace:
    """The command line of a round-robin comparison on MRPC: --data-dir, --rounds, --steps (calls per round)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--data-dir", required=True, help="the MRPC GLUE folder")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3, help="calls of each side per round")
    return parser.parse_args()


def print_medians(times: dict[str, list[float]]) -> None:
    """One line per side: its median ms per call over the rounds, then each round's."""
    for name, rounds in times.items():
        print(f"{name:34} {statistics.median(rounds):7.0f} ms  ({', '.join(f'{t:.0f}' for t in rounds)})")

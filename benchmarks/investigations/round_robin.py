"""Several sides of one comparison timed in one process, in turn, so machine noise hits every side alike."""

from __future__ import annotations

import argparse
import itertools
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from tpuplex import config as config_lib
from tpuplex.commands import run

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "glue" / "configs" / "mrpc.toml"
"""The experiment every round-robin comparison builds its sides from (MRPC, the fixed [32, 128] shape with
`data.bucket_count=0`)."""


def fixed_shape_experiment(backend: str, data_dir: str, dropout: bool) -> tuple[run.Experiment, list[dict]]:
    """`CONFIG` prepared on `backend` at its fixed [32, 128] shape, dropout on or off, with MRPC from `data_dir`;
    (the experiment, the first 4 batches of its first epoch, which every side cycles through)."""
    config = config_lib.load(CONFIG, ["data.bucket_count=0", f'data.data_dir="{data_dir}"',
                                      f"model.dropout={str(dropout).lower()}"])
    experiment = run.prepare(config, backend, str(CONFIG))
    return experiment, list(itertools.islice(experiment.trainer.train_batcher.train_batches(epoch=0), 4))


class Rounds(NamedTuple):
    """One side's cost per call in each round.

    wall_ms: elapsed time. cpu_ms: the process's CPU time (user + system, all threads), so cpu_ms / wall_ms is
    how many cores the side kept busy. system_ms: the kernel's share of it. minor_faults: pages the process
    touched for the first time since the kernel handed them (memory freed back to the OS and allocated again).
    """

    wall_ms: list[float]
    cpu_ms: list[float]
    system_ms: list[float]
    minor_faults: list[float]


def time_in_turn(sides: dict[str, Callable[[int], object]], rounds: int, steps: int,
                 warmup: int = 2) -> dict[str, Rounds]:
    """What each call of each side costs, round by round.

    Every side is first called `warmup` times (compiles, allocations, warm caches); then each of `rounds` rounds
    calls every side `steps` times in turn, with call index 0 .. steps - 1. A call must return only once its work
    is done (read a result back to the host).
    """
    for call in sides.values():
        for i in range(warmup):
            call(i)
    costs = {name: Rounds([], [], [], []) for name in sides}
    for _ in range(rounds):
        for name, call in sides.items():
            usage, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            for i in range(steps):
                call(i)
            wall, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF)
            system = after.ru_stime - usage.ru_stime
            costs[name].wall_ms.append(1000 * wall / steps)
            costs[name].cpu_ms.append(1000 * (after.ru_utime - usage.ru_utime + system) / steps)
            costs[name].system_ms.append(1000 * system / steps)
            costs[name].minor_faults.append((after.ru_minflt - usage.ru_minflt) / steps)
    return costs


def arguments(description: str) -> argparse.Namespace:
    """The command line of a round-robin comparison on MRPC: --data-dir, --rounds, --steps (calls per round)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--data-dir", required=True, help="the MRPC GLUE folder")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3, help="calls of each side per round")
    return parser.parse_args()


def print_medians(costs: dict[str, Rounds], base: str | None = None) -> None:
    """One line per side: its median ms per call over the rounds, then each round's; the median CPU ms per call
    (cores kept busy), its system share and minor page faults; with `base`, base's median wall time over this
    side's (> 1: this side is faster)."""
    for name, rounds in costs.items():
        wall, cpu = statistics.median(rounds.wall_ms), statistics.median(rounds.cpu_ms)
        ratio = f"  {base}/this {statistics.median(costs[base].wall_ms) / wall:.3f}" if base else ""
        print(f"{name:34} {wall:7.1f} ms  ({', '.join(f'{t:.1f}' for t in rounds.wall_ms)})  "
              f"CPU {cpu:6.0f} ms ({cpu / wall:.2f} cores, system {statistics.median(rounds.system_ms):4.0f}, "
              f"{statistics.median(rounds.minor_faults):7.0f} faults){ratio}")

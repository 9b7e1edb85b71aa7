"""Where tpuplex-torch's fixed-shape step stands against run_glue_no_trainer's loop: each step, split into its parts.

    python benchmarks/investigations/torch_step_cost.py --data-dir ../shared/glue/MRPC  # in .nox/speed-torch

Builds, in one process, at the fixed [32, 128] shape of `mrpc.toml`:
- tpuplex-torch's whole step (`TorchBackend.train_step`, what `tpuplex train` calls), with dropout on and off, and
  its parts: the forward and backward pass (`tpuplex_torch.step.train_step` up to `backward`) and clip + AdamW;
- run_glue_no_trainer.py's loop step as `benchmarks/peer_loops.py` runs it (`model(**batch).loss`, backward,
  `clip_grad_norm_`, AdamW, the linear schedule, `zero_grad`) on the same checkpoint, with dropout on and off, and
  the same two parts.
Warms each side up for two calls, then times three calls of each side in turn, three rounds, so machine noise hits
every side alike. Prints each side's median ms per call and its CPU time per call (cores kept busy, the kernel's
share, minor page faults). Nothing is written.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: peer_loops.py
import numpy as np
from peer_loops import torch_loop_setup
from round_robin import (  # benchmarks/investigations/ is on sys.path when this script runs
    CONFIG,
    arguments,
    fixed_shape_experiment,
    print_medians,
    time_in_turn,
)

import torch
from tpuplex import checkpoints
from tpuplex import config as config_lib
from tpuplex_torch.step import _clip_by_global_norm

LEARNING_RATE = 1e-5
LOOP_INPUTS = ("input_ids", "token_type_ids", "attention_mask", "labels")


def tpuplex_sides(data_dir: str, dropout: bool) -> tuple[dict[str, Callable[[int], object]], list[dict]]:
    """tpuplex-torch's step and, with dropout on, its parts; (name -> call(i), the 4 batches they cycle through)."""
    experiment, batches = fixed_shape_experiment("torch", data_dir, dropout)
    backend, state = experiment.backend, experiment.state
    suffix = "" if dropout else ", no dropout"
    sides: dict[str, Callable[[int], object]] = {
        f"tpuplex step{suffix}": lambda i: backend.train_step(state, batches[i % 4], LEARNING_RATE)}
    if not dropout:
        return sides, batches
    placement, model = backend.placement, state.model

    def forward_backward(i: int) -> None:
        model.zero_grad(set_to_none=True)
        inputs = placement.put(batches[i % 4])
        model.train()
        total_weight = inputs["weight"].sum().clamp(min=1.0)
        (state.train_loss(model, inputs) / total_weight).backward()

    forward_backward(0)

    def clip_adamw(i: int) -> None:
        _clip_by_global_norm([p for p in model.parameters() if p.grad is not None], state.spec.clip_norm)
        for group in state.optimizer.param_groups:
            group["lr"] = LEARNING_RATE
        state.optimizer.step()

    sides.update({"tpuplex forward + backward": forward_backward, "tpuplex clip + AdamW": clip_adamw})
    return sides, batches


def loop_sides(batches: list[dict], dropout: bool) -> dict[str, Callable[[int], object]]:
    """run_glue_no_trainer.py's model, optimizer and loop step and, with dropout on, its parts."""
    recipe = config_lib.load(CONFIG)
    train = dataclasses.replace(recipe.train, learning_rate=LEARNING_RATE, warmup_ratio=0.01)
    rates = {} if dropout else {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    model, optimizer, schedule = torch_loop_setup(checkpoints.resolve_checkpoint(recipe.model.checkpoint), 2, train,
                                                  1000, **rates)
    tensors = [{key: torch.from_numpy(np.asarray(b[key], np.int64)) for key in LOOP_INPUTS} for b in batches]
    model.train()

    def forward_backward(i: int) -> None:
        model(**tensors[i % 4]).loss.backward()

    def clip_adamw(i: int) -> None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), train.clip_norm)
        optimizer.step()
        schedule.step()

    def whole(i: int) -> None:
        forward_backward(i)
        clip_adamw(i)
        optimizer.zero_grad()

    suffix = "" if dropout else ", no dropout"
    sides: dict[str, Callable[[int], object]] = {f"torch loop step{suffix}": whole}
    if dropout:
        forward_backward(0)
        sides.update({"torch loop forward + backward": lambda i: (optimizer.zero_grad(), forward_backward(i)),
                      "torch loop clip + AdamW": clip_adamw})
    return sides


def main() -> None:
    args = arguments(__doc__.splitlines()[0])
    sides, batches = tpuplex_sides(args.data_dir, dropout=True)
    sides.update(tpuplex_sides(args.data_dir, dropout=False)[0])
    sides.update(loop_sides(batches, dropout=True))
    sides.update(loop_sides(batches, dropout=False))
    times = time_in_turn(sides, args.rounds, args.steps)
    print_medians(times)


if __name__ == "__main__":
    main()

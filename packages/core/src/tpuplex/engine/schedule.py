"""The learning-rate schedule, defined once so every backend follows the same curve.

The Trainer evaluates it on the host and hands each step its learning rate, so no backend re-implements it.
"""

import math


def warmup_steps(total_steps: int, warmup_ratio: float) -> int:
    """Number of warmup steps: `ceil(total_steps * warmup_ratio)`, as in HF's `get_linear_schedule_with_warmup` use."""
    return math.ceil(total_steps * warmup_ratio)


def warmup_linear_decay(step: int, *, peak: float, warmup: int, total: int, floor: float = 0.0) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warmup to `peak`, then linear decay to 0 at `total`.

    Matches HF `get_linear_schedule_with_warmup`: lr(step) = peak * step / warmup while step < warmup,
    then peak * (total - step) / (total - warmup), never below 0; with a `floor`, from peak to floor instead.
    """
    if step < warmup:
        return peak * step / max(1, warmup)
    return floor + (peak - floor) * max(0.0, (total - step) / max(1, total - warmup))


def warmup_cosine_decay(step: int, *, peak: float, warmup: int, total: int, floor: float = 0.0) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warmup to `peak`, then half a cosine to `floor` at
    `total`, as HF's `get_cosine_schedule_with_warmup` (num_cycles 0.5) for floor 0 and nanoGPT's `get_lr` (its
    `min_lr`) otherwise: floor + (peak - floor) * 0.5 * (1 + cos(pi * progress)),
    progress = min(1, (step - warmup) / (total - warmup))."""
    if step < warmup:
        return peak * step / max(1, warmup)
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return max(0.0, floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress)))


SCHEDULES = {"linear": warmup_linear_decay, "cosine": warmup_cosine_decay}
"""`train.schedule` -> the learning rate of each step."""

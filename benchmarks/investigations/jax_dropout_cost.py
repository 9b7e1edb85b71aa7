"""Where tpuplex-jax's fixed-shape step loses to run_flax_glue's: the cost of each side's dropout.

    python benchmarks/investigations/jax_dropout_cost.py --data-dir ../shared/glue/MRPC  # in .nox/speed-jax

Builds, in one process, tpuplex-jax's train step at the fixed [32, 128] shape of `mrpc.toml` (dropout drawn with
JAX's default threefry keys, with `rbg` keys, and dropout off) and run_flax_glue's step on transformers 4.57's
`FlaxBertForSequenceClassification` (dropout on as HF ships it, on with one attention mask element per example and
head as tpuplex draws it, and off); warms each up for two steps, then
times three steps of each side in turn, three rounds, so machine noise hits every side alike. Prints each side's
median ms/step, its CPU time per step (cores kept busy, the kernel's share, minor page faults) and the flax-loop's
time over it (> 1: this side is faster).

Why it exists: HF's Flax BERT calls `dot_product_attention_weights(..., broadcast_dropout=True)`, so one
attention-dropout mask [1, 1, L, L] is shared by every example and head, while torch's BERT, Keras' and
tpuplex's draw one per element (B x heads x L x L). With dropout off both sides compute the same thing; with
`per_element` the Flax step draws the masks tpuplex draws (the same regulariser, not the same bits).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: peer_loops.py
import numpy as np
import optax
from peer_loops import flax_glue_step
from round_robin import CONFIG, arguments, fixed_shape_experiment, print_medians, time_in_turn

import jax
from tpuplex import checkpoints
from tpuplex import config as config_lib

TRAIN_KEYS = ("input_ids", "token_type_ids", "attention_mask", "labels", "weight")


def tpuplex_step(data_dir: str, prng: str, dropout: bool) -> tuple[Callable[[int], float], list[dict]]:
    """tpuplex-jax's compiled train step with dropout keys of implementation `prng`; (step(i), its 4 batches)."""
    jax.config.update("jax_default_prng_impl", prng)  # read when the step is traced, just below
    experiment, batches = fixed_shape_experiment("jax", data_dir, dropout)
    backend = experiment.backend
    programs = backend._require_init()
    rows = [backend._local_rows(b, programs, per_replica_split=1, keys=TRAIN_KEYS) for b in batches]
    compiled = programs.train.lower(experiment.state, rows[0], np.float32(1e-5), {}).compile()
    jax.config.update("jax_default_prng_impl", "threefry2x32")
    state = [experiment.state]

    def step(i: int) -> float:
        state[0], loss = compiled(state[0], rows[i % 4], np.float32(1e-5))
        return float(np.asarray(loss.addressable_shards[0].data))

    return step, batches


def flax_loop_step(train: bool, batches: list[dict], per_element: bool = False) -> Callable[[int], float]:
    """run_flax_glue's train step (jit, donated state, clip + AdamW); `train` = False turns dropout off;
    `per_element` draws one attention-dropout mask element per example and head instead of HF's shared mask."""
    from flax.training import train_state
    from transformers import FlaxBertForSequenceClassification
    from transformers.models.bert import modeling_flax_bert

    shared_mask_attention = modeling_flax_bert.dot_product_attention_weights

    def per_element_attention(*args, **kwargs):
        return shared_mask_attention(*args, **{**kwargs, "broadcast_dropout": False})

    checkpoint = checkpoints.resolve_checkpoint(config_lib.load(CONFIG).model.checkpoint)
    model = FlaxBertForSequenceClassification.from_pretrained(checkpoint, num_labels=2, from_pt=True)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-5, weight_decay=0.01))
    initial = train_state.TrainState.create(apply_fn=model.__call__, params=model.params, tx=tx)

    inputs = [{k: b[k] for k in ("input_ids", "token_type_ids", "attention_mask", "labels")} for b in batches]
    if per_element:  # read when the step is traced, just below
        modeling_flax_bert.dot_product_attention_weights = per_element_attention
    compiled = jax.jit(functools.partial(flax_glue_step, train=train), donate_argnums=(0,)).lower(
        initial, dict(inputs[0]), jax.random.PRNGKey(0)).compile()
    modeling_flax_bert.dot_product_attention_weights = shared_mask_attention
    state = [initial, jax.random.PRNGKey(0)]

    def step(i: int) -> float:
        state[0], loss, state[1] = compiled(state[0], dict(inputs[i % 4]), state[1])
        return float(loss)

    return step


def main() -> None:
    args = arguments(__doc__.splitlines()[0])
    sides = {}
    sides["tpuplex threefry"], batches = tpuplex_step(args.data_dir, "threefry2x32", True)
    sides["tpuplex rbg"], _ = tpuplex_step(args.data_dir, "rbg", True)
    sides["tpuplex no dropout"], _ = tpuplex_step(args.data_dir, "threefry2x32", False)
    sides["flax-loop"] = flax_loop_step(True, batches)
    sides["flax-loop per-element"] = flax_loop_step(True, batches, per_element=True)
    sides["flax-loop no dropout"] = flax_loop_step(False, batches)
    print_medians(time_in_turn(sides, args.rounds, args.steps), base="flax-loop")


if __name__ == "__main__":
    main()

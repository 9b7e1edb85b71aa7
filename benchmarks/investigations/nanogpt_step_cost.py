"""Where tpuplex-torch's character-level step stands against nanoGPT's loop, at two vocabulary sizes, one process.

    python benchmarks/investigations/nanogpt_step_cost.py --nanogpt /path/to/nanoGPT [--text OTHER.txt ...]

For each text (tiny Shakespeare by default; `--text` adds others), builds in one process:
- tpuplex-torch's step as `tpuplex train examples/shakespeare_char/cpu.toml` runs it: the random windows the
  core draws for a step (`CausalLMData.train_batch`) and `TorchBackend.train_step`, which reads the loss back;
- nanoGPT's loop body as its CPU recipe runs it (`get_batch` from the text's ids, `model(X, Y)`, backward,
  `clip_grad_norm_`, AdamW from `configure_optimizers`, `zero_grad`, `loss.item()`), on nanoGPT's `model.py`
  (imported from the checkout), the same sizes (4 layers, 4 heads, 128 wide, context 64, batch 12, no biases,
  dropout 0) and the text's vocabulary (its characters, as prepare.py's meta.pkl);
and the parts of both: the batch, forward + backward, and clip + AdamW.
Every side is timed in turn (`round_robin.time_in_turn`), so machine noise hits them alike; prints each side's
median ms a step. Nothing is written but a temporary run folder.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from round_robin import print_medians, time_in_turn  # benchmarks/investigations/ is on sys.path

import torch
from tpuplex import config as config_lib
from tpuplex.commands import run
from tpuplex_torch.step import _clip_by_global_norm

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples" / "shakespeare_char" / "cpu.toml"
SHAKESPEARE = REPO.parent / "shared" / "text" / "tinyshakespeare" / "input.txt"
LEARNING_RATE = 1e-3


def nanogpt_module(source: Path, work: Path):
    """nanoGPT's model.py (from a checkout or a bare git folder), imported."""
    target = work / "nanogpt_model.py"
    if (source / "model.py").is_file():
        target.write_text((source / "model.py").read_text())
    else:
        target.write_text(subprocess.run(["git", "--git-dir", str(source), "show", "HEAD:model.py"], check=True,
                                         capture_output=True, text=True).stdout)
    spec = importlib.util.spec_from_file_location("nanogpt_model", target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tpuplex_sides(text: Path, vocab: int, work: Path, tag: str) -> dict[str, Callable[[int], object]]:
    model = work / f"model-{tag}"
    model.mkdir()
    hf_config = json.loads((CONFIG.parent / "gpt-cpu" / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**hf_config, "vocab_size": vocab}))
    config = config_lib.load(CONFIG, [f"data.train_file={json.dumps(str(text))}",
                                      f"model.checkpoint={json.dumps(str(model))}",
                                      f"runtime.output_dir={json.dumps(str(work / f'run-{tag}'))}",
                                      f"data.cache_dir={json.dumps(str(work / 'cache'))}"])
    experiment = run.prepare(config, "torch", str(CONFIG))
    backend, state, data = experiment.backend, experiment.state, experiment.data
    rows = next(iter(experiment.trainer.train_batcher.train_batches(epoch=0)))
    batches = [data.train_batch(rows, step) for step in range(1, 5)]
    placement, model_ = backend.placement, state.model

    def whole(i: int) -> None:
        backend.train_step(state, data.train_batch(rows, i + 1), LEARNING_RATE)

    def forward_backward(i: int) -> None:
        model_.zero_grad(set_to_none=True)
        inputs = placement.put(batches[i % 4])
        model_.train()
        (state.train_loss(model_, inputs) / inputs["weight"].sum()).backward()

    forward_backward(0)

    def clip_adamw(i: int) -> None:
        _clip_by_global_norm([p for p in model_.parameters() if p.grad is not None], state.spec.clip_norm)
        for group in state.optimizer.param_groups:
            group["lr"] = LEARNING_RATE
        state.optimizer.step()

    return {f"tpuplex step, {tag}": whole, f"tpuplex fwd+bwd, {tag}": forward_backward,
            f"tpuplex clip+AdamW, {tag}": clip_adamw,
            f"tpuplex batch, {tag}": lambda i: placement.put(data.train_batch(rows, i + 1))}


def nanogpt_sides(nanogpt, text: Path, tag: str) -> tuple[dict[str, Callable[[int], object]], int]:
    """nanoGPT's loop on `text` (ids as its prepare.py gives them, the first 90%), and the vocabulary size."""
    characters = sorted(set(text.read_text()))
    table = {c: i for i, c in enumerate(characters)}
    content = text.read_text()
    ids = np.array([table[c] for c in content[: int(len(content) * 0.9)]], np.uint16)
    torch.manual_seed(1337)
    model = nanogpt.GPT(nanogpt.GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=64, bias=False,
                                          vocab_size=len(characters), dropout=0.0))
    optimizer = model.configure_optimizers(0.1, LEARNING_RATE, (0.9, 0.99), "cpu")
    model.train()

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(ids) - 64, (12,))
        x = torch.stack([torch.from_numpy(ids[i:i + 64].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(ids[i + 1:i + 65].astype(np.int64)) for i in ix])
        return x, y

    fixed = [get_batch() for _ in range(4)]

    def whole(i: int) -> None:
        x, y = get_batch()
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()

    def forward_backward(i: int) -> None:
        optimizer.zero_grad(set_to_none=True)
        model(*fixed[i % 4])[1].backward()

    forward_backward(0)

    def clip_adamw(i: int) -> None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    return ({f"nanoGPT step, {tag}": whole, f"nanoGPT fwd+bwd, {tag}": forward_backward,
             f"nanoGPT clip+AdamW, {tag}": clip_adamw, f"nanoGPT batch, {tag}": lambda i: get_batch()},
            len(characters))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nanogpt", type=Path, required=True, help="a nanoGPT checkout or bare git folder")
    parser.add_argument("--text", type=Path, nargs="*", default=[], help="texts beside tiny Shakespeare")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="calls of each side per round")
    args = parser.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        nanogpt = nanogpt_module(args.nanogpt, work)
        sides: dict[str, Callable[[int], object]] = {}
        for text in [SHAKESPEARE, *args.text]:
            loop, vocab = nanogpt_sides(nanogpt, text, f"{text.stem}")
            tag = f"{text.stem} ({vocab} chars)"
            loop = {name.replace(text.stem, tag): call for name, call in loop.items()}
            sides |= tpuplex_sides(text, vocab, work, tag) | loop
        print_medians(time_in_turn(sides, args.rounds, args.steps))


if __name__ == "__main__":
    sys.exit(main())

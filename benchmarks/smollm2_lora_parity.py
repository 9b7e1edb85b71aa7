"""The LoRA example on three backends, checked: 20 dropout-off steps of examples/smollm2/sst2_lora.toml on torch,
jax and tf give the same losses, and the PEFT export of the torch run, loaded by `peft` on the base model, gives
tpuplex's own per-token losses.

    python benchmarks/smollm2_lora_parity.py --out runs/smollm2-parity \\
        --python torch=.nox/tests-torch/bin/python,jax=.nox/tests-jax/bin/python,tf=.nox/tests-tf/bin/python

Run it with a Python that has the torch backend and peft (the comparison with PEFT runs in this process); each
backend trains in its own Python (`--python`, default: this one). The runs evaluate the first 64 dev
conversations (written to <out>/dev-64.tsv) instead of all 872, which checks nothing here and takes minutes.
Prints each backend's largest relative loss difference from torch's and PEFT's largest per-token difference.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "smollm2" / "sst2_lora.toml"
STEPS = 20


def train(python: str, backend: str, out: Path, dev: Path) -> list[float]:
    """The example's first STEPS steps on `backend`; every step's loss."""
    folder = out / backend
    subprocess.run([python, "-m", "tpuplex", "train", str(EXAMPLE), "--backend", backend,
                    "--set", f"train.max_steps={STEPS}", "--set", "runtime.log_every=1",
                    "--set", f"data.eval_files={json.dumps([str(dev)])}",
                    "--set", f"runtime.output_dir={json.dumps(str(folder))}"], check=True)
    entries = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
    return [entry["loss"] for entry in entries if entry["event"] == "train"]


def peft_difference(run: Path, out: Path) -> float:
    """The largest |per-token loss| difference on dev conversations between tpuplex's torch backend and
    transformers + peft loading `tpuplex export --format peft` of `run` on the base model."""
    import peft
    import transformers

    import torch
    from tpuplex.commands import export, run_folder, workflow

    folder = export.export(run, "peft", out / "peft")
    experiment, state = workflow.restore(run_folder.locate(run), "torch")
    dev = next(iter(experiment.data.eval.values()))
    rows = {**dev.rows(np.arange(16), dev.max_length), "weight": np.ones(16, np.float32)}
    batch = experiment.data.eval_batch(rows, np.arange(16))
    batch["weight"] = np.ones_like(batch["labels"], np.float32)
    ours = experiment.backend.predict(state, batch)[..., 0]
    base = transformers.AutoModelForCausalLM.from_pretrained(experiment.model_dir, dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(base, folder).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(batch["input_ids"]).long()).logits
    theirs = torch.nn.functional.cross_entropy(logits.flatten(0, 1), torch.from_numpy(batch["labels"]).long().flatten(),
                                               reduction="none").reshape(batch["labels"].shape).numpy()
    real = dev.rows(np.arange(16), dev.max_length)["attention_mask"][:, 1:] > 0  # targets inside the conversation
    return float(np.abs(ours - theirs)[real].max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/smollm2-parity"))
    parser.add_argument("--python", default="", help="backend=python,... (default: this Python for each)")
    args = parser.parse_args()
    if args.out.exists():
        raise SystemExit(f"{args.out} already exists: give a new --out (nothing there is overwritten)")
    args.out.mkdir(parents=True)
    pythons = dict(item.split("=", 1) for item in args.python.split(",") if item)
    dev_lines = (REPO.parent / "shared" / "glue" / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()
    dev = args.out / "dev-64.tsv"
    dev.write_text("\n".join(dev_lines[:65]) + "\n", encoding="utf-8")
    losses = {backend: train(pythons.get(backend, sys.executable), backend, args.out, dev)
              for backend in ("torch", "jax", "tf")}
    reference = np.array(losses["torch"])
    summary = {"steps": STEPS, "losses": losses,
               "max_relative_difference": {backend: float(np.max(np.abs(np.array(found) - reference) / reference))
                                           for backend, found in losses.items() if backend != "torch"},
               "peft_max_token_loss_difference": peft_difference(args.out / "torch", args.out)}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({key: value for key, value in summary.items() if key != "losses"}, indent=2))


if __name__ == "__main__":
    main()

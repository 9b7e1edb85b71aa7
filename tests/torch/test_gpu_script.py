"""The GPU script's speech and mesh benchmarks (`benchmarks/gpu_side_by_side.py speech | mesh`, steps of
benchmarks/gpu/run.sh) as it calls them, on the CPU at a small size, so a device session never meets a broken side:
each side trains and gives its rate after the warmup. (The LoRA side's dry run: tests/torch/test_lora.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_side_by_side.py"


def rows_of(out: Path) -> dict[str, dict]:
    return {row["side"]: row for row in map(json.loads, (out / "results.jsonl").read_text().splitlines())}


def test_the_gpu_speech_benchmark_dry_run(tmp_path, shared_audio) -> None:
    """tpuplex's speech example and the plain PyTorch CTC loop, two epochs of fsdd's first 32 recordings each (four
    steps of 16): both time the steps after the first two."""
    out = tmp_path / "out"
    subprocess.run([sys.executable, str(SCRIPT), "speech", "--device", "cpu", "--quick", "--train-rows", "32",
                    "--epochs", "2", "--warmup", "2", "--torch-mode", "eager", "--fsdd", str(shared_audio / "fsdd"),
                    "--out", str(out)], check=True, cwd=REPO, capture_output=True)
    rows = rows_of(out)
    assert set(rows) == {"tpuplex-torch", "plain-torch"}, rows
    assert all(row["utterances_per_s"] > 0 and 0 <= row["wer"] for row in rows.values()), rows
    assert rows["tpuplex-torch"]["windows"] == 1  # steps 3-4: the first window compiles
    assert rows["plain-torch"]["utterances"] == 32  # steps 3-4, not the learning rate's warmup


def test_the_gpu_mesh_benchmark_dry_run(tmp_path, shared_text) -> None:
    """The character model over runtime.mesh = {data = 1, fsdp = 1} on one device (the torch side; jax's runs the
    same function)."""
    out = tmp_path / "out"
    subprocess.run([sys.executable, str(SCRIPT), "mesh", "--device", "cpu", "--quick", "--steps", "4", "--warmup",
                    "2", "--torch-mode", "eager", "--text", str(shared_text / "tinyshakespeare" / "input.txt"),
                    "--sides", "tpuplex-torch-mesh", "--out", str(out)], check=True, cwd=REPO, capture_output=True)
    row = rows_of(out)["tpuplex-torch-mesh"]
    assert row["tokens_per_s"] > 0 and 0 < row["mfu"] and row["windows"] == 1, row

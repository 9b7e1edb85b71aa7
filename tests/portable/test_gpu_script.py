"""The prepared GPU benchmark's dry run (`benchmarks/gpu_side_by_side.py --device cpu --quick`): the tpuplex jax
side and the plain Flax loop train a 2-layer BERT a few steps on the CPU, the tpuplex side is profiled, and the
profile's summary names the ops its time went to. What the GPU run (benchmarks/gpu/run.sh) calls, so a device
session never meets a broken script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_gpu_benchmark_dry_run(tmp_path, minilm_dir) -> None:
    text = tmp_path / "corpus.txt"
    words = ("the quick brown fox jumps over a lazy dog while seven wizards quietly hex").split()
    text.write_text("\n".join(" ".join(words[(i + j) % len(words)] for j in range(12)) for i in range(400)))
    out = tmp_path / "out"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_side_by_side.py"), "mlm", "--device", "cpu",
                    "--quick", "--length", "32", "--steps", "6", "--warmup", "2", "--text", str(text),
                    "--tokenizer", str(minilm_dir), "--sides", "tpuplex-jax", "flax-loop", "--profile",
                    "--out", str(out)], check=True, cwd=REPO, capture_output=True)
    rows = {row["side"]: row for row in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert set(rows) == {"tpuplex-jax", "flax-loop"}, rows
    assert all(row["tokens_per_s"] > 0 and 0 < row["mfu"] for row in rows.values()), rows
    assert rows["tpuplex-jax"]["windows"] == 1  # steps 3-4; the first window compiles, the last is profiled
    summary = (out / "profile-tpuplex-jax.txt").read_text().splitlines()
    assert summary[0].endswith("ms in all") and len(summary) > 5, summary[:3]

"""A run's peak memory does not grow with its corpus: masked-LM training on a prepared corpus of 1x and 16x the
same size (tiny Shakespeare's real rows, written again and again, as benchmarks/data_at_scale.py builds them) peaks
at the same RSS. The benchmark measures 1, 5 and 20 GiB under a memory cgroup; this is its check at 8 and 128 MiB,
where a reader that held the corpus would add 120 MiB."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from tiny_glue import write_tiny_model_reading

from tpuplex.collate import Encoded
from tpuplex.data.token_shards import open_tokens, write_tokens
from tpuplex.tasks.masked_lm.corpus import prepare_corpus
from tpuplex.tasks.masked_lm.data import tokenizer_hash

BASE_MIB, SCALE, STEPS = 8, 16, 10
RECORD_BYTES = 1036  # a packed row of 128 int32 ids and its length, as written by write_tokens
GROWTH_MIB = 48
"""What the larger corpus may add to the peak: allocator noise, well under the (SCALE - 1) * BASE_MIB it holds."""


def corpus_of(size_mib: int, rows: Encoded, folder: Path, meta: dict) -> Path:
    count = size_mib * 2**20 // RECORD_BYTES
    repeats = -(-count // len(rows))

    def chunks():
        for repeat in range(repeats):
            take = min(len(rows), count - repeat * len(rows))
            yield Encoded(rows.input_ids[:take], rows.token_type_ids[:take], rows.lengths[:take], rows.labels[:take])

    write_tokens(folder, chunks(), meta=meta)
    return folder


def peak_rss_mib(config: dict, folder: Path) -> tuple[float, dict]:
    """`tpuplex train` of `config` in a child process: (its peak RSS in MiB, its results.json)."""
    path = folder / "config.toml"
    path.write_text("".join(f"[{section}]\n" + "".join(f"{key} = {json.dumps(value)}\n"
                                                     for key, value in fields.items())
                            for section, fields in config.items()))
    process = subprocess.Popen([sys.executable, "-m", "tpuplex", "train", str(path), "--backend", "torch"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    assert status == 0, output[-3000:]
    return usage.ru_maxrss / 1024, json.loads((Path(config["runtime"]["output_dir"]) / "results.json").read_text())


def test_peak_rss_is_flat_over_corpus_size(shared_text, minilm_dir, tmp_path):
    shakespeare = shared_text / "tinyshakespeare" / "input.txt"
    model = write_tiny_model_reading(tmp_path / "model", minilm_dir)
    prepare_corpus(str(shakespeare), tmp_path / "base", model, 128, workers=1)
    rows = open_tokens(tmp_path / "base").load()
    meta = {"packed": True, "tokenizer": tokenizer_hash(model), "sources": str(shakespeare)}
    held_out = tmp_path / "held-out.txt"
    held_out.write_text("\n".join(shakespeare.read_text().splitlines()[:200]) + "\n")
    peaks, reads = {}, {}
    for scale in (1, SCALE):
        corpus = corpus_of(scale * BASE_MIB, rows, tmp_path / f"corpus-{scale}x", meta)
        (tmp_path / f"run-{scale}x").mkdir()
        config = {"task": {"name": "masked_lm"}, "model": {"checkpoint": str(model)},
                  "data": {"dataset": "scale", "train_file": str(corpus), "eval_files": [str(held_out)],
                           "max_length": 128, "cache_dir": str(tmp_path / "cache")},
                  "train": {"learning_rate": 1e-4, "max_steps": STEPS, "global_batch": 32, "seed": 0},
                  "runtime": {"output_dir": str(tmp_path / f"run-{scale}x" / "out"), "eval_every": STEPS,
                              "checkpoint_every": 0, "log_every": 10}}
        peaks[scale], results = peak_rss_mib(config, tmp_path / f"run-{scale}x")
        reads[scale] = results["train_reads"][0]["records"]
    print(f"peak RSS: {peaks[1]:.0f} MiB over {BASE_MIB} MiB, {peaks[SCALE]:.0f} MiB over {SCALE * BASE_MIB} MiB")
    assert peaks[SCALE] - peaks[1] < GROWTH_MIB, peaks
    assert reads[1] == reads[SCALE] == STEPS * 32  # the rows the steps trained, whatever the corpus holds
    assert np.isfinite(results["metrics"]["held-out"]["loss"])

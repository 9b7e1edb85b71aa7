"""A run's peak memory does not grow with its corpus: masked-LM training on a prepared corpus of 1x and 16x the
same size (tiny Shakespeare's real rows, written again and again by benchmarks/data_at_scale.py's own `corpus_of`,
and run by its `capped_run`, uncapped) peaks at the same RSS. The benchmark measures 1, 5 and 20 GiB under a memory
cgroup; this is its check at 8 and 128 MiB, where a reader that held the corpus would add 120 MiB. The fast tier
trains 4 steps of 16 rows on each corpus, the long tier 10 steps of 32 as the benchmark does: what is measured is
whether the corpus is held, not the steps (a run reads 64 or 320 of the larger corpus's 130,000 rows)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from tiny_glue import write_tiny_model_reading

from tpuplex.data.corpus import prepare_corpus
from tpuplex.data.prepared_tokens import open_tokens
from tpuplex.data.tokenize import tokenizer_hash
from tpuplex.tasks.masked_lm.data import CorpusEncoder

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from data_at_scale import capped_run, corpus_of  # noqa: E402  (the benchmark's own corpus and measured run)

BASE_MIB, SCALE = 8, 16
GROWTH_MIB = 48
"""What the larger corpus may add to the peak: allocator noise, well under the (SCALE - 1) * BASE_MIB it holds."""


@pytest.mark.parametrize(("steps", "batch"), [pytest.param(4, 16, id="4x16"),
                                              pytest.param(10, 32, id="10x32", marks=pytest.mark.long)])
def test_peak_rss_is_flat_over_corpus_size(steps, batch, shared_text, minilm_dir, tmp_path):
    shakespeare = shared_text / "tinyshakespeare" / "input.txt"
    model = write_tiny_model_reading(tmp_path / "model", minilm_dir)
    prepare_corpus(str(shakespeare), tmp_path / "base", CorpusEncoder(str(model)), 128, workers=1)
    rows = open_tokens(tmp_path / "base").load()
    (tmp_path / "meta.json").write_text(json.dumps({"tokenizer": tokenizer_hash(model), "sources": str(shakespeare)}))
    held_out = tmp_path / "held-out.txt"
    held_out.write_text("\n".join(shakespeare.read_text().splitlines()[:200]) + "\n")
    peaks, reads = {}, {}
    for scale in (1, SCALE):
        corpus = corpus_of(scale * BASE_MIB * 2**20, rows, tmp_path / f"corpus-{scale}x")
        (tmp_path / f"run-{scale}x").mkdir()
        config = {"task": {"name": "masked_lm"}, "model": {"checkpoint": str(model)},
                  "data": {"dataset": "scale", "train_file": str(corpus), "eval_files": [str(held_out)],
                           "max_length": 128, "cache_dir": str(tmp_path / "cache")},
                  "train": {"learning_rate": 1e-4, "max_steps": steps, "global_batch": batch, "seed": 0},
                  "runtime": {"output_dir": str(tmp_path / f"run-{scale}x" / "out"), "eval_every": steps,
                              "checkpoint_every": 0, "log_every": 10}}
        peaks[scale], results, _ = capped_run(config, tmp_path / f"run-{scale}x", "torch", cgroup=None)
        reads[scale] = results["train_reads"][0]["records"]
    print(f"peak RSS: {peaks[1]:.0f} MiB over {BASE_MIB} MiB, {peaks[SCALE]:.0f} MiB over {SCALE * BASE_MIB} MiB")
    assert peaks[SCALE] - peaks[1] < GROWTH_MIB, peaks
    assert reads[1] == reads[SCALE] == steps * batch  # the rows the steps trained, whatever the corpus holds
    assert np.isfinite(results["metrics"]["held-out"]["loss"])

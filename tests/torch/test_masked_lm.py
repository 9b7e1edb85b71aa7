"""Masked-LM pre-training on every family on torch: per-token losses equal HF transformers' `*ForMaskedLM`, training
with the core's masks follows the torch backend, and the decoder stays tied (tests/common/mlm_checks.py)."""

from __future__ import annotations

import csv
import json

import hf_families as families
import mlm_checks
import pytest
from helpers import backend

from tpuplex.commands import cli


@pytest.fixture(scope="module", params=families.FAMILIES)
def family_dir(request, tmp_path_factory):
    return families.write_checkpoint(request.param, tmp_path_factory.mktemp(request.param))


def test_token_losses_match_hf(family_dir):
    mlm_checks.check_token_losses_match_hf(backend(), family_dir)


def test_twenty_steps_follow_the_torch_backend(family_dir):
    mlm_checks.check_training_follows_torch(backend(), family_dir)


def test_a_raw_corpus_streams_through_prepare_and_trains_as_a_table_in_memory(shared_text, minilm_dir, tmp_path):
    """A .txt corpus given to `train` goes through `prepare`'s units into the cache (no documents list in memory),
    holding out its first 5% of documents; the same documents as a .csv table take the in-memory path. The two
    runs train and evaluate alike, bit for bit."""
    lines = (shared_text / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8").splitlines()
    documents = [line.strip() for line in lines[:800] if line.strip()]
    (tmp_path / "corpus.txt").write_text("\n".join(documents) + "\n", encoding="utf-8")
    with (tmp_path / "corpus.csv").open("w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([["text"], *([d] for d in documents)])
    results = {}
    for name in ("corpus.txt", "corpus.csv"):
        path = tmp_path / f"{name}.toml"
        path.write_text(f'[task]\nname = "masked_lm"\n[model]\ncheckpoint = {json.dumps(str(minilm_dir))}\n'
                        f'[data]\ndataset = "corpus"\ntrain_file = {json.dumps(str(tmp_path / name))}\n'
                        f'max_length = 32\ncache_dir = {json.dumps(str(tmp_path / "cache"))}\n'
                        '[train]\nmax_steps = 2\nglobal_batch = 8\n'
                        f'[runtime]\noutput_dir = {json.dumps(str(tmp_path / f"{name}-run"))}\n')
        assert cli.main(["train", str(path), "--backend", "torch"]) == 0
        results[name] = json.loads((tmp_path / f"{name}-run" / "results.json").read_text())
    streamed = sorted(folder.name for folder in (tmp_path / "cache").glob("masked_lm-corpus-L32-*") if folder.is_dir())
    assert len(streamed) == 2  # the held-out documents and the training ones, each a prepared corpus
    assert results["corpus.txt"]["losses"] == results["corpus.csv"]["losses"]
    assert results["corpus.txt"]["metrics"] == results["corpus.csv"]["metrics"]

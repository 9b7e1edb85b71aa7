"""Runs read their data from prepared shards: GLUE and your own CSV train as from the same rows in memory, bit for
bit; a pre-training corpus is tokenized and packed by worker processes into what the in-memory path packs, and an
interrupted `prepare` continues where it stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from custom_files import custom_fields, mrpc_splits, write_splits
from prepared_checks import check_prepared_equals_in_memory

from tpuplex import config as config_lib
from tpuplex.commands import cli
from tpuplex.data import corpus
from tpuplex.data.tables import text_file
from tpuplex.errors import TpuplexError
from tpuplex.tasks.masked_lm import data as text
from tpuplex.tasks.masked_lm.data import CorpusEncoder


def test_glue_trains_from_shards_as_from_memory(write_config, tmp_path) -> None:
    metrics = check_prepared_equals_in_memory(config_lib.load(write_config()), "numpy", tmp_path / "runs")
    assert set(metrics) == {"dev"}


def test_your_own_csv_trains_from_shards_as_from_memory(write_config, tiny_mrpc, tmp_path) -> None:
    paths = write_splits(tmp_path / "data", "csv", mrpc_splits(tiny_mrpc))
    check_prepared_equals_in_memory(config_lib.load(write_config(**custom_fields(paths))), "numpy", tmp_path / "runs")


@pytest.fixture(scope="module")
def shakespeare(shared_text):
    return shared_text / "tinyshakespeare" / "input.txt"


def in_memory_packing(path, tokenizer_dir, max_length):
    documents = text.documents(text_file("data.train_file", str(path)), "text")
    return text.encode_packed(documents, text.untruncated_tokenizer(tokenizer_dir, max_length), max_length, "corpus")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_corpus_prepared_in_units_packs_as_the_whole_text_in_memory(shakespeare, minilm_dir, tmp_path,
                                                                      workers) -> None:
    report = corpus.prepare_corpus(str(shakespeare), tmp_path / "corpus", CorpusEncoder(str(minilm_dir)), 64,
                                   workers=workers, unit_bytes=100_000, shard_rows=2000)
    assert report.units == 12 and report.resumed_units == 0 and len(report.prepared.shards.manifest["shards"]) == 3
    expected = in_memory_packing(shakespeare, minilm_dir, 64)
    got = report.prepared.load()
    for name in ("input_ids", "token_type_ids", "lengths", "labels"):
        np.testing.assert_array_equal(getattr(got, name), getattr(expected, name), err_msg=name)
    assert report.prepared.fingerprint() == expected.fingerprint()
    assert report.tokens == expected.token_count and not (tmp_path / "corpus.partial").exists()


def test_a_run_s_held_out_share_counts_the_corpus_once(shakespeare, minilm_dir, tmp_path) -> None:
    """A masked-LM run without eval files counts the documents, then prepares its two shares of them (each needs
    where every unit's documents start): one counting pass over the corpus, not three."""
    encoder = CorpusEncoder(str(minilm_dir))
    corpus._counted.cache_clear()
    total = corpus.document_count(str(shakespeare), encoder)
    shares = [corpus.cached_corpus(str(shakespeare), tmp_path / "cache", "c", "key", encoder, 64, documents=share,
                                   workers=1) for share in ((0, 100), (100, total))]
    assert corpus._counted.cache_info().misses == 1 and corpus._counted.cache_info().hits == 2
    assert sum(share.token_count for share in shares) == in_memory_packing(shakespeare, minilm_dir, 64).token_count


def test_a_folder_of_the_work_folder_s_name_is_never_removed(shakespeare, minilm_dir, tmp_path, capsys) -> None:
    theirs = tmp_path / "corpus.partial"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert cli.main(["prepare", str(shakespeare), "--out", str(tmp_path / "corpus"), "--tokenizer",
                     str(minilm_dir), "--max-length", "64"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"tpuplex: error: {theirs} exists and is no unfinished `tpuplex prepare`")
    assert [child.name for child in theirs.iterdir()] == ["notes.txt"] and not (tmp_path / "corpus").exists()


def test_folders_named_like_tpuplex_s_staging_are_never_removed(shakespeare, minilm_dir, tmp_path) -> None:
    """Hidden folders of yours that start like a prepare's staging folder, and a `corpus.partial/` of yours that
    holds a plan.json, are left byte for byte; the prepared folder is written beside them."""
    yours = {tmp_path / ".corpus.partial-old" / "notes.txt": "mine",
             tmp_path / ".corpus.partial-backup" / "thesis.tex": "chapter 1",
             tmp_path / ".corpus.partial-123-abcdefgh" / "kept.txt": "no mark of tpuplex's in it"}
    for path, content in yours.items():
        path.parent.mkdir()
        path.write_text(content)
    corpus.prepare_corpus(str(shakespeare), tmp_path / "corpus", CorpusEncoder(str(minilm_dir)), 64)
    assert {path: path.read_text() for path in yours} == yours
    plan = tmp_path / "other.partial" / "plan.json"
    plan.parent.mkdir()
    plan.write_text('{"format": 2, "mine": true}')
    with pytest.raises(TpuplexError, match="no plan.json of tpuplex's in it"):
        corpus.prepare_corpus(str(shakespeare), tmp_path / "other", CorpusEncoder(str(minilm_dir)), 64)
    assert plan.read_text() == '{"format": 2, "mine": true}' and not (tmp_path / "other").exists()


def test_a_file_of_yours_in_the_work_folder_stays(shakespeare, minilm_dir, tmp_path) -> None:
    """prepare removes the files it wrote in its work folder, never one it did not."""
    encoder = CorpusEncoder(str(minilm_dir))
    with pytest.raises(TpuplexError):  # a first prepare stops after its work folder is made (too short a corpus)
        corpus.prepare_corpus(str(shakespeare), tmp_path / "corpus", encoder, 10**9)
    note = tmp_path / "corpus.partial" / "note.txt"
    note.write_text("mine")
    corpus.prepare_corpus(str(shakespeare), tmp_path / "corpus", encoder, 64)
    assert note.read_text() == "mine" and (tmp_path / "corpus" / "manifest.json").is_file()
    assert [path.name for path in note.parent.iterdir()] == ["note.txt"]


def test_jsonl_files_and_a_folder_glob(minilm_dir, tmp_path) -> None:
    lines = ["First line of text.", "", "  Second, with spaces.  ", "Third one."]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.jsonl").write_text("".join(json.dumps({"body": line, "id": 1}) + "\n" for line in lines))
    (tmp_path / "docs" / "b.txt").write_text("\n".join(lines * 3) + "\n")
    (tmp_path / "docs" / "notes.md").write_text("ignored")
    report = corpus.prepare_corpus(str(tmp_path / "docs"), tmp_path / "out", CorpusEncoder(str(minilm_dir)), 8,
                                   text_column="body")
    tokenizer = text.untruncated_tokenizer(minilm_dir, 8)
    documents = [line.strip() for line in lines if line.strip()]
    expected = text.encode_packed(documents + documents * 3, tokenizer, 8, "docs")
    np.testing.assert_array_equal(report.prepared.load().input_ids, expected.input_ids)


@pytest.mark.parametrize(("setup", "message"), [
    ("nothing", "names no .txt or .jsonl file"),
    ("latin1", r"is not UTF-8 text \(byte 0xe9 at offset 6\)"),
    ("too short", "fewer than one row of data.max_length = 64"),
])
def test_bad_corpora_stop_with_one_line(setup, message, minilm_dir, tmp_path) -> None:
    if setup == "latin1":
        (tmp_path / "c.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1").rjust(16, b" "))
    elif setup == "too short":
        (tmp_path / "c.txt").write_text("a few words\n")
    with pytest.raises(TpuplexError, match=message):
        corpus.prepare_corpus(str(tmp_path / "*.txt"), tmp_path / "out", CorpusEncoder(str(minilm_dir)), 64)
    assert not (tmp_path / "out").exists()


KILLABLE = """
import multiprocessing.pool, sys, time
from pathlib import Path
from tpuplex.data import corpus
from tpuplex.tasks.masked_lm.data import CorpusEncoder

imap_unordered = multiprocessing.pool.Pool.imap_unordered

def held_after_five(self, *arguments, **options):  # the run cannot end before the test kills it
    for count, result in enumerate(imap_unordered(self, *arguments, **options), start=1):
        yield result
        while count >= 5:
            time.sleep(0.01)

multiprocessing.pool.Pool.imap_unordered = held_after_five
corpus.prepare_corpus(sys.argv[1], Path(sys.argv[2]), CorpusEncoder(sys.argv[3]), 64, workers=1, unit_bytes=20_000,
                      shard_rows=2000)
"""


def test_a_killed_prepare_continues_with_the_units_it_had_not_finished(shakespeare, minilm_dir, tmp_path) -> None:
    out = tmp_path / "corpus"
    argv = [sys.executable, "-c", KILLABLE, str(shakespeare), str(out), str(minilm_dir)]
    process = subprocess.Popen(argv, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 300
    while len(list((tmp_path / "corpus.partial").glob("unit-*.npy"))) < 5:
        assert process.poll() is None and time.monotonic() < deadline, "prepare ended before it could be killed"
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGKILL)  # the main process and its workers
    process.wait()
    assert process.returncode == -signal.SIGKILL and not out.exists()
    done = len(list((tmp_path / "corpus.partial").glob("unit-*.npy")))
    report = corpus.prepare_corpus(str(shakespeare), out, CorpusEncoder(str(minilm_dir)), 64, workers=1,
                                   unit_bytes=20_000, shard_rows=2000)
    assert report.units == 56 and report.resumed_units == done >= 5
    assert report.prepared.fingerprint() == in_memory_packing(shakespeare, minilm_dir, 64).fingerprint()


def test_the_prepare_command_reports_its_throughput(shakespeare, minilm_dir, tmp_path, capsys) -> None:
    """--workers 1000 on a one-unit corpus starts one worker (no more processes than units or cores), and says so."""
    assert cli.main(["prepare", str(shakespeare), "--out", str(tmp_path / "c"), "--tokenizer", str(minilm_dir),
                     "--max-length", "128", "--workers", "1000"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("prepared 354273 tokens into 2768 rows of 128 in 1 shard(s) from 1 unit(s), 1 worker(s)")
    assert line.endswith(f"tokens/s: {tmp_path / 'c'}")

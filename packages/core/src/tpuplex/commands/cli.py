"""The `tpuplex` command.

    tpuplex train CONFIG --backend NAME [--set section.field=value ...] [--data-dir DIR]
    tpuplex prepare IMAGES --out DIR [--image-size H W] [--shard-size N]
    tpuplex prepare "TEXT_GLOB" --out DIR --tokenizer CHECKPOINT --max-length L [--task T] [--workers N]
    tpuplex prepare CONFIG.toml [--set section.field=value ...] [--data-dir DIR]
    tpuplex launch --processes N [--cpu-devices K] -- train CONFIG --backend NAME ...
    tpuplex eval RUN_OR_CHECKPOINT [--backend NAME] [--split SPLIT] [--data-dir DIR] [--out FILE]
    tpuplex predict RUN_OR_CHECKPOINT [--backend NAME] [--split test] [--data-dir DIR] [--out DIR]
    tpuplex export RUN_OR_CHECKPOINT --format hf|peft|saved_model|torch_export [--merge] [--out DIR]
    tpuplex generate RUN_OR_CHECKPOINT [--backend NAME] --prompt TEXT [--tokens N] [--temperature T] [--top-k K]
    tpuplex sweep CONFIG --backend NAME --seeds 1,2,3 [--set ...] [--data-dir DIR]
    tpuplex tune CONFIG --backend NAME [--storage URL] [--trials N] [--output DIR] [--set ...] [--data-dir DIR]
    tpuplex report RUN... [--out DIR]
    tpuplex devices

A TpuplexError ends the command with one line on stderr, `tpuplex: error: <message>`, and exit code 2. A run
stopped by SIGTERM / SIGINT after checkpointing (tpuplex.engine.preemption) says so in one line and exits with 75; the
same command resumes it. A process of a multi-process run that loses another says so in one line and exits with 69
(tpuplex.hosts). Any other exception is a bug: one line naming the file that holds its traceback, exit 1.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Sequence
from pathlib import Path

from tpuplex import __version__, hardware, registry
from tpuplex.engine.preemption import PREEMPTED_EXIT, Preempted
from tpuplex.engine.run_log import headline
from tpuplex.errors import TpuplexError, absence
from tpuplex.hosts import HOST_LOST_EXIT, HostLost, expected_process_index, expected_processes

USAGE_ERROR = 2
INTERNAL_ERROR = 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.command(args)
    except TpuplexError as error:
        print(f"tpuplex: error: {_one_line(str(error))}", file=sys.stderr, flush=True)
        if expected_processes() > 1:
            # One of several processes: at interpreter shutdown gloo's threads can abort it ("terminate called
            # without an active exception") once its peers have gone, so its status would not be this one.
            sys.stdout.flush()
            os._exit(USAGE_ERROR)
        return USAGE_ERROR
    except HostLost as lost:
        print(f"tpuplex: error: {lost}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        # Not a normal exit: the frameworks' exit handlers wait for the lost process (JAX's distributed shutdown
        # waits up to 5 minutes for it), so end here, as the watchdog does.
        os._exit(HOST_LOST_EXIT)
    except Preempted as preempted:
        print(f"tpuplex: {preempted.resumed_by('run the same command again to resume from it')}", file=sys.stderr)
        return PREEMPTED_EXIT
    except KeyboardInterrupt:
        print("tpuplex: interrupted (run the same command again to resume from the last checkpoint)",
              file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 (the last guard: one line on stderr, the traceback in a file)
        path = _write_traceback()
        print(f"tpuplex: error: unexpected {type(error).__name__}: {_one_line(str(error))} (a tpuplex bug: the "
              f"full traceback is in {path}; please report it with that file)", file=sys.stderr)
        return INTERNAL_ERROR


def _write_traceback() -> str:
    handle, path = tempfile.mkstemp(prefix="tpuplex-traceback-", suffix=".txt")
    with os.fdopen(handle, "w") as file:
        file.write(traceback.format_exc())
    return path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tpuplex", description="Train one experiment on TPU, GPU or CPU with "
                                     "TensorFlow, PyTorch or JAX, the same config and the same numbers on each: "
                                     "classify texts (sequence_classification), tag words (token_classification), "
                                     "pre-train a masked LM (masked_lm), train a decoder on text or conversations "
                                     "(causal_lm), text to text with T5 (seq2seq, span_corruption), classify images "
                                     "(image_classification), transcribe speech (speech_recognition), or a task of "
                                     "your own.")
    parser.add_argument("--version", action="version", version=f"tpuplex {__version__}")
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")

    train = commands.add_parser("train", help="run an experiment from a TOML config")
    train.add_argument("config", type=Path, help="the experiment's TOML file")
    installed = ", ".join(registry.offered(registry.available())) or "none"
    train.add_argument("--backend", required=True, help=f"framework backend; installed: {installed}")
    train.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                       help="override a config field (value parsed as TOML), e.g. --set train.learning_rate=3e-5")
    train.add_argument("--data-dir", help="folder with the task's GLUE files (sets data.data_dir)")
    train.set_defaults(command=_train)

    prepare = commands.add_parser("prepare", help="write images or a text corpus once into shards a run reads",
                                  description="A config (.toml): prepare what its runs read first (audio features, "
                                  "images, tokenized text) into its data.cache_dir, as its first run would, so that "
                                  "every run of it starts at once. Images: decode, convert to RGB and resize every "
                                  "image once. Text "
                                  "(with --tokenizer): tokenize a corpus of any size in worker processes and pack it "
                                  "into rows of --max-length for masked-LM pre-training (or --task causal_lm); an "
                                  "interrupted prepare "
                                  "continues where it stopped. Both write prepared shards plus a manifest (see "
                                  "tpuplex.data.shards); point data.train_file or data.eval_files at the folder.")
    prepare.add_argument("source", help="a config's TOML file; images: a class-per-folder tree or a .csv/.jsonl of "
                                        "(path, label); text: a glob of .txt/.jsonl files, a file or a folder (local "
                                        "or an fsspec URL)")
    prepare.add_argument("--out", type=Path, help="images, text: the folder to create")
    prepare.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                         help="a config: override a field, as for tpuplex train")
    prepare.add_argument("--data-dir", help="a config: sets data.data_dir, as for tpuplex train")
    prepare.add_argument("--image-size", type=int, nargs=2, metavar=("H", "W"),
                         help="resize every image to H x W (default: keep their size, which must then be one)")
    prepare.add_argument("--shard-size", type=int, default=None,
                         help="rows per shard file (default 4096 images, 65536 text rows)")
    prepare.add_argument("--tokenizer", help="text: the checkpoint whose tokenizer to use (a folder, or minilm)")
    prepare.add_argument("--max-length", type=int, default=128, help="text: tokens per packed row (default 128)")
    prepare.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                         help="text: tokenizing worker processes (default: one per CPU core)")
    prepare.add_argument("--text-column", default="text", help="text: the field of .jsonl files (default text)")
    prepare.add_argument("--task", default="masked_lm",
                         help="text: the task the corpus is for, masked_lm (a document per .txt line, special tokens "
                              "around each) or causal_lm (a .txt file one document, end-of-text after each)")
    prepare.set_defaults(command=_prepare)

    launch = commands.add_parser("launch", help="run a command in several local processes of one run",
                                 description="Start N processes of one run on this machine, each with the "
                                 "environment its framework's launcher would give it (see tpuplex.commands.launch).")
    launch.add_argument("--processes", type=int, required=True, help="how many processes")
    launch.add_argument("--cpu-devices", type=int, default=0, help="CPU devices per process (runtime.cpu_devices)")
    launch.add_argument("child", nargs=argparse.REMAINDER, metavar="-- train CONFIG --backend NAME ...")
    launch.set_defaults(command=_launch)

    evaluate = commands.add_parser("eval", help="evaluate a checkpoint (of any backend) on any backend")
    _checkpoint_arguments(evaluate)
    evaluate.add_argument("--split", help="one evaluation split (default: every one the run evaluates)")
    evaluate.add_argument("--out", type=Path, help="metrics file (default: <run>/eval/<step>-<backend>.json)")
    evaluate.set_defaults(command=_eval)

    predict = commands.add_parser("predict", help="write predictions (GLUE submission files for test splits)")
    _checkpoint_arguments(predict)
    predict.add_argument("--split", default="test", help="test (every test file) or an evaluation split; an image or "
                                                          "speech run: also a file or folder of images or recordings")
    predict.add_argument("--out", type=Path, help="folder (default: <run>/predictions/<step>-<backend>/)")
    predict.set_defaults(command=_predict)

    generate = commands.add_parser("generate", help="continue a prompt with a causal_lm run, or write a text-to-text "
                                   "run's output (any backend)",
                                   description="Continue prompts with a causal_lm checkpoint, or write a text "
                                   "for each input with a text-to-text one (T5; --beams for beam search): greedy "
                                   "(temperature 0, the default) or sampled (temperature, top-k) from --seed, the "
                                   "same tokens on every backend. Prints the new text alone, as Run.generate "
                                   "returns it (see tpuplex.commands.generate).")
    _checkpoint_arguments(generate)
    generate.add_argument("--prompt", action="append", default=[], help="a prompt (repeat for several)")
    generate.add_argument("--prompt-file", type=Path, help="a UTF-8 file whose whole text is one more prompt")
    generate.add_argument("--tokens", type=int, default=100, help="new tokens per prompt (default 100)")
    generate.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy; else sampled")
    generate.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0: all)")
    generate.add_argument("--seed", type=int, default=0, help="the draws of sampling (default 0)")
    generate.add_argument("--no-cache", action="store_true", help="recompute every step (no key/value cache)")
    generate.add_argument("--chat", action="store_true",
                          help="each prompt is a user's message in the checkpoint's chat template; print the answers")
    generate.add_argument("--beams", type=int, default=1, help="a text-to-text run (T5): beam search of N beams "
                          "(default 1: greedy, or sampled with --temperature)")
    generate.add_argument("--length-penalty", type=float, default=1.0,
                          help="with --beams: a beam's score is its log-probability / length ** this (default 1.0)")
    generate.add_argument("--system", metavar="TEXT", help="with --chat: the system message before each prompt, as "
                          "the chat template renders one (without it, the template's own default, if any)")
    generate.set_defaults(command=_generate)

    export = commands.add_parser("export", help="an HF folder or a TF SavedModel of a checkpoint")
    export.add_argument("checkpoint", metavar="RUN_OR_CHECKPOINT", help="a run folder or a checkpoints/step-* folder")
    export.add_argument("--format", required=True, help="hf, peft (a LoRA run's adapters), saved_model or "
                        "torch_export")
    export.add_argument("--merge", action="store_true", help="with --format hf, a LoRA run's adapters folded into "
                        "its base")
    export.add_argument("--out", type=Path, help="folder to create (default: <run>/export/<step>-<format>)")
    export.set_defaults(command=_export)

    sweep = commands.add_parser("sweep", help="one config over several seeds, then mean ± std")
    sweep.add_argument("config", type=Path, help="the experiment's TOML file")
    sweep.add_argument("--backend", required=True, help="framework backend")
    sweep.add_argument("--seeds", required=True, help="comma-separated seeds, e.g. 1,2,3,4,5")
    sweep.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    sweep.add_argument("--data-dir", help="folder with the task's GLUE files (sets data.data_dir)")
    sweep.set_defaults(command=_sweep)

    tune = commands.add_parser("tune", help="search hyperparameters (the config's [tune] table) with Optuna",
                               description="Search the config's [tune] space with Optuna: each trial an ordinary run "
                               "folder <output>/trial-<n>, each evaluation reported to the pruner; many workers "
                               "share one study through --storage (see tpuplex.commands.tune, docs/tune.md).")
    tune.add_argument("config", type=Path, help="the experiment's TOML file, with a [tune] table")
    tune.add_argument("--backend", required=True, help="framework backend")
    tune.add_argument("--storage", help="the study's database, an SQLAlchemy URL (postgresql://user@host/db) that "
                                        "every worker gives (default: sqlite:///<output>/study.db)")
    tune.add_argument("--trials", type=int, help="trials in all, over every worker (replaces tune.trials)")
    tune.add_argument("--output", type=Path, help="the tune folder (default: the config's runtime.output_dir)")
    tune.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    tune.add_argument("--data-dir", help="folder with the task's GLUE files (sets data.data_dir)")
    tune.set_defaults(command=_tune)

    report = commands.add_parser("report", help="a Markdown table and a PNG of curves of finished runs")
    report.add_argument("runs", nargs="+", metavar="RUN", help="run folders (or their results.json)")
    report.add_argument("--out", type=Path, default=Path("."), help="folder for report.md and report.png")
    report.set_defaults(command=_report)

    listing = commands.add_parser("devices", help="show the devices found and how each installed backend sees them")
    listing.set_defaults(command=_devices)
    return parser


def _train(args: argparse.Namespace) -> int:
    # The pipeline pulls in GLUE and the trainer; `tpuplex devices` needs neither.
    from tpuplex.commands import api
    from tpuplex.commands.run import RESULTS_FILE

    run = api.train(args.config, args.backend, data_dir=args.data_dir, overrides=args.overrides)
    if expected_process_index() != 0:  # one of several processes: process 0 prints the run's results
        return 0
    for split, metrics in run.metrics.items():
        print(f"{split}: {headline(metrics)}")
    print(f"results: {run.folder / RESULTS_FILE}")
    return 0


def _prepare(args: argparse.Namespace) -> int:
    import time

    from tpuplex.commands.run import check_writable_folder

    started = time.perf_counter()
    if args.source.endswith(".toml"):
        return _prepare_config(args)
    if args.out is None:
        raise TpuplexError(f"tpuplex prepare {args.source} needs --out DIR: the folder to write the prepared shards "
                           "to (or give a config's .toml to prepare what its runs read)")
    if args.shard_size is not None and args.shard_size < 1:
        raise TpuplexError(f"--shard-size {args.shard_size}: use 1 or more rows per shard (or leave it out for the "
                           "default)")
    check_writable_folder(Path(args.out).expanduser(), "--out")
    if args.tokenizer is not None:
        if args.max_length < 2:
            raise TpuplexError(f"--max-length {args.max_length}: use rows of at least 2 tokens (a token and the one "
                               "it predicts)")
        from tpuplex import tasks
        from tpuplex.checkpoints import resolve_checkpoint
        from tpuplex.data.corpus import prepare_corpus

        encoder = tasks.get(args.task).corpus_encoder(resolve_checkpoint(args.tokenizer))
        report = prepare_corpus(args.source, args.out, encoder, args.max_length, args.workers, args.text_column,
                                shard_rows=args.shard_size or 65536)
        seconds = time.perf_counter() - started
        resumed = f", {report.resumed_units} of them from an interrupted prepare" if report.resumed_units else ""
        print(f"prepared {report.tokens} tokens into {len(report.prepared)} rows of {args.max_length} in "
              f"{len(report.prepared.shards.manifest['shards'])} shard(s) from {report.units} unit(s){resumed}, "
              f"{report.workers} worker(s), {report.tokens / seconds:.0f} tokens/s: {args.out}")
        return 0
    from tpuplex.data import images

    if args.image_size is not None and min(args.image_size) < 1:
        raise TpuplexError(f"--image-size {args.image_size[0]} {args.image_size[1]}: give a height and a width of at "
                           "least 1 pixel, e.g. --image-size 160 160 (or leave it out to keep the images' own size)")
    source = Path(args.source).expanduser()
    listing = images.scan_folder(source) if source.is_dir() else images.read_listing(source)
    prepared = images.prepare(listing, args.out, tuple(args.image_size) if args.image_size else None,
                              args.shard_size or 4096)
    seconds = time.perf_counter() - started
    height, width, _ = prepared.image_shape
    print(f"prepared {len(prepared)} images of {len(prepared.classes)} classes at {height}x{width} in "
          f"{len(prepared.manifest['shards'])} shard(s), {len(prepared) / seconds:.0f} images/s: {args.out}")
    return 0


def _prepare_config(args: argparse.Namespace) -> int:
    from tpuplex.commands.run import prepare_data
    from tpuplex.config import Config

    ignored = [flag for flag, value in (("--out", args.out), ("--image-size", args.image_size),
                                        ("--shard-size", args.shard_size), ("--tokenizer", args.tokenizer))
               if value is not None]
    if ignored:
        raise TpuplexError(f"tpuplex prepare {args.source} takes its settings from the config, not {ignored[0]}: "
                           "change the config (or --set section.field=value) instead")
    path = Path(args.source)
    data = prepare_data(Config.load(path, data_dir=args.data_dir, overrides=args.overrides), path)
    for what, value in data.report().items():
        print(f"{what}: {value}")
    return 0


def _checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", metavar="RUN_OR_CHECKPOINT", help="a run folder or a checkpoints/step-* folder")
    parser.add_argument("--backend", help="framework backend (default: the one the run trained on; any: "
                                          "checkpoints are portable)")
    parser.add_argument("--data-dir", help="folder with the task's GLUE files (replaces the run's data.data_dir); a "
                                           "speech run reads its evaluation manifests from it, by their names")


def _eval(args: argparse.Namespace) -> int:
    from tpuplex.commands import api

    result = api.Run.open(args.checkpoint).evaluate(args.backend, args.split, args.data_dir, args.out)
    for split, metrics in result["metrics"].items():
        print(f"{split}: " + ", ".join(f"{name} {value:.6f}" for name, value in metrics.items()))
    if "written" in result:
        print(f"metrics: {result['written']}")
    return 0


def _generate(args: argparse.Namespace) -> int:
    from tpuplex.commands.generate import generate
    from tpuplex.text_files import read_utf8

    if args.prompt_file and not args.prompt_file.is_file():
        raise TpuplexError(f"--prompt-file {args.prompt_file} {absence(args.prompt_file)}: give a UTF-8 text file")
    prompts = args.prompt + ([read_utf8(args.prompt_file)] if args.prompt_file else [])
    result = generate(args.checkpoint, args.backend, prompts, args.tokens, args.temperature, args.top_k, args.seed,
                      cache=not args.no_cache, chat=args.chat, system=args.system, beams=args.beams,
                      length_penalty=args.length_penalty)
    for text in result.texts:  # what `Run.generate` returns: the new text alone, never the prompt before it
        print(text)
    tokens = sum(len(ids) for ids in result.ids)
    print(f"{tokens} tokens in {result.seconds:.2f} s ({result.tokens_per_s:.1f} tokens/s, "
          f"{'with' if not args.no_cache else 'without'} the key/value cache)", file=sys.stderr)
    return 0


def _predict(args: argparse.Namespace) -> int:
    from tpuplex.commands import api

    for split, path in api.Run.open(args.checkpoint).write_predictions(args.split, args.backend, args.data_dir,
                                                                        args.out).items():
        print(f"{split}: {path}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from tpuplex.commands import api

    print(f"exported: {api.Run.open(args.checkpoint).export(args.format, args.out, merge=args.merge)}")
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from tpuplex.commands import sweep

    summary = sweep.sweep(args.config, args.backend, sweep.parse_seeds(args.seeds), args.overrides, args.data_dir)
    print(sweep.markdown(summary))
    return 0


def _tune(args: argparse.Namespace) -> int:
    from tpuplex.commands import api
    from tpuplex.commands.tune import summary_lines

    tuned = api.tune(args.config, args.backend, storage=args.storage, trials=args.trials, output=args.output,
                     data_dir=args.data_dir, overrides=args.overrides)
    print("\n".join(summary_lines(tuned)))
    return 0


def _report(args: argparse.Namespace) -> int:
    from tpuplex.commands import report

    markdown, png = report.report(args.runs, args.out)
    print(markdown.read_text(), end="")
    print(f"table: {markdown}\nfigure: {png}")
    return 0


def _launch(args: argparse.Namespace) -> int:
    from tpuplex.commands import launch

    child = args.child[1:] if args.child[:1] == ["--"] else args.child
    return launch.launch(child, args.processes, args.cpu_devices)


def _devices(args: argparse.Namespace) -> int:
    print(f"core discovery: {hardware.discover().report()}")
    installed = registry.available()
    for name in installed:
        print(f"backend {name}: {_backend_view(name)}")
    for name, command in registry.INSTALL.items():
        if name not in installed:
            print(f"backend {name}: not installed ({command})")
    return 0


def _backend_view(name: str) -> str:
    """The backend's topology report, asked in a process of its own: two frameworks must never claim one TPU."""
    probe = ("import sys; from tpuplex import config, registry; "
             "print(registry.create(sys.argv[1], config.RuntimeConfig()).topology().report())")
    done = subprocess.run([sys.executable, "-c", probe, name], capture_output=True, text=True, check=False)
    if done.returncode == 0:
        return done.stdout.strip().splitlines()[-1]
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return f"unavailable ({_one_line(last)})"


def _one_line(message: str) -> str:
    return " ".join(message.split())

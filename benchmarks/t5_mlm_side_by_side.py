"""T5 span-corruption pre-training on tiny Shakespeare: tpuplex jax beside HF's `run_t5_mlm_flax.py`, seeds alternating.

    .nox/tests-jax/bin/python benchmarks/t5_mlm_side_by_side.py \
        --hf-script /tmp/t5mlm/run_t5_mlm_flax.py --hf-python /tmp/tf457/bin/python \
        --seeds 1 2 3 --out runs/t5-mlm-sbs

    (a smoke test: --seeds 1 --lines 1000 --batch 8 --window 2 --d-model 64 --layers 1 --vocab 1000)

Run it with a Python that has tpuplex (it trains the tokenizer and cuts the rows with tpuplex's own code): the
tests-jax nox environment. Each tpuplex backend runs `tpuplex train` in `.nox/tests-<backend>/bin/python` (or
`--python BACKEND=PYTHON`). HF's side runs in `--hf-python`: transformers 4.57 with Flax, jax, optax and datasets
(transformers 4.57's Flax T5 calls `jnp.clip(a_max=)`, which jax 0.10 no longer takes: jax 0.9.2, flax 0.10.7,
optax 0.2.5 and datasets 4.8 run it). `--hf-script` is examples/flax/language-modeling/run_t5_mlm_flax.py of
transformers 4.x; a copy in `--out` runs, with these changes (each line looked for, so another version of the
script stops here rather than running otherwise):

- its `group_texts` map gets `batch_size=None`: the whole split is packed at once (T5's packing, and tpuplex's)
  instead of each 1,000 lines apart, each dropping its remainder; so both sides cut bit-identical rows;
- its log line also prints the host clock after the loss (`at <time.time()>`): the loss read waits for the step;
- its `send_example_telemetry` import and call are dropped where present (transformers 4.57 has no such function).

What both sides get:
- the text: the non-blank lines of `--text` (datasets' text loader would keep a blank line as an empty text, whose
  EOS tpuplex does not see), the first `--lines` only in a smoke test, cut to a multiple of 20 lines so that HF's
  `train[:5%]` (rounded) and tpuplex's `validation_fraction = 0.05` (floored) hold out the same first lines;
- the tokenizer: tpuplex's `train_t5_tokenizer` (what `tpuplex prepare` runs) trained once on those lines to
  `--vocab` ids, in the model folder both load (HF: `--config_name`, `--tokenizer_name`; tpuplex: model.checkpoint);
  its tokenizer_config.json is given T5's `model_input_names` (input_ids, attention_mask): without them
  transformers' PreTrainedTokenizerFast also returns token_type_ids, which HF's script hands to FlaxT5, which fails;
- the model: a config.json of T5 v1.0 as t5-small's (ReLU MLP, the head tied to the embeddings and fed
  d_model ** -0.5 times the decoder's outputs, 32 position buckets, heads of 64, d_ff = 4 d_model, dropout
  `--dropout` = 0.1), `--d-model` wide (t5-small: 512) with `--layers` blocks in each stack (t5-small: 6). With
  heads x 64 = d_model, HF's Flax initialisation and HF torch's (which tpuplex draws) give every weight the same std;
- the rows: each line tokenized with EOS, all concatenated and cut into rows of 141 tokens, which corrupt into 128
  inputs and 29 targets (noise density 0.15, mean span 3); HF corrupts with numpy's global generator, tpuplex from
  (seed, step); each shuffles the rows its own way; one epoch of rows // `--batch` steps (HF drops the short last
  batch; tpuplex stops before its own);
- the recipe: AdamW (betas 0.9 and 0.999, eps 1e-8, optax's on both jax sides) at `--lr` with `--weight-decay` (the
  README's T5 values, 1e-3 and 0.001, with its batch of 16) on every weight but the RMSNorm scales (HF's decay mask
  and tpuplex's `decays` pick the same T5 weights); no gradient clipping (HF's script has none; clip_norm = 0);
  the rate rises linearly from 0 over `tpuplex.engine.schedule.warmup_steps(steps, --warmup-ratio)` steps, then
  falls linearly to 0 at the last step (optax's joined schedules and tpuplex's `warmup_linear_decay` give update n
  the same rate);
- the evaluation after the last step: every held-out row once, in one batch of them all (HF pads a short last batch
  with rows of zeros, which count, and averages the batches' means: one batch averages every target token, as
  tpuplex does);
- logging every step (HF: `--logging_steps 1`; tpuplex: runtime.log_every = 1): each side then reads each step's
  loss back before the next (tpuplex always does), and both give every step's loss.

Printed per run, and written to `<out>/results.json`:
- train tokens/s: the input tokens (batch x 128) of steps `--window` + 1 .. N over the seconds those steps took, a
  sum over a sum, never a mean of rates. The first `--window` steps, which hold the compilation, are left out on
  both sides: HF, the clock of its log line after step N less that after step `--window` (so each step's
  collation counts); tpuplex, the summed `seconds` of those steps' log.jsonl records (each step's own time, its wait
  for input included);
- the training loss curve: the mean loss of each window of `--window` steps (the first from step 2 on both sides:
  HF's script never logs its first step);
- the final held-out loss per target token.
Then each side's mean and sample std over the seeds, tpuplex jax's tokens/s over HF's, and tpuplex torch and tf
(the first seed only) beside jax's run of that seed: their curves, the largest per-step loss difference, the
held-out loss. Each framework draws its own dropout masks; with `--dropout 0` the three backends' losses agree to a
few 1e-6.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INPUT = REPO.parent / "shared" / "text" / "tinyshakespeare" / "input.txt"
INPUTS_LENGTH = 128  # HF's --max_seq_length; tpuplex's data.max_length
HELD_OUT_PERCENT = 5  # HF's --validation_split_percentage; tpuplex's task.validation_fraction
PATCHES = [  # (what HF's script has, what it gets, required)
    ("        group_texts,\n        batched=True,\n",
     "        group_texts,\n        batched=True,\n        batch_size=None,\n", True),
    ("""f" {train_metric['learning_rate'].mean()})\"""",
     """f" {train_metric['learning_rate'].mean()}) at {time.time():.6f}\"""", True),
    ("from transformers.utils import send_example_telemetry\n", "", False),
    ('    send_example_telemetry("run_t5_mlm", model_args, data_args, framework="flax")\n', "", False),
]
HF_STEP = re.compile(r"Step\.\.\. \((\d+) \| Loss: (\S+), Learning Rate: \S+\) at ([\d.]+)")


def prepare(args: argparse.Namespace) -> tuple[Path, Path]:
    """The text both sides read and the model folder (tokenizer + config.json) both load."""
    from tpuplex.data.t5_tokenizer import train_t5_tokenizer

    lines = [line for line in args.text.read_text(encoding="utf-8").splitlines() if line.strip()]
    lines = lines[:args.lines or len(lines)]
    lines = lines[:len(lines) - len(lines) % (100 // HELD_OUT_PERCENT)]
    text = args.out / "input.txt"
    text.write_text("\n".join(lines) + "\n", encoding="utf-8")
    model = train_t5_tokenizer(lines, args.vocab, args.out / "model")
    # transformers' PreTrainedTokenizerFast returns token_type_ids unless told T5's inputs; HF's script passes every
    # returned column to FlaxT5, which takes no token_type_ids.
    tokenizer_config = json.loads((model / "tokenizer_config.json").read_text())
    tokenizer_config["model_input_names"] = ["input_ids", "attention_mask"]
    (model / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    vocab = len(json.loads((model / "tokenizer.json").read_text())["model"]["vocab"])
    config = {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "is_encoder_decoder": True,
              "vocab_size": vocab, "d_model": args.d_model, "d_kv": 64, "num_heads": args.d_model // 64,
              "d_ff": 4 * args.d_model, "num_layers": args.layers, "num_decoder_layers": args.layers,
              "feed_forward_proj": "relu", "tie_word_embeddings": True, "dropout_rate": args.dropout,
              "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
              "layer_norm_epsilon": 1e-6, "initializer_factor": 1.0, "pad_token_id": 0, "eos_token_id": 1,
              "decoder_start_token_id": 0}
    (model / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return text, model


def tpuplex_config(args: argparse.Namespace, text: Path, model: Path, steps: int, eval_rows: int) -> Path:
    config = args.out / "tpuplex.toml"
    config.write_text(f"""[model]
checkpoint = {json.dumps(str(model))}

[task]
name = "span_corruption"
validation_fraction = {HELD_OUT_PERCENT / 100}

[data]
dataset = "tinyshakespeare"
train_file = {json.dumps(str(text))}
max_length = {INPUTS_LENGTH}

[train]
learning_rate = {args.lr}
weight_decay = {args.weight_decay}
warmup_ratio = {args.warmup_ratio}
schedule = "linear"
max_steps = {steps}
global_batch = {args.batch}
eval_batch = {eval_rows}
clip_norm = 0.0
adam_beta1 = 0.9
adam_beta2 = 0.999
adam_epsilon = 1e-8

[runtime]
log_every = 1
""")
    return config


def rows(config: Path, model: Path) -> tuple[int, int]:
    """(training rows, held-out rows), cut by tpuplex's task as `tpuplex train` cuts them."""
    from tpuplex import config as config_lib
    from tpuplex.tasks.span_corruption import TASK, Options

    data = TASK.prepare(config_lib.load(config), Options(validation_fraction=HELD_OUT_PERCENT / 100), model)
    return len(data.train.input_ids), len(data.eval["validation"].input_ids)


def hf_script(source: Path, out: Path) -> Path:
    text = source.read_text()
    for before, after, required in PATCHES:
        if before not in text:
            if required:
                sys.exit(f"{source} has no line {before!r}: another version of run_t5_mlm_flax.py, update PATCHES")
            continue
        text = text.replace(before, after)
    script = out / "run_t5_mlm_flax.py"
    script.write_text(text)
    return script


def run_hf(args: argparse.Namespace, script: Path, text: Path, model: Path, seed: int, warmup: int,
           eval_rows: int) -> dict:
    folder = args.out / f"hf-{seed}"
    command = [args.hf_python, str(script), f"--output_dir={folder}", "--do_train",
               "--do_eval", "--model_type=t5", f"--config_name={model}", f"--tokenizer_name={model}",
               f"--train_file={text}", f"--validation_split_percentage={HELD_OUT_PERCENT}",
               f"--max_seq_length={INPUTS_LENGTH}", f"--per_device_train_batch_size={args.batch}",
               f"--per_device_eval_batch_size={eval_rows}", f"--learning_rate={args.lr}",
               f"--weight_decay={args.weight_decay}", f"--warmup_steps={warmup}", "--num_train_epochs=1",
               "--logging_steps=1", "--eval_steps=1000000000", "--save_steps=1000000000", f"--seed={seed}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(args.out / "hf-datasets-cache")}
    folder.mkdir(parents=True)  # the script writes eval_results.json there but makes no folder of its own
    started = time.perf_counter()
    finished = subprocess.run(command, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    (folder / "output.log").write_text(finished.stdout + finished.stderr)
    if finished.returncode != 0:
        sys.exit(f"run_t5_mlm_flax.py exited with {finished.returncode}:\n{finished.stderr[-4000:]}")
    logged = {int(step) + 1: (float(loss), float(at)) for step, loss, at in HF_STEP.findall(finished.stdout)}
    at = {step: clock for step, (_, clock) in logged.items()}  # after step n (1-based) ends
    steps = max(logged)
    return {"losses": {step: loss for step, (loss, _) in logged.items()},
            "steps": steps, "seconds": at[steps] - at[args.window],
            "eval_loss": json.loads((folder / "eval_results.json").read_text())["eval_loss"], "wall_s": wall}


def run_tpuplex(args: argparse.Namespace, backend: str, config: Path, seed: int) -> dict:
    folder = args.out / f"tpuplex-{backend}-{seed}"
    python = args.pythons.get(backend) or str(REPO / ".nox" / f"tests-{backend}" / "bin" / "python")
    sets = [f"train.seed={seed}", f"runtime.output_dir={json.dumps(str(folder))}"]
    command = [python, "-m", "tpuplex", "train", str(config), "--backend", backend,
               *(part for setting in sets for part in ("--set", setting))]
    started = time.perf_counter()
    finished = subprocess.run(command, capture_output=True, text=True, cwd=REPO,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
    wall = time.perf_counter() - started
    if finished.returncode != 0:
        sys.exit(f"tpuplex {backend} exited with {finished.returncode}:\n{finished.stderr[-4000:]}")
    records = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
    train = {r["step"]: r for r in records if r["event"] == "train"}
    steps = max(train)
    return {"losses": {step: r["loss"] for step, r in train.items()}, "steps": steps,
            "seconds": sum(r["seconds"] for step, r in train.items() if step > args.window),
            "eval_loss": json.loads((folder / "results.json").read_text())["metrics"]["validation"]["loss"],
            "wall_s": wall}


def figures(run: dict, args: argparse.Namespace) -> dict:
    """tokens/s of steps window+1..N, the loss curve by windows, the held-out loss, from a run's raw record."""
    losses = run["losses"]
    curve = {end: statistics.mean(losses[step] for step in range(max(2, end - args.window + 1), end + 1))
             for end in range(args.window, run["steps"] + 1, args.window)}
    tokens = (run["steps"] - args.window) * args.batch * INPUTS_LENGTH
    return {"tokens_per_s": tokens / run["seconds"], "curve": curve, "eval_loss": run["eval_loss"],
            "wall_s": run["wall_s"], "losses": losses}


def spread(values: list[float], digits: int = 4) -> str:
    deviation = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {deviation:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hf-script", type=Path, required=True, help="run_t5_mlm_flax.py of transformers 4.x")
    parser.add_argument("--hf-python", required=True, help="an interpreter with transformers 4.57 and Flax")
    parser.add_argument("--python", nargs="*", default=[], metavar="BACKEND=PYTHON",
                        help="a backend's interpreter (default: .nox/tests-<backend>/bin/python)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--parity-backends", nargs="*", default=["torch", "tf"],
                        help="tpuplex backends run for the first seed beside jax")
    parser.add_argument("--text", type=Path, default=INPUT, help="tiny Shakespeare's input.txt")
    parser.add_argument("--lines", type=int, default=0, help="only the first N non-blank lines (a smoke test)")
    parser.add_argument("--vocab", type=int, default=8000, help="the tokenizer's ids, sentinels included")
    parser.add_argument("--d-model", type=int, default=256, help="t5-small's is 512")
    parser.add_argument("--layers", type=int, default=2, help="in each stack; t5-small's is 6")
    parser.add_argument("--dropout", type=float, default=0.1, help="t5-small's; 0 makes tpuplex's backends "
                        "comparable step by step (each framework draws its own dropout masks)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=0.001)
    parser.add_argument("--warmup-ratio", type=float, default=0.1)
    parser.add_argument("--window", type=int, default=10, help="steps per loss-curve point; the first window's "
                        "steps (compilation) are left out of tokens/s")
    parser.add_argument("--out", type=Path, required=True, help="a new folder")
    args = parser.parse_args()
    args.pythons = dict(item.split("=", 1) for item in args.python)
    args.out = args.out.resolve()  # tpuplex runs from the repository, HF's script from here
    if args.window < 2:
        parser.error("--window must be at least 2: HF's script logs no clock before its second step")
    if args.d_model % 64:
        parser.error("--d-model must be a multiple of 64 (heads of 64)")
    args.out.mkdir(parents=True, exist_ok=False)
    from tpuplex.engine.schedule import warmup_steps

    text, model = prepare(args)
    config = tpuplex_config(args, text, model, 0, 0)
    train_rows, eval_rows = rows(config, model)
    steps = train_rows // args.batch
    if steps <= 2 * args.window:
        sys.exit(f"{train_rows} training rows make {steps} steps of {args.batch}: fewer than two windows of "
                 f"{args.window}; give more --lines or a smaller --window")
    config = tpuplex_config(args, text, model, steps, eval_rows)
    warmup = warmup_steps(steps, args.warmup_ratio)
    script = hf_script(args.hf_script, args.out)
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    settings = {"d_model": args.d_model, "layers": args.layers, "vocab": vocab, "dropout": args.dropout,
                "lines": len(text.read_text().splitlines()), "train_rows": train_rows, "eval_rows": eval_rows,
                "steps": steps, "warmup_steps": warmup, "batch": args.batch, "lr": args.lr,
                "weight_decay": args.weight_decay, "window": args.window}
    print(json.dumps(settings), flush=True)

    results: dict = {"settings": settings, "runs": {"hf": {}, "tpuplex-jax": {}}}

    def record(side: str, seed: int, run: dict) -> None:
        if run["steps"] != steps:
            sys.exit(f"{side} trained {run['steps']} steps, not {steps}: the sides cut different rows")
        row = figures(run, args)
        results["runs"].setdefault(side, {})[seed] = row
        (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
        curve = " ".join(f"{loss:.3f}" for loss in row["curve"].values())
        print(f"seed {seed} {side:13s} {row['tokens_per_s']:8.1f} tokens/s  held-out loss {row['eval_loss']:.4f}  "
              f"wall {row['wall_s']:.0f} s  curve {curve}", flush=True)

    for seed in args.seeds:  # alternating: each seed runs both sides before the next seed
        record("hf", seed, run_hf(args, script, text, model, seed, warmup, eval_rows))
        record("tpuplex-jax", seed, run_tpuplex(args, "jax", config, seed))
    for backend in args.parity_backends:
        record(f"tpuplex-{backend}", args.seeds[0], run_tpuplex(args, backend, config, args.seeds[0]))

    ends = list(results["runs"]["hf"][args.seeds[0]]["curve"])
    summary = {}
    for side, runs in results["runs"].items():
        done = list(runs.values())
        summary[side] = {figure: [row[figure] for row in done] for figure in ("tokens_per_s", "eval_loss")}
        summary[side]["curve"] = {end: [row["curve"][end] for row in done] for end in ends}
    sides = list(summary)
    print(f"\n{'':>22s}" + "".join(f"{side:>20s}" for side in sides))
    print(f"{'train tokens/s':>22s}" + "".join(f"{spread(summary[s]['tokens_per_s'], 1):>20s}" for s in sides))
    print(f"{'held-out loss':>22s}" + "".join(f"{spread(summary[s]['eval_loss']):>20s}" for s in sides))
    for end in ends:
        print(f"{f'train loss to step {end}':>22s}" + "".join(f"{spread(summary[s]['curve'][end]):>20s}"
                                                            for s in sides))
    ratio = statistics.mean(summary["tpuplex-jax"]["tokens_per_s"]) / statistics.mean(summary["hf"]["tokens_per_s"])
    summary["tokens_per_s_ratio"] = ratio
    print(f"\ntpuplex jax / HF tokens/s: {ratio:.3f}")
    jax = results["runs"]["tpuplex-jax"][args.seeds[0]]
    for backend in args.parity_backends:
        other = results["runs"][f"tpuplex-{backend}"][args.seeds[0]]
        gap = max(abs(other["losses"][step] - jax["losses"][step]) for step in jax["losses"])
        summary[f"{backend}_vs_jax"] = {"max_step_loss_difference": gap,
                                        "eval_loss_difference": other["eval_loss"] - jax["eval_loss"]}
        print(f"tpuplex {backend} vs jax, seed {args.seeds[0]}: largest per-step loss difference {gap:.2e}, "
              f"held-out loss {other['eval_loss']:.4f} vs {jax['eval_loss']:.4f}")
    results["summary"] = summary
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"results: {args.out / 'results.json'}")


if __name__ == "__main__":
    main()

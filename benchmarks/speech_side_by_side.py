"""The speech example (examples/speech/fsdd.toml) beside the same model and recipe as a plain PyTorch CTC loop, run
alternately on this machine, seed by seed.

    python benchmarks/speech_side_by_side.py --seeds 1,2,3 --out runs/speech-bench [--backends jax,tf]

tpuplex: `tpuplex train examples/speech/fsdd.toml --backend torch --set train.seed=S` (a 4-block Conformer, 144 wide,
CTC on characters, 15 epochs of 16 utterances, AdamW lr 2e-3 with 10% warmup then linear decay, weight decay 0.01,
clip 1.0, SpecAugment; dev WER and CER after the last epoch). The plain loop: its own log-mel features (torch.stft
and an HTK mel filterbank, 40 bins of 25 ms frames every 10 ms, computed once), its own Conformer of the same sizes
in plain torch modules (`nn.MultiheadAttention`, a depthwise `nn.Conv1d`, sinusoidal positions), random batches
padded to their longest, SpecAugment with the same masks, `F.ctc_loss` (mean over label lengths, infinities zeroed,
as HF's), the same AdamW, schedule, clipping and epochs, greedy decoding and jiwer's WER/CER on the 83 dev
utterances. Train utterances/s of both: training steps alone (features, evaluation and start-up excluded).
`--backends` adds one tpuplex seed on each. Writes <out>/summary.json and prints a table.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch.nn.functional as F

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "speech" / "fsdd.toml"


def tpuplex_run(backend: str, seed: int, out: Path) -> dict:
    """The example on `backend` with `seed`; its dev metrics and training speed from results.json."""
    command = [sys.executable, "-m", "tpuplex", "train", str(EXAMPLE), "--backend", backend,
               "--set", f"train.seed={seed}", "--set", f"runtime.output_dir={json.dumps(str(out))}"]
    subprocess.run(command, check=True, cwd=REPO)
    results = json.loads((out / "results.json").read_text())
    dev = results["metrics"]["dev"]
    return {"wer": dev["wer"], "cer": dev["cer"], "utterances_per_s": results["train"]["examples_per_s"],
            "train_seconds": results["train"]["seconds"]}


def peer_run(seed: int, device: str = "cpu", train_file: Path | None = None, dev_file: Path | None = None,
             epochs: int = 0, untimed: int = 0) -> dict:
    """The plain PyTorch loop (see the module doc) on `device`, over the example's data or `train_file` and
    `dev_file` (manifests as fsdd's), for the example's epochs or `epochs`; its rate counts the steps after the first
    `untimed` (each step's end waits for the device)."""
    import jiwer
    import soundfile

    from tpuplex import config as tpuplex_config

    settings = tpuplex_config.load(EXAMPLE)
    options, train = settings.task.options, settings.train
    epochs = epochs or train.epochs
    arch = json.loads((EXAMPLE.parent / "conformer-s" / "config.json").read_text())
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    rate, bins = options["sample_rate"], options["mel_bins"]
    frame, hop = int(rate * 0.025), int(rate * 0.010)
    fft = 1 << (frame - 1).bit_length()
    filterbank = torch.from_numpy(htk_filterbank(bins, fft // 2 + 1, rate))
    window = torch.hann_window(frame, periodic=True)

    def log_mel(path: Path) -> torch.Tensor:
        samples = torch.from_numpy(soundfile.read(path, dtype="float32")[0])
        spectrum = torch.stft(samples, fft, hop, frame, window, center=False, return_complex=True).abs() ** 2
        return torch.log(spectrum.T @ filterbank + 1e-6)  # [frames, bins]

    def read(manifest: Path) -> list[tuple[torch.Tensor, str]]:
        with manifest.open(encoding="utf-8", newline="") as file:
            rows = list(csv.DictReader(file, delimiter="\t"))
        return [(log_mel(manifest.parent / row["path"]), row["text"]) for row in rows]

    train_set, dev_set = (read(train_file or Path(settings.data.train_file)),
                          read(dev_file or Path(settings.data.eval_files[0])))
    characters = sorted(set("".join(text for _, text in train_set)))
    index = {character: i + 1 for i, character in enumerate(characters)}  # 0: the blank
    model = PlainConformer(bins, len(characters) + 1, arch).to(device)
    decay = [p for n, p in model.named_parameters() if p.ndim > 1]
    no_decay = [p for n, p in model.named_parameters() if p.ndim <= 1]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": train.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=train.learning_rate,
                                  betas=(train.adam_beta1, train.adam_beta2), eps=train.adam_epsilon)
    steps_per_epoch = len(train_set) // train.global_batch
    total = steps_per_epoch * epochs
    warmup = math.ceil(total * train.warmup_ratio)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: step / max(1, warmup) if step < warmup else max(0.0, (total - step) / (total - warmup)))

    def batch(items: list[tuple[torch.Tensor, str]], augment: bool):
        lengths = torch.tensor([len(f) for f, _ in items])
        features = torch.zeros(len(items), int(lengths.max()), bins)
        for row, (feature, _) in enumerate(items):
            features[row, : len(feature)] = spec_augment(feature, rng, options) if augment else feature
        labels = [torch.tensor([index[c] for c in text if c in index]) for _, text in items]
        return features.to(device), lengths.to(device), labels

    seconds, utterances, steps = 0.0, 0, 0
    for _ in range(epochs):
        model.train()
        order = rng.permutation(len(train_set))
        for step in range(steps_per_epoch):
            items = [train_set[i] for i in order[step * train.global_batch:(step + 1) * train.global_batch]]
            started = time.perf_counter()
            features, lengths, labels = batch(items, augment=True)
            logits, out_lengths = model(features, lengths)
            loss = F.ctc_loss(logits.log_softmax(-1).transpose(0, 1), torch.cat(labels).to(device), out_lengths,
                              torch.tensor([len(label) for label in labels], device=device), blank=0,
                              reduction="mean", zero_infinity=True)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), train.clip_norm)
            optimizer.step()
            schedule.step()
            if device != "cpu":
                torch.cuda.synchronize()
            steps += 1
            if steps > untimed:
                seconds += time.perf_counter() - started
                utterances += len(items)
    model.eval()
    hypotheses = []
    with torch.no_grad():
        for start in range(0, len(dev_set), 32):
            features, lengths, _ = batch(dev_set[start:start + 32], augment=False)
            logits, out_lengths = model(features, lengths)
            for ids, length in zip(logits.argmax(-1).cpu(), out_lengths.cpu(), strict=True):
                kept = [int(i) for n, i in enumerate(ids[:length]) if i and (n == 0 or i != ids[n - 1])]
                hypotheses.append("".join(characters[i - 1] for i in kept))
    references = [text for _, text in dev_set]
    return {"wer": jiwer.wer(references, hypotheses), "cer": jiwer.cer(references, hypotheses),
            "utterances_per_s": round(utterances / seconds, 2), "train_seconds": round(seconds, 3),
            "timed_utterances": utterances}


def htk_filterbank(bins: int, spectrum_bins: int, rate: int) -> np.ndarray:
    """float32 [spectrum_bins, bins]: triangular filters evenly spaced on the HTK mel scale from 0 to rate / 2."""
    def mel(hertz):
        return 2595.0 * np.log10(1.0 + hertz / 700.0)

    edges = 700.0 * (10 ** (np.linspace(0.0, mel(rate / 2), bins + 2) / 2595.0) - 1.0)
    frequencies = np.linspace(0.0, rate / 2, spectrum_bins)
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (frequencies[None] - lower) / (centre - lower)
    falling = (upper - frequencies[None]) / (upper - centre)
    return np.maximum(0.0, np.minimum(rising, falling)).T.astype(np.float32)


def spec_augment(feature, rng: np.random.Generator, options: dict):
    """Time and frequency masks (zeros) as the task's defaults draw them: 2 of up to 20 frames, 2 of up to 10 bins."""
    feature = feature.clone()
    frames, bins = feature.shape
    for _ in range(options.get("time_masks", 2)):
        width = int(rng.integers(0, options.get("time_mask_frames", 20) + 1))
        start = int(rng.integers(0, max(1, frames - width)))
        feature[start:start + width] = 0.0
    for _ in range(options.get("frequency_masks", 2)):
        width = int(rng.integers(0, options.get("frequency_mask_bins", 10) + 1))
        start = int(rng.integers(0, max(1, bins - width)))
        feature[:, start:start + width] = 0.0
    return feature


class FeedForward(nn.Sequential):
    def __init__(self, width: int, inner: int, dropout: float):
        super().__init__(nn.LayerNorm(width), nn.Linear(width, inner), nn.SiLU(), nn.Dropout(dropout),
                         nn.Linear(inner, width), nn.Dropout(dropout))

class Convolution(nn.Module):
    def __init__(self, width: int, kernel: int, dropout: float):
        super().__init__()
        self.norm, self.pointwise1 = nn.LayerNorm(width), nn.Linear(width, 2 * width)
        self.depthwise = nn.Conv1d(width, width, kernel, padding=kernel // 2, groups=width)
        self.depthwise_norm, self.pointwise2 = nn.LayerNorm(width), nn.Linear(width, width)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, real):
        x = nn.functional.glu(self.pointwise1(self.norm(x)), dim=-1) * real[..., None]
        x = self.depthwise(x.transpose(1, 2)).transpose(1, 2)
        return self.dropout(self.pointwise2(nn.functional.silu(self.depthwise_norm(x))))

class Block(nn.Module):
    def __init__(self, width: int, heads: int, inner: int, kernel: int, dropout: float):
        super().__init__()
        self.ffn1, self.ffn2 = FeedForward(width, inner, dropout), FeedForward(width, inner, dropout)
        self.attention_norm = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, dropout=dropout, batch_first=True)
        self.attention_dropout = nn.Dropout(dropout)
        self.conv, self.final_norm = Convolution(width, kernel, dropout), nn.LayerNorm(width)

    def forward(self, x, real):
        x = x + 0.5 * self.ffn1(x)
        h = self.attention_norm(x)
        x = x + self.attention_dropout(self.attention(h, h, h, key_padding_mask=real < 0.5, need_weights=False)[0])
        x = x + self.conv(x, real)
        return self.final_norm(x + 0.5 * self.ffn2(x))

class PlainConformer(nn.Module):
    """features [B, T, mel] with lengths [B] -> (logits [B, T', vocab], output lengths [B])."""

    def __init__(self, mel: int, vocab: int, arch: dict):
        super().__init__()
        width, channels = arch["hidden_size"], arch["subsampling_channels"]
        self.conv1, self.conv2 = nn.Conv2d(1, channels, 3, 2), nn.Conv2d(channels, channels, 3, 2)
        folded = ((mel - 3) // 2 + 1 - 3) // 2 + 1
        self.linear = nn.Linear(channels * folded, width)
        self.dropout = nn.Dropout(arch.get("dropout", 0.1))
        self.blocks = nn.ModuleList(Block(width, arch["num_heads"], arch["ffn_multiplier"] * width,
                                          arch["conv_kernel"], arch.get("dropout", 0.1))
                                    for _ in range(arch["num_layers"]))
        self.head = nn.Linear(width, vocab)
        position = torch.arange(4096)[:, None]
        rates = torch.exp(torch.arange(0, width, 2) * (-math.log(10000.0) / width))
        table = torch.zeros(4096, width)
        table[:, 0::2], table[:, 1::2] = torch.sin(position * rates), torch.cos(position * rates)
        self.register_buffer("positions", table)

    def forward(self, features, lengths):
        x = torch.relu(self.conv2(torch.relu(self.conv1(features[:, None]))))
        rows, channels, frames, bins = x.shape
        x = self.linear(x.transpose(1, 2).reshape(rows, frames, channels * bins))
        x = self.dropout(x + self.positions[:frames])
        out_lengths = ((lengths - 3) // 2 + 1 - 3) // 2 + 1
        real = (torch.arange(frames, device=x.device)[None] < out_lengths[:, None]).float()
        for block in self.blocks:
            x = block(x, real)
        return self.head(x), out_lengths



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--out", type=Path, default=Path("runs/speech-bench"))
    parser.add_argument("--backends", default="", help="one more tpuplex seed on each, e.g. jax,tf")
    args = parser.parse_args()
    seeds = [int(seed) for seed in args.seeds.split(",")]
    rows = []
    for seed in seeds:
        rows.append({"side": "tpuplex torch", "seed": seed, **tpuplex_run("torch", seed, args.out / f"torch-{seed}")})
        print(json.dumps(rows[-1]), flush=True)
        rows.append({"side": "plain PyTorch", "seed": seed, **peer_run(seed)})
        print(json.dumps(rows[-1]), flush=True)
    for backend in filter(None, args.backends.split(",")):
        rows.append({"side": f"tpuplex {backend}", "seed": seeds[0],
                     **tpuplex_run(backend, seeds[0], args.out / f"{backend}-{seeds[0]}")})
        print(json.dumps(rows[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(rows, indent=2))
    print("| side | seeds | dev WER | dev CER | train utterances/s |\n|---|---|---|---|---|")
    for side in dict.fromkeys(row["side"] for row in rows):
        mine = [row for row in rows if row["side"] == side]
        print(f"| {side} | {len(mine)} | {shown(mine, 'wer', 4)} | {shown(mine, 'cer', 4)} | "
              f"{shown(mine, 'utterances_per_s', 1)} |")


def shown(rows: list[dict], key: str, digits: int) -> str:
    """The mean of `key` over `rows`, ± their sample standard deviation where there are several."""
    values = [row[key] for row in rows]
    spread = f" ± {statistics.stdev(values):.{digits}f}" if len(values) > 1 else ""
    return f"{statistics.mean(values):.{digits}f}{spread}"

if __name__ == "__main__":
    main()

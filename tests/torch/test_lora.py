"""LoRA through the CLI on the torch backend: a tiny pretrained Llama's adapters trained on chat data, checkpoints
that hold the adapters alone and resume bit for bit, and the exports PEFT and transformers load with tpuplex's own
losses; and each new decoder family's PEFT folder on transformers' model against its merged weights."""

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import peft
import pytest
import transformers
from chat_data import conversation, write_jsonl, write_tokenizer
from decoder_checks import CONFIGS, NEW_FAMILIES, VOCAB, decoder_spec, hf_reference, lora_spec
from safetensors.numpy import load_file, save_file
from slow_run import assert_same_final_state

import torch
from tpuplex import models
from tpuplex.commands import cli, run_folder, workflow
from tpuplex.engine import checkpoint
from tpuplex.kinds.decoder import initial_decoder_params
from tpuplex.models.lora import PEFT_PREFIX, projection_modules

REPO = Path(__file__).resolve().parents[2]
WORDS = ["apple", "river", "stone", "cloud", "tiger", "piano", "lemon", "glass"]
TARGETS = ["q_proj", "v_proj", "down_proj"]


def write_base(folder: Path) -> Path:
    """A tiny pretrained Llama: the byte-level chat tokenizer, config.json and its weights (drawn once)."""
    write_tokenizer(folder)
    config = {**CONFIGS["llama"], "vocab_size": 258, "max_position_embeddings": 128}
    (folder / "config.json").write_text(json.dumps(config))
    family, arch = models.architecture_of(config)
    drawn = initial_decoder_params(folder, family, arch, seed=11)
    save_file({name: np.asarray(array) for name, array in drawn.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> dict:
    """Six steps of LoRA (rank 4 on q, v and down, alpha 16) on 'Say W.' conversations, a checkpoint every two."""
    root = tmp_path_factory.mktemp("lora")
    base = write_base(root / "base")
    write_jsonl(root / "chat.jsonl", [conversation(f"Say {word}.", word) for word in WORDS * 2])
    config = root / "config.toml"
    config.write_text(
        '[task]\nname = "causal_lm"\nvalidation_fraction = 0.25\n'
        f'[model]\ncheckpoint = {json.dumps(str(base))}\ndropout = false\n'
        f'[model.lora]\nrank = 4\nalpha = 16\ntargets = {json.dumps(TARGETS)}\n'
        f'[data]\ndataset = "say"\ntrain_file = {json.dumps(str(root / "chat.jsonl"))}\nmax_length = 64\n'
        '[train]\nlearning_rate = 3e-2\nepochs = 2\nglobal_batch = 4\nwarmup_ratio = 0.1\n'
        '[runtime]\ncheckpoint_every = 2\nkeep_checkpoints = 10\n')

    def train(output_dir: Path) -> None:
        assert cli.main(["train", str(config), "--backend", "torch",
                         "--set", f"runtime.output_dir={json.dumps(str(output_dir))}"]) == 0

    train(root / "run")
    return {"root": root, "base": base, "run": root / "run", "train": train}


def test_a_lora_checkpoint_holds_the_adapters_and_names_its_base(lora_run):
    """Only the adapters and their moments are written (the frozen base is named by its sha256), and the
    optimizer's bytes in results.json are the adapters' alone."""
    latest = checkpoint.latest(lora_run["run"] / "checkpoints")
    weights = load_file(latest / "model.safetensors")
    assert weights and all(".lora_A." in name or ".lora_B." in name for name in weights)
    assert {name.split(".")[-3] for name in weights} == set(TARGETS)
    info = json.loads((latest / "trainer.json").read_text())
    base = initial_decoder_params(lora_run["base"], *models.architecture_of(
        json.loads((lora_run["base"] / "config.json").read_text())), seed=0)
    assert info["base_sha256"] == models.lora.fingerprint(base)
    counts = json.loads((lora_run["run"] / "results.json").read_text())["parameters"]
    assert counts["trained"] == sum(a.size for a in weights.values()) < 0.1 * counts["total"]
    assert counts["optimizer_state_bytes"] == 8 * counts["trained"]


def test_a_lora_run_resumes_bit_for_bit(lora_run):
    """The run's folder with its step-2 checkpoint alone, trained again by the same command, ends as the run that
    was never interrupted: adapters, moments and step bit for bit."""
    resumed = lora_run["root"] / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copy2(lora_run["run"] / run_folder.RUN_FILE, resumed / run_folder.RUN_FILE)
    shutil.copytree(lora_run["run"] / "checkpoints" / checkpoint.step_dir_name(2),
                    resumed / "checkpoints" / checkpoint.step_dir_name(2))
    lora_run["train"](resumed)
    assert json.loads((resumed / "results.json").read_text())["resumed_from"].endswith(checkpoint.step_dir_name(2))
    assert_same_final_state(resumed, lora_run["run"])


def tpuplex_losses(run: Path, batch: dict) -> np.ndarray:
    """Per-token losses [B, L] of the run's last checkpoint, by the torch backend (the base read from the run's
    model.checkpoint, the adapters from the checkpoint)."""
    experiment, state = workflow.restore(run_folder.locate(run), "torch")
    return experiment.backend.predict(state, batch)[..., 0]


def hf_losses(model: torch.nn.Module, batch: dict) -> np.ndarray:
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(batch["input_ids"]).long()).logits
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), torch.from_numpy(batch["labels"]).long().flatten(),
                                             reduction="none").reshape(batch["labels"].shape).numpy()


def test_peft_loads_the_adapters_and_transformers_the_merged_model_with_tpuplex_losses(lora_run, capsys):
    """`export --format peft` is a folder `peft.PeftModel.from_pretrained(base, folder)` loads, and `--format hf
    --merge` one `from_pretrained` loads: both give the per-token losses tpuplex computes within 1e-4; a LoRA run
    exported as a whole model without --merge is refused in one line."""
    run = lora_run["run"]
    ids = np.random.default_rng(0).integers(0, 258, (4, 17)).astype(np.int32)
    batch = {"input_ids": ids[:, :-1], "labels": ids[:, 1:], "weight": np.ones((4, 16), np.float32)}
    expected = tpuplex_losses(run, batch)

    assert cli.main(["export", str(run), "--format", "peft", "--out", str(lora_run["root"] / "peft")]) == 0
    adapter_config = json.loads((lora_run["root"] / "peft" / "adapter_config.json").read_text())
    assert (adapter_config["r"], adapter_config["lora_alpha"], adapter_config["target_modules"]) == (4, 16, TARGETS)
    base = transformers.AutoModelForCausalLM.from_pretrained(lora_run["base"], dtype=torch.float32)
    with_adapters = peft.PeftModel.from_pretrained(base, lora_run["root"] / "peft").eval()
    np.testing.assert_allclose(hf_losses(with_adapters, batch), expected, atol=1e-4, rtol=0)
    with with_adapters.disable_adapter():
        assert np.abs(hf_losses(with_adapters, batch) - expected).max() > 1e-3  # the adapters count

    assert cli.main(["export", str(run), "--format", "hf", "--merge", "--out", str(lora_run["root"] / "merged")]) == 0
    merged = transformers.AutoModelForCausalLM.from_pretrained(lora_run["root"] / "merged", dtype=torch.float32)
    np.testing.assert_allclose(hf_losses(merged.eval(), batch), expected, atol=1e-4, rtol=0)

    capsys.readouterr()
    assert cli.main(["export", str(run), "--format", "hf", "--out", str(lora_run["root"] / "whole")]) == 2
    assert "holds LoRA adapters, not a whole model: export them with --format peft" in capsys.readouterr().err
    assert not (lora_run["root"] / "whole").exists()


def test_adapters_are_refused_on_another_base(lora_run, capsys):
    """A LoRA checkpoint evaluated after its base changed (other weights under the same path) is refused in one
    line naming both fingerprints' starts, nothing written. Last in the module: it changes the base."""
    weights = load_file(lora_run["base"] / "model.safetensors")
    weights["model.norm.weight"] = weights["model.norm.weight"] * 2
    save_file(weights, str(lora_run["base"] / "model.safetensors"), metadata={"format": "pt"})
    capsys.readouterr()
    assert cli.main(["eval", str(lora_run["run"]), "--backend", "torch"]) == 2
    assert "holds LoRA adapters trained on another base model" in capsys.readouterr().err
    assert not (lora_run["run"] / "eval").exists()


@pytest.mark.parametrize("model_type", NEW_FAMILIES)
def test_each_new_family_peft_folder_gives_the_merged_model_logits(tmp_path, model_type):
    """A new family's adapters (rank 4 on every projection, B drawn so they count) as `export --format peft` writes
    them, put by peft on transformers' own model, give the logits of the merged weights `export --format hf --merge`
    writes, loaded by transformers, within 1e-4: PEFT's names, its fan-in layout and its target modules agree."""
    base = decoder_spec(tmp_path / "base", model_type)
    every_projection = sorted({hf.rsplit(".", 1)[-1] for hf in projection_modules(base.family, base.arch).values()})
    spec = lora_spec(base, rank=4, alpha=8, targets=every_projection)
    lora, weights = spec.lora, {name: np.asarray(array) for name, array in spec.params.items()}
    reference = hf_reference(base)  # the base alone, eval mode, attention written out
    (tmp_path / "peft").mkdir()
    (tmp_path / "peft" / "adapter_config.json").write_text(json.dumps(lora.peft_config("CAUSAL_LM", "base")))
    save_file({f"{PEFT_PREFIX}{name}": array for name, array in weights.items() if ".lora_" in name},
              str(tmp_path / "peft" / "adapter_model.safetensors"), metadata={"format": "pt"})
    with_adapters = peft.PeftModel.from_pretrained(reference, tmp_path / "peft").eval()
    merged = hf_reference(dataclasses.replace(base, params={
        name: np.asarray(array) for name, array in lora.merged(spec.params).items()}))
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, VOCAB, (4, 16))).long()
    with torch.no_grad():
        expected, found = merged(input_ids=ids).logits, with_adapters(input_ids=ids).logits
        with with_adapters.disable_adapter():
            without = with_adapters(input_ids=ids).logits
    np.testing.assert_allclose(found.numpy(), expected.numpy(), atol=1e-4, rtol=0)
    assert np.abs(without.numpy() - expected.numpy()).max() > 1e-3  # the adapters count


def test_the_gpu_lora_benchmark_dry_run(tmp_path) -> None:
    """`benchmarks/gpu_side_by_side.py lora` as the GPU script calls it, on the CPU with a 2-layer model: the
    tpuplex side and transformers + peft + HF's Trainer each train six steps of SST-2-shaped conversations and
    give their tokens a second after the warmup, so a device session never meets a broken side."""
    folder = write_base(tmp_path / "base")
    sst2 = tmp_path / "sst2"
    sst2.mkdir()
    for split, count in (("train", 64), ("dev", 8)):
        rows = "".join(f"{' '.join(WORDS[(i + j) % len(WORDS)] for j in range(i % 3 + 1))}\t{i % 2}\n"
                       for i in range(count))
        (sst2 / f"{split}.tsv").write_text("sentence\tlabel\n" + rows)
    out = tmp_path / "out"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_side_by_side.py"), "lora", "--device", "cpu",
                    "--quick", "--steps", "6", "--warmup", "2", "--torch-mode", "eager", "--smollm2", str(folder),
                    "--sst2", str(sst2), "--out", str(out)], check=True, cwd=REPO, capture_output=True)
    rows = {row["side"]: row for row in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert set(rows) == {"tpuplex-torch", "peft-trainer"}, rows
    assert all(row["tokens_per_s"] > 0 and 0 < row["mfu"] and np.isfinite(row["loss"]) for row in rows.values()), rows
    assert rows["tpuplex-torch"]["windows"] == 2 and rows["peft-trainer"]["steps"] == 6  # steps 3-6 timed

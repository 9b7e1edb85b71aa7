"""A run folder stands alone: copied to a new place, with the text it trained on and the config.json folder it
started from deleted, `tpuplex generate` gives the same text as from the original folder (the vocabulary comes
from run.json, the model's config.json from the folder's `model/` copy), and an HF export reads it too. The
config.json leaves `vocab_size` out, as nanoGPT sizes its vocabulary from the text: the run takes the characters
and end-of-text, and the export's config.json says so; its tokenizer is the run's characters."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import transformers

from tpuplex.commands import api, cli
from tpuplex.tasks.causal_lm.data import Characters

REPO = Path(__file__).resolve().parents[2]


def test_a_run_folder_copied_alone_generates_the_same_text(tmp_path, shared_text, capsys) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus_text = (shared_text / "tinyshakespeare" / "input.txt").read_text()[:20_000]
    corpus.write_text(corpus_text)
    model = shutil.copytree(REPO / "examples" / "shakespeare_char" / "gpt-cpu", tmp_path / "gpt-cpu")
    unsized = json.loads((model / "config.json").read_text())
    del unsized["vocab_size"]
    (model / "config.json").write_text(json.dumps(unsized))
    run = tmp_path / "run"
    config = tmp_path / "char.toml"
    config.write_text(f'[task]\nname = "causal_lm"\ntokenizer = "characters"\n[model]\ncheckpoint = "{model}"\n'
                      f'[data]\ndataset = "chars"\ntrain_file = "{corpus}"\nmax_length = 32\n'
                      f'[train]\nmax_steps = 3\nglobal_batch = 4\n[runtime]\noutput_dir = "{run}"\n'
                      "eval_every = 3\nlog_every = 3\n")
    assert cli.main(["train", str(config), "--backend", "torch"]) == 0
    sample = ["--prompt", "ROMEO:", "--tokens", "40", "--temperature", "1.0", "--seed", "7"]
    capsys.readouterr()
    assert cli.main(["generate", str(run), "--backend", "torch", *sample]) == 0
    original = capsys.readouterr().out.split("40 tokens")[0].rstrip("\n")

    alone = shutil.copytree(run, tmp_path / "elsewhere" / "run")
    shutil.rmtree(run)
    shutil.rmtree(model)
    corpus.unlink()
    assert cli.main(["generate", str(alone), "--backend", "torch", *sample]) == 0
    assert capsys.readouterr().out.split("40 tokens")[0].rstrip("\n") == original
    assert len(set(original)) > 3  # sampled characters, not a run of one
    continued = api.Run.open(alone).generate("ROMEO:", tokens=40, temperature=1.0, seed=7)
    assert continued.rstrip("\n") == original  # the CLI prints what Run.generate returns: the new text alone
    folder = api.Run.open(alone).export("hf")
    exported = json.loads((folder / "config.json").read_text())
    assert exported["vocab_size"] == len(set(corpus_text)) + 1
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)  # the run's characters, written as a tokenizer
    ids = tokenizer(corpus_text[:500])["input_ids"]
    assert ids == Characters.of([corpus_text]).encode(corpus_text[:500], "the text").tolist()
    assert tokenizer.decode(ids) == corpus_text[:500]

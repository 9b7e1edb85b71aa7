"""T5 on the tf backend, at a small size (the tests are tests/common/t5_checks.py's)."""

import json
import shutil
import sys
from pathlib import Path

import pytest
from t5_checks import (  # noqa: F401  (collected here)
    test_generation_matches_transformers,
    test_logits_match_transformers,
    test_training_follows_torch,
)

import tpuplex
from tpuplex.config import RuntimeConfig
from tpuplex.errors import TpuplexError
from tpuplex_tf.backend import TfBackend

EXAMPLE_T5 = Path(__file__).resolve().parents[2] / "examples" / "t5" / "t5-tiny"


@pytest.fixture(scope="module")
def backend():
    return TfBackend(RuntimeConfig(cpu_devices=2))


def test_a_t5_saved_model_takes_texts_and_writes_what_tpuplex_generate_does(tmp_path: Path, monkeypatch) -> None:
    """`tpuplex export RUN --format saved_model` of a text-to-text run: texts in, tokenized, decoded greedily and
    detokenized in the graph, the same texts as `Run.generate` (the host's search over compiled steps); its
    `token_ids` endpoint, the same sequences from the ids `tokenizers` gives."""
    import numpy as np
    import tensorflow as tf
    import tensorflow_text  # noqa: F401 (the SavedModel's ops)
    from tokenizers import Tokenizer

    checkpoint = tmp_path / "t5"
    shutil.copytree(EXAMPLE_T5, checkpoint)
    rows = [{"words": words, "reversed": " ".join(reversed(words.split()))} for words in ("a b", "c d e", "f")] * 8
    for split in ("train", "dev"):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    run = tpuplex.train(tpuplex.Config.from_dict({
        "model": {"checkpoint": str(checkpoint), "dropout": False},
        "task": {"name": "seq2seq", "input_template": "reverse: {{ words }}", "target_template": "{{ reversed }}"},
        "data": {"train_file": str(tmp_path / "train.jsonl"), "eval_files": [str(tmp_path / "dev.jsonl")],
                 "max_length": 16},
        "train": {"max_steps": 2, "global_batch": 8, "learning_rate": 1e-2},
        "runtime": {"output_dir": str(tmp_path / "run"), "cpu_devices": 1}}), "tf")
    served = tf.saved_model.load(str(run.export("saved_model", tmp_path / "saved"))).signatures
    prompts = ["reverse: a b", "reverse: c d e f", "Reverse:  F!", "reverse: " + "g " * 20]  # the last one cut
    written = served["serving_default"](text=tf.constant(prompts))
    texts = [text.decode() for text in written["texts"].numpy()]
    assert texts == run.generate(prompts, tokens=written["sequences"].shape[1])

    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    ids = np.zeros((len(prompts), 16), np.int32)
    for row, prompt in enumerate(prompts):
        encoded = tokenizer.encode(prompt).ids[:15] + [1]  # its tokens, then </s>
        ids[row, :len(encoded)] = encoded
    sequences = served["token_ids"](input_ids=tf.constant(ids), attention_mask=tf.constant((ids > 0).astype(np.int32)))
    np.testing.assert_array_equal(sequences["sequences"].numpy(), written["sequences"].numpy())
    assert written["sequences"].shape == (4, max(len(tokenizer.encode(row["reversed"]).ids) for row in rows))

    monkeypatch.setitem(sys.modules, "tensorflow_text", None)  # as if not installed: one line, nothing written
    with pytest.raises(TpuplexError, match="pip install --no-deps tensorflow-text"):
        run.export("saved_model", tmp_path / "without")
    assert not (tmp_path / "without").exists()


def test_the_graph_tokenizer_gives_what_tokenizers_gives_on_real_text(tmp_path: Path, shared_glue: Path,
                                                                      shared_text: Path) -> None:
    """`TextTokenizer` (the text-to-text SavedModel's tokenizer in TensorFlow ops) against `tokenizers` itself on
    every sentence of MRPC's and RTE's dev sets and tiny Shakespeare's first paragraphs, plus the corners
    (sentinels in the text, control characters, runs of spaces, digits, punctuation, compatibility characters):
    the same ids, and the same text decoded back. Both tokenizers `tpuplex prepare` trains: lower-cased (the
    example's t5-tiny) and cased."""
    import tensorflow as tf
    from tokenizers import Tokenizer, models

    from tpuplex.data.t5_tokenizer import graph_tokenizer, train_t5_tokenizer
    from tpuplex_tf.tasks.seq2seq import TextTokenizer

    texts = []
    for task in ("MRPC", "RTE"):
        lines = (shared_glue / task / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
        texts += [field for line in lines for field in line.split("\t")[-2:]]
    texts += (shared_text / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")[:200_000].split("\n\n")
    texts += ["", " ", "<extra_id_0>", "a<extra_id_0>b", "a <extra_id_0> b<extra_id_1>", "x<pad></s>y ", "a  \t b",
              " x", "Don't stop: 12.5%", "\x01a\u2581b\ufeffc\u200bd", "ÀÉÎ ǅ ß ﬁ ½ x² İstanbul ①"]
    cased = train_t5_tokenizer(texts[:2000], 600, tmp_path / "cased", sentinels=4, lowercase=False)
    for folder in (EXAMPLE_T5, cased):
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        graph = TextTokenizer(graph_tokenizer(tokenizer), length=1024)
        ids, mask = (tensor.numpy() for tensor in graph.encode(tf.constant(texts)))
        expected = [tokenizer.encode(text, add_special_tokens=False).ids[:1023] + [1] for text in texts]
        assert [list(row[:count]) for row, count in zip(ids, mask.sum(axis=1), strict=True)] == expected
        decoded = [text.decode() for text in graph.decode(tf.constant(ids)).numpy()]  # up to the first </s>
        assert decoded == [tokenizer.decode(row[:row.index(1)], skip_special_tokens=True) for row in expected]
    with pytest.raises(TpuplexError, match="not a T5 tokenizer tpuplex prepare trains"):
        graph_tokenizer(Tokenizer(models.WordPiece({"[UNK]": 0}, unk_token="[UNK]")))

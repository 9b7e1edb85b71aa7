"""The token-classification task's framework-free half: entity scores equal seqeval's, real WNUT-17 read and
aligned as HF run_ner aligns it, every word counted (cut ones too), and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from seqeval.metrics import sequence_labeling

from tpuplex import config
from tpuplex.commands import cli
from tpuplex.data.tokenize import load_tokenizer
from tpuplex.errors import TpuplexError
from tpuplex.tasks.token_classification import TASK, TokenData, scored
from tpuplex.tasks.token_classification import data as tagged
from tpuplex.tasks.token_classification.entities import scores

ROOT = Path(__file__).resolve().parents[2]
WNUT_FILES = {"train": "wnut17train.conll", "dev": "emerging.dev.conll", "test": "emerging.test.annotated"}

IOB2 = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
IOBES = [*IOB2, "E-PER", "S-PER", "E-LOC", "S-LOC"]
sentences_of = st.lists(st.lists(st.sampled_from(IOBES), min_size=1, max_size=12), min_size=1, max_size=6)


def seqeval_scores(gold: list[list[str]], predicted: list[list[str]]) -> dict[str, float]:
    """seqeval's default mode: micro precision/recall/F1, the same per type, and accuracy."""
    expected = {}
    for name, value in zip(("precision", "recall", "f1"), sequence_labeling.precision_recall_fscore_support(
            gold, predicted, average="micro", zero_division=0)[:3], strict=True):
        expected[name] = float(value)
    true_types = {kind for kind, _, _ in sequence_labeling.get_entities(gold)}
    predicted_types = {kind for kind, _, _ in sequence_labeling.get_entities(predicted)}
    per_type = sequence_labeling.precision_recall_fscore_support(gold, predicted, average=None, zero_division=0)
    for index, kind in enumerate(sorted(true_types | predicted_types)):
        for name, values in zip(("precision", "recall", "f1", "support"), per_type, strict=True):
            expected[f"{kind}/{name}"] = float(values[index])
    return expected | {"accuracy": float(sequence_labeling.accuracy_score(gold, predicted))}


@settings(max_examples=300)
@given(sentences_of, st.data())
def test_entity_scores_equal_seqeval_including_ill_formed_tags(gold, data):
    """Random IOB2/IOBES sequences: I- with no B-, E- with no B-, a type change inside a span."""
    predicted = [data.draw(st.lists(st.sampled_from(IOBES), min_size=len(s), max_size=len(s))) for s in gold]
    found, expected = scores(gold, predicted), seqeval_scores(gold, predicted)
    assert found.keys() == expected.keys()
    for name, value in expected.items():
        assert found[name] == pytest.approx(value, abs=1e-12), name


@settings(max_examples=100)
@given(st.lists(st.lists(st.sampled_from(IOB2), min_size=1, max_size=12), min_size=1, max_size=6))
def test_perfect_predictions_score_one(gold):
    found = scores(gold, gold)
    assert found["accuracy"] == 1.0
    assert found["f1"] == (1.0 if any(tag != "O" for s in gold for tag in s) else 0.0)


def read(folder: Path, split: str) -> tagged.Sentences:
    return tagged.read_sentences(tagged.data_file("data.train_file", str(folder / WNUT_FILES[split])), -1,
                                 "tokens", "tags")


def test_wnut17_reads_as_its_files_hold_it(shared_text):
    """Sentence and word counts of the three files (a blank or tab-only line ends a sentence), 13 IOB2 tags."""
    folder = shared_text / "wnut17"
    counts = {split: (len(found), sum(map(len, found.words))) for split in WNUT_FILES
              for found in [read(folder, split)]}
    assert counts == {"train": (3394, 62730), "dev": (1009, 15733), "test": (1287, 23394)}
    tags = tagged.tag_set(read(folder, "train"))
    assert len(tags) == 13 and tags[-1] == "O" and all(t == "O" or t[:2] in ("B-", "I-") for t in tags)


def test_alignment_labels_each_word_once_and_counts_every_cut_word(shared_text, minilm_dir):
    """The first sub-token of each word carries its tag (HF run_ner); cut at max_length 32, the words past the cut
    have no position, and scored positions plus cut words are all the words."""
    sentences = read(shared_text / "wnut17", "test")
    tags = tagged.tag_set(read(shared_text / "wnut17", "train"))
    aligned = tagged.align(sentences, load_tokenizer(minilm_dir, 32), 32, tags)
    labels = aligned.encoded.labels
    assert aligned.cut_words > 0 and aligned.cut_sentences > 0
    assert (labels >= 0).sum() + aligned.cut_words == sum(map(len, sentences.words))
    for row in range(len(sentences)):
        starts = aligned.word_starts[row]
        kept = starts >= 0
        assert np.array_equal(labels[row, starts[kept]], aligned.tag_ids[row][kept])
        assert np.all(np.diff(starts[kept]) > 0) and (starts[kept] < aligned.encoded.lengths[row]).all()


def test_label_all_tokens_turns_b_into_i_on_later_sub_tokens(minilm_dir):
    sentences = tagged.Sentences(Path("x"), [["Zyxwvutsrq", "went", "home"]], [["B-PER", "O", "O"]], [1])
    tags = ("B-PER", "I-PER", "O")
    aligned = tagged.align(sentences, load_tokenizer(minilm_dir, 32), 32, tags, label_all_tokens=True)
    first = aligned.word_starts[0][0]
    pieces = aligned.word_starts[0][1] - first
    assert pieces > 1  # the made-up name splits into several word pieces
    assert aligned.encoded.labels[0, first:first + pieces].tolist() == [0] + [1] * (pieces - 1)


def test_batches_weigh_scored_positions_only():
    batch = {"labels": np.array([[-1, 3, -1, 0], [-1, 2, 2, -1]], np.int32), "weight": np.array([1, 0], np.float32)}
    found = scored(batch)
    assert found["weight"].tolist() == [[0, 1, 0, 1], [0, 0, 0, 0]] and found["labels"].min() == 0


def test_metrics_count_cut_words_as_predicted_o():
    """A word with no position is predicted O: a gold entity there is missed, not dropped."""
    sentences = tagged.Sentences(Path("x"), [["Anna", "lives", "in", "Oslo"]], [["B-PER", "O", "O", "B-LOC"]], [1])
    tags = ("B-LOC", "B-PER", "O")
    aligned = tagged.Aligned(sentences, None, [np.array([1, 2, 3, -1], np.int32)], [np.array([1, 2, 2, 0])])
    logits = np.zeros((1, 8, 3), np.float32)
    logits[0, 1, 1] = logits[0, 2, 2] = logits[0, 3, 2] = 5.0  # Anna B-PER, lives O, in O
    data = TokenData("x", None, {}, tags, {"dev": aligned})
    labels = np.zeros((1, 8), np.int32)
    found = data.metrics("dev", logits, labels, np.zeros((1, 8), np.float32))
    assert (found["precision"], found["recall"], found["cut_words"]) == (1.0, 0.5, 1.0)


def test_the_example_config_loads():
    loaded = config.load(ROOT / "examples" / "ner" / "wnut17.toml")
    assert loaded.task.name == "token_classification" and loaded.data.train_file.endswith("wnut17train.conll")


def ner_config(tmp_path: Path, model: Path, files: dict[str, str], **task: object) -> Path:
    options = "".join(f"{name} = {json.dumps(value)}\n" for name, value in task.items())
    written = {}
    for name, text in files.items():
        written[name] = tmp_path / name
        written[name].write_text(text)
    path = tmp_path / "ner.toml"
    path.write_text(f'[task]\nname = "token_classification"\n{options}[model]\ncheckpoint = "{model}"\n'
                    f'[data]\ndataset = "tags"\ntrain_file = "{written["train.conll"]}"\n'
                    f'eval_files = ["{written["dev.conll"]}"]\nmax_length = 32\n'
                    f'[train]\nmax_steps = 1\nglobal_batch = 8\n[runtime]\noutput_dir = "{tmp_path / "run"}"\n')
    return path


GOOD = "EU\tB-ORG\nrejects\tO\n\nPeter\tB-PER\nBlackburn\tI-PER\n"


@pytest.mark.parametrize(("files", "task", "fragment"), [
    ({"train.conll": "EU\tB-ORG\nrejects\n", "dev.conll": GOOD}, {}, "train.conll line 2 has 1 column(s) and no tag"),
    ({"train.conll": GOOD, "dev.conll": "\n\n-DOCSTART-\tO\n\n"}, {}, "dev.conll holds no sentences"),
    ({"train.conll": "EU\tORG\nrejects\tO\n", "dev.conll": GOOD}, {}, "the tag 'ORG', which is in no tag scheme"),
    ({"train.conll": GOOD, "dev.conll": "Oslo\tB-LOC\n"}, {}, "dev.conll sentence at line 1 has the tag 'B-LOC'"),
    ({"train.conll": GOOD, "dev.conll": GOOD}, {"tag_column": 3}, "line 1 has 2 column(s) and no tag in column 3"),
])
def test_bad_ner_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, minilm_dir, files, task, fragment):
    code = cli.main(["train", str(ner_config(tmp_path, minilm_dir, files, **task)), "--backend", "numpy"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tpuplex:")]
    assert code == 2 and len(errors) == 1 and errors[0].startswith("tpuplex: error: "), errors
    assert fragment in errors[0], errors[0]
    assert not (tmp_path / "run").exists()


def test_a_tag_outside_the_run_s_tags_at_predict_time_names_file_and_line(tmp_path, minilm_dir):
    path = ner_config(tmp_path, minilm_dir, {"train.conll": GOOD, "dev.conll": GOOD,
                                             "test.conll": "Oslo\tO\n\nin\tO\nNorway\tB-LOC\n"})
    tags = 'task.tags=["B-ORG","B-PER","I-PER","O"]'
    loaded = config.load(path, [f'data.test_file="{tmp_path / "test.conll"}"', tags])
    with pytest.raises(TpuplexError, match=r"test.conll sentence at line 3 has the tag 'B-LOC'"):
        TASK.prediction_sources(loaded, "test")

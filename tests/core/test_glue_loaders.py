"""Reading GLUE splits: the original TSV layouts, their errors, the real files, the HF hub path, data resolution."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest

from tpuplex import TpuplexError
from tpuplex.tasks.sequence_classification.glue import get_dataset, read_hub_split, read_split
from tpuplex.tasks.sequence_classification.glue.hub import HubUnavailableError
from tpuplex.tasks.sequence_classification.glue.sources import resolve_source

MNLI_DEV_HEADER = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
                   "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\t"
                   "gold_label")
MNLI_TRAIN_HEADER = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
                     "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label")
STSB_HEADER = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"


def write_tsv(path: Path, lines: list[str], bom: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(("\ufeff" if bom else "") + "\n".join(lines) + "\n", encoding="utf-8")
    return path


def mnli_row(index: int, premise: str, hypothesis: str, gold: str, annotators: int) -> str:
    parses = ["( p )", "( h )", "(ROOT p)", "(ROOT h)"]
    return "\t".join([str(index), "31193", f"{index}n", "fiction", *parses, premise, hypothesis,
                      *[gold] * annotators, gold])


# --- layouts ----------------------------------------------------------------------------------------------------


def test_cola_has_no_header_row(tmp_path):
    write_tsv(tmp_path / "CoLA" / "train.tsv", [
        "gj04\t1\t\tOur friends won't buy this analysis, let alone the next one we propose.",
        "gj04\t0\t*\tThey drank the pub.",
        "cj99\t1\t\tThe more we study verbs, the crazier they get.",
    ])
    examples = read_split(get_dataset("cola"), "train", tmp_path / "CoLA")
    assert examples.text_a == ["Our friends won't buy this analysis, let alone the next one we propose.",
                               "They drank the pub.", "The more we study verbs, the crazier they get."]
    assert examples.text_b is None
    assert examples.labels.dtype == np.int32 and examples.labels.tolist() == [1, 0, 1]


def test_sst2_single_sentence_keeps_text_verbatim(tmp_path):
    write_tsv(tmp_path / "train.tsv", ["sentence\tlabel", "it 's a charming journey . \t1", 'a " bleak film\t0'])
    examples = read_split(get_dataset("sst2"), "train", tmp_path)
    # Quoting is off: the stray quote and the trailing space stay as written.
    assert examples.text_a == ["it 's a charming journey . ", 'a " bleak film']
    assert examples.labels.tolist() == [1, 0]


def test_mrpc_header_with_byte_order_mark_and_label_first(tmp_path):
    write_tsv(tmp_path / "dev.tsv", [
        "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
        '1\t1355540\t1355592\tHe said the pie business doesn \'t fit .\t" The pie business does not fit .',
        "0\t2029631\t2029565\tMagnarelli said Racicot hated the regime .\tHis wife said he was behind Bush .",
    ], bom=True)
    examples = read_split(get_dataset("mrpc"), "dev", tmp_path)
    assert examples.text_a == ["He said the pie business doesn 't fit .", "Magnarelli said Racicot hated the regime ."]
    assert examples.text_b == ['" The pie business does not fit .', "His wife said he was behind Bush ."]
    assert examples.labels.tolist() == [1, 0]


def test_stsb_float_scores_from_column_nine(tmp_path):
    prefix = "\tmain-captions\tMSRvid\t2012test\t0000\tnone\tnone\t"
    write_tsv(tmp_path / "dev.tsv", [
        STSB_HEADER,
        f"0{prefix}A man with a hard hat is dancing.\tA man wearing a hard hat is dancing.\t5.000",
        f"1{prefix}A young child is riding a horse.\tA child is riding a horse.\t4.750",
        f"2{prefix}A man is cutting up a cucumber.\tA man is slicing a tomato.\t0.6",
    ])
    examples = read_split(get_dataset("stsb"), "dev", tmp_path)
    assert examples.labels.dtype == np.float32
    np.testing.assert_array_equal(examples.labels, np.array([5.0, 4.75, 0.6], dtype=np.float32))
    assert examples.text_b == ["A man wearing a hard hat is dancing.", "A child is riding a horse.",
                               "A man is slicing a tomato."]


def test_mnli_matched_and_mismatched_dev_files_and_gold_label_last(tmp_path):
    task = get_dataset("mnli")
    write_tsv(tmp_path / "train.tsv", [MNLI_TRAIN_HEADER, mnli_row(0, "P0", "H0", "neutral", 1)])
    write_tsv(tmp_path / "dev_matched.tsv", [MNLI_DEV_HEADER, mnli_row(0, "P1", "H1", "contradiction", 5),
                                             mnli_row(1, "P2", "H2", "entailment", 5)])
    write_tsv(tmp_path / "dev_mismatched.tsv", [MNLI_DEV_HEADER, mnli_row(0, "P3", "H3", "neutral", 5)])
    train = read_split(task, "train", tmp_path)
    matched = read_split(task, "dev_matched", tmp_path)
    mismatched = read_split(task, "dev_mismatched", tmp_path)
    assert (train.text_a, train.text_b, train.labels.tolist()) == (["P0"], ["H0"], [1])
    assert (matched.text_a, matched.text_b, matched.labels.tolist()) == (["P1", "P2"], ["H1", "H2"], [2, 0])
    assert (mismatched.text_a, mismatched.labels.tolist()) == (["P3"], [1])
    with pytest.raises(TpuplexError, match="no split 'dev': use one of train, dev_matched, dev_mismatched"):
        read_split(task, "dev", tmp_path)


@pytest.mark.parametrize(("name", "header", "row", "expected"), [
    ("qqp", "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate", "7\t15\t16\tHow?\tWhy?\t1", ("How?", "Why?", 1)),
    ("qnli", "index\tquestion\tsentence\tlabel", "0\tWho?\tHe did.\tnot_entailment", ("Who?", "He did.", 1)),
    ("rte", "index\tsentence1\tsentence2\tlabel", "0\tA cat sat.\tAn animal sat.\tentailment",
     ("A cat sat.", "An animal sat.", 0)),
    ("wnli", "index\tsentence1\tsentence2\tlabel", "0\tIt has a hole.\tThe carrot has a hole.\t1",
     ("It has a hole.", "The carrot has a hole.", 1)),
])
def test_pair_layouts(tmp_path, name, header, row, expected):
    write_tsv(tmp_path / "dev.tsv", [header, row])
    examples = read_split(get_dataset(name), "dev", tmp_path)
    assert (examples.text_a[0], examples.text_b[0], int(examples.labels[0])) == expected


def test_blank_lines_are_skipped_and_line_numbers_stay_physical(tmp_path):
    path = write_tsv(tmp_path / "train.tsv", ["sentence\tlabel", "good\t1", "", "bad\t0", "", "worse\t2"])
    with pytest.raises(TpuplexError, match=f"{path} line 6: label '2'"):
        read_split(get_dataset("sst2"), "train", tmp_path)
    write_tsv(tmp_path / "dev.tsv", ["sentence\tlabel", "good\t1", "", "bad\t0", ""])
    assert read_split(get_dataset("sst2"), "dev", tmp_path).labels.tolist() == [1, 0]


# --- errors -----------------------------------------------------------------------------------------------------


def test_missing_directory(tmp_path):
    with pytest.raises(TpuplexError, match=f"GLUE data folder {tmp_path / 'RTE'} does not exist"):
        read_split(get_dataset("rte"), "train", tmp_path / "RTE")


def test_missing_file_names_the_expected_files(tmp_path):
    write_tsv(tmp_path / "train.tsv", ["index\tsentence1\tsentence2\tlabel", "0\ta\tb\tentailment"])
    with pytest.raises(TpuplexError, match=f"GLUE file {tmp_path / 'dev.tsv'} does not exist.*train.tsv, dev.tsv"):
        read_split(get_dataset("rte"), "dev", tmp_path)


def test_row_missing_a_column_names_file_and_line(tmp_path):
    path = write_tsv(tmp_path / "train.tsv", ["index\tsentence1\tsentence2\tlabel", "0\ta\tb\tentailment",
                                              "1\tno second sentence\tentailment"])
    with pytest.raises(TpuplexError, match=f"{path} line 3 has 3 tab-separated fields, expected 4"):
        read_split(get_dataset("rte"), "train", tmp_path)


def test_headerless_row_missing_a_column(tmp_path):
    path = write_tsv(tmp_path / "train.tsv", ["gj04\t1\t\tFine.", "gj04\t0\tThey drank the pub."])
    with pytest.raises(TpuplexError, match=f"{path} line 2 has 3 tab-separated fields, expected 4"):
        read_split(get_dataset("cola"), "train", tmp_path)


def test_label_outside_the_task_labels(tmp_path):
    path = write_tsv(tmp_path / "dev.tsv", ["index\tsentence1\tsentence2\tlabel", "0\ta\tb\tentailment",
                                            "1\ta\tb\tneutral"])
    with pytest.raises(TpuplexError) as error:
        read_split(get_dataset("rte"), "dev", tmp_path)
    assert str(error.value) == (f"{path} line 3: label 'neutral' is not a rte label: "
                                "allowed labels are entailment, not_entailment")


def test_stsb_score_that_is_not_a_number(tmp_path):
    row = "0\tg\tf\ty\t0\tnone\tnone\ta\tb\t"
    path = write_tsv(tmp_path / "train.tsv", [STSB_HEADER, row + "4.0", row + "high"])
    with pytest.raises(TpuplexError, match=f"{path} line 3: score 'high' is not a finite number"):
        read_split(get_dataset("stsb"), "train", tmp_path)


@pytest.mark.parametrize("lines", [["sentence\tlabel"], []], ids=["header-only", "empty-file"])
def test_empty_split(tmp_path, lines):
    path = write_tsv(tmp_path / "train.tsv", lines) if lines else tmp_path / "train.tsv"
    path.touch()
    with pytest.raises(TpuplexError, match=f"{path} holds no examples"):
        read_split(get_dataset("sst2"), "train", tmp_path)


def test_wrong_file_for_the_task_names_the_missing_column(tmp_path):
    path = write_tsv(tmp_path / "train.tsv", ["index\tsentence1\tsentence2\tlabel", "0\ta\tb\tentailment"])
    with pytest.raises(TpuplexError, match=f"{path} has no column 'sentence' \\(its header is index, sentence1"):
        read_split(get_dataset("sst2"), "train", tmp_path)


def test_unknown_split(tmp_path):
    with pytest.raises(TpuplexError, match="GLUE task rte has no split 'validation': use one of train, dev, test"):
        read_split(get_dataset("rte"), "validation", tmp_path)


# --- the real GLUE files ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("folder", "task", "split", "count"), [
    ("MRPC", "mrpc", "train", 3668), ("MRPC", "mrpc", "dev", 408),
    ("SST-2", "sst2", "train", 67349), ("SST-2", "sst2", "dev", 872),
    ("RTE", "rte", "train", 2490), ("RTE", "rte", "dev", 277),
    ("WNLI", "wnli", "train", 635), ("WNLI", "wnli", "dev", 71),
])
def test_real_glue_counts(shared_glue, folder, task, split, count):
    examples = read_split(get_dataset(task), split, shared_glue / folder)
    assert len(examples) == len(examples.labels) == count
    assert set(np.unique(examples.labels)) == {0, 1}
    assert all(examples.text_a)
    assert (examples.text_b is None) == (task == "sst2")
    if examples.text_b is not None:
        assert len(examples.text_b) == count and all(examples.text_b)


def test_real_mrpc_header_bom_is_not_part_of_the_text(shared_glue):
    assert (shared_glue / "MRPC" / "dev.tsv").read_bytes().startswith(b"\xef\xbb\xbfQuality")
    examples = read_split(get_dataset("mrpc"), "dev", shared_glue / "MRPC")
    assert not any("\ufeff" in text for text in examples.text_a + examples.text_b)


# --- the HF hub path ----------------------------------------------------------------------------------------------


def fake_datasets(monkeypatch, load_dataset) -> None:
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))


def test_hub_without_datasets_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` raise ImportError
    with pytest.raises(HubUnavailableError, match="datasets library is not installed: pip install datasets") as error:
        read_hub_split(get_dataset("rte"), "train")
    assert isinstance(error.value, TpuplexError)


def test_hub_offline(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("offline")

    fake_datasets(monkeypatch, offline)
    with pytest.raises(HubUnavailableError, match=r"nyu-mll/glue rte/validation could not be loaded .*ConnectionError"):
        read_hub_split(get_dataset("rte"), "dev")


def test_hub_columns_and_split_names(monkeypatch):
    calls = []

    def load_dataset(path, name, split):
        calls.append((path, name, split))
        return {"premise": ["P"], "hypothesis": ["H"], "label": [2], "idx": [0]}

    fake_datasets(monkeypatch, load_dataset)
    examples = read_hub_split(get_dataset("mnli"), "dev_mismatched")
    assert calls == [("nyu-mll/glue", "mnli", "validation_mismatched")]
    assert (examples.text_a, examples.text_b, examples.labels.tolist()) == (["P"], ["H"], [2])


def test_hub_rejects_unlabelled_rows(monkeypatch):
    fake_datasets(monkeypatch, lambda *a, **k: {"sentence": ["s"], "label": [-1]})
    with pytest.raises(TpuplexError, match="labels outside 0..1"):
        read_hub_split(get_dataset("sst2"), "train")


# --- data resolution ----------------------------------------------------------------------------------------------


@pytest.fixture
def rte_folder(tmp_path) -> Path:
    for split in ("train", "dev"):
        write_tsv(tmp_path / "glue" / "RTE" / f"{split}.tsv",
                  ["index\tsentence1\tsentence2\tlabel", f"0\t{split} a\t{split} b\tentailment"])
    return tmp_path / "glue" / "RTE"


def test_data_dir_that_does_not_exist(tmp_path):
    with pytest.raises(TpuplexError, match=f"data.data_dir {tmp_path / 'nowhere'} does not exist"):
        resolve_source(get_dataset("rte"), "train", tmp_path / "nowhere")


def test_data_dir_may_be_the_task_folder_or_the_glue_folder(rte_folder, monkeypatch):
    monkeypatch.setenv("GLUE_DIR", "/nonexistent")
    for folder in (rte_folder, rte_folder.parent, str(rte_folder)):
        assert resolve_source(get_dataset("rte"), "dev", folder).read().text_a == ["dev a"]


def test_glue_dir_when_no_data_dir(rte_folder, monkeypatch):
    monkeypatch.setenv("GLUE_DIR", str(rte_folder.parent))
    for data_dir in (None, ""):
        assert resolve_source(get_dataset("rte"), "train", data_dir).read().text_a == ["train a"]


def test_hub_when_no_files(monkeypatch):
    monkeypatch.delenv("GLUE_DIR", raising=False)
    fake_datasets(monkeypatch, lambda *a, **k: {"sentence1": ["x"], "sentence2": ["y"], "label": [1]})
    assert resolve_source(get_dataset("rte"), "dev", None).read().labels.tolist() == [1]


def test_no_source_gives_one_error_listing_the_three_ways(monkeypatch, tmp_path):
    monkeypatch.setenv("GLUE_DIR", str(tmp_path))
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(TpuplexError) as error:
        resolve_source(get_dataset("rte"), "train", None)
    message = str(error.value)
    assert "\n" not in message
    for part in ("--data-dir", "data.data_dir", "GLUE_DIR", "pip install datasets",
                 f"GLUE_DIR has no RTE folder ({tmp_path / 'RTE'})", "datasets library is not installed"):
        assert part in message

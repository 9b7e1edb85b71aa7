"""Your own data ([data] train_file, eval_files, ...): every format trains exactly as GLUE's loader, the real MRPC
files encode identically in every format, the token cache keys, and bad input is one clear line."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from custom_files import COLUMNS, FIRST, LABEL, SECOND, WRITERS, custom_fields, mrpc_splits, records, write_splits
from tiny_glue import train_losses

from tpuplex import config as config_lib
from tpuplex import tasks
from tpuplex.commands import cli, run
from tpuplex.config import DataConfig
from tpuplex.data.tables import read_table, resolve_file
from tpuplex.errors import TpuplexError
from tpuplex.tasks.sequence_classification.custom import LabelledTable, custom_data, dataset_sources, file_source
from tpuplex.tasks.sequence_classification.features import encode_cached, load_encoded
from tpuplex.tasks.sequence_classification.glue import get_dataset, read_split
from tpuplex.tasks.sequence_classification.glue.files import Examples


def table_config(paths: dict[str, str], **changes) -> tuple[DataConfig, LabelledTable]:
    """The [data] section of `custom_fields(paths)` and its [task] options with `changes` (task options), read as a
    config file's would be."""
    sections: dict[str, dict] = {"data": {}, "task": {}}
    for key, value in custom_fields(paths).items():
        section, name = key.split("__")
        sections[section][name] = value
    sections["task"] |= changes
    loaded = config_lib.from_dict(sections)
    return loaded.data, tasks.options(tasks.get(loaded.task.name), loaded.task.options)


# --- the same examples train the same way ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", [*WRITERS, "datasets"])
def test_each_format_trains_to_the_glue_losses_bit_for_bit(kind, write_config, tiny_mrpc, tmp_path, capsys) -> None:
    paths = write_splits(tmp_path / "data", kind, mrpc_splits(tiny_mrpc))
    glue = write_config(runtime__output_dir=str(tmp_path / "glue"), runtime__log_every=1)
    assert cli.main(["train", str(glue), "--backend", "numpy"]) == 0, capsys.readouterr().err
    custom = write_config(runtime__output_dir=str(tmp_path / "custom"), runtime__log_every=1, **custom_fields(paths))
    assert cli.main(["train", str(custom), "--backend", "numpy"]) == 0, capsys.readouterr().err

    expected = json.loads((tmp_path / "glue" / "results.json").read_text())
    results = json.loads((tmp_path / "custom" / "results.json").read_text())
    assert len(train_losses(tmp_path / "glue")) == expected["total_steps"] > 0
    assert train_losses(tmp_path / "custom") == train_losses(tmp_path / "glue")
    assert results["losses"] == expected["losses"]
    assert results["metrics"] == expected["metrics"]  # the same logits on every dev example, counted once
    assert results["eval"]["examples"] == expected["eval"]["examples"]
    # Tokenized on its own, not read from GLUE's cache file: the two fingerprints differ.
    assert len(list((tmp_path / "cache").glob("mrpc-train-*/manifest.json"))) == 2


def test_the_real_mrpc_files_encode_as_the_glue_loader_in_every_format(shared_glue, minilm_dir, tmp_path) -> None:
    """Real text (quotes, commas, non-ASCII) through CSV, JSONL and parquet, then the whole preparation of a run;
    the real test.tsv, read in place, is the unlabelled test file."""
    splits = mrpc_splits(shared_glue / "MRPC")
    base = {"model": {"checkpoint": "minilm"}, "data": {"max_length": 128, "cache_dir": str(tmp_path / "cache")},
            "train": {"global_batch": 32, "max_steps": 2}, "runtime": {"output_dir": str(tmp_path / "run")}}
    glue_config = config_lib.from_dict({**base, "data": {**base["data"], "data_dir": str(shared_glue / "MRPC")}})
    glue = run.prepare(glue_config, "numpy")
    expected = {"train": glue.trainer.train_batcher.data, "dev": glue.trainer.eval_batchers["dev"].data}
    for kind in ("csv", "jsonl", "parquet"):
        paths = write_splits(tmp_path / kind, kind, splits)
        data, table = table_config(paths)
        data = dataclasses.replace(data, **base["data"], test_file=str(shared_glue / "MRPC" / "test.tsv"))
        task = dataclasses.replace(glue_config.task, options=dataclasses.asdict(table))
        custom = run.prepare(dataclasses.replace(glue_config, data=data, task=task), "numpy")
        encoded = {"train": custom.trainer.train_batcher.data, "dev": custom.trainer.eval_batchers["dev"].data}
        for split, arrays in encoded.items():
            for name in ("input_ids", "token_type_ids", "lengths", "labels"):
                np.testing.assert_array_equal(getattr(arrays.load(), name), getattr(expected[split].load(), name),
                                              err_msg=f"{kind} {split} {name}")
        assert len(custom.data.test) == 1725 and np.all(custom.data.test.load().labels == -1)
    assert len(expected["dev"]) == 408


# --- reading: formats, labels, the test file -------------------------------------------------------------------


def test_every_format_reads_the_same_columns_and_names_rows(tiny_mrpc, tmp_path) -> None:
    splits = {"train": read_split(get_dataset("mrpc"), "train", tiny_mrpc)}
    tables = {kind: read_table(resolve_file("data.train_file", write_splits(tmp_path / kind, kind, splits)["train"]),
                               [FIRST, SECOND, LABEL]) for kind in WRITERS}
    for table in tables.values():
        assert table.columns[FIRST] == splits["train"].text_a and len(table) == 96
    assert tables["csv"].where(0).endswith("train.csv line 2")  # the header is line 1
    assert tables["parquet"].where(0).endswith("train.parquet row 0 (counting from 0)")
    assert tables["jsonl"].columns[LABEL][:3] == [int(label) for label in splits["train"].labels[:3]]


def test_a_text_longer_than_the_csv_module_s_default_limit_is_a_text(tmp_path) -> None:
    """The csv module refuses fields over 131,072 characters by default; a long document is data, not an error."""
    long_text = "word1 " * (131_072 // 6 + 1)
    path = tmp_path / "train.csv"
    path.write_text(f"{LABEL},{FIRST},{SECOND}\n1,word2,word3\n0,\"{long_text}\",word4\n", encoding="utf-8")
    table = read_table(resolve_file("data.train_file", str(path)), [FIRST, SECOND, LABEL])
    assert len(table.columns[FIRST][1]) == len(long_text) > 131_072 and table.columns[SECOND] == ["word3", "word4"]


def test_labels_match_as_text_and_an_unlabelled_test_file_gets_minus_one(write_config, tiny_mrpc, tmp_path) -> None:
    paths = write_splits(tmp_path / "data", "jsonl", mrpc_splits(tiny_mrpc))
    test = tmp_path / "data" / "test.csv"
    test.write_text(f'"{FIRST}","{SECOND}"\nword5 word6,word7\n"word8, word9",word10\n', encoding="utf-8")
    path = write_config(**{**custom_fields(paths), "task__labels": [0, 1], "data__test_file": str(test)})
    experiment = run.prepare(config_lib.load(path), "numpy")
    loaded = config_lib.load(path)
    assert tasks.options(tasks.get(loaded.task.name), loaded.task.options).labels == ("0", "1")
    expected = mrpc_splits(tiny_mrpc)["dev"].labels
    np.testing.assert_array_equal(experiment.trainer.eval_batchers["dev"].data.load().labels, expected)
    test_labels = experiment.data.test.load().labels
    assert test_labels.tolist() == [-1, -1] and test_labels.dtype == np.int32
    assert not (tmp_path / "run").exists()


def test_regression_trains_with_pearson_and_spearman_and_names_the_run(write_config, tiny_mrpc, tmp_path,
                                                                       capsys) -> None:
    splits = mrpc_splits(tiny_mrpc)
    folder = tmp_path / "data"
    folder.mkdir()
    for split, examples in splits.items():  # a score: 5 for paraphrases, plus a little per word of the first text
        lines = (json.dumps({"a": a, "b": b, "score": 5.0 * label + len(a.split()) / 10})
                 for a, b, label in zip(examples.text_a, examples.text_b, examples.labels, strict=True))
        (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    path = write_config(data__data_dir="", data__dataset="paraphrase-score",
                        data__train_file=str(folder / "train.jsonl"),
                        data__eval_files=[str(folder / "dev.jsonl")], task__text_columns=["a", "b"],
                        task__label_column="score", task__regression=True,
                        runtime__output_dir=str(tmp_path / "runs" / "{dataset}"))
    assert cli.main(["train", str(path), "--backend", "numpy", "--set", "train.max_steps=4"]) == 0, \
        capsys.readouterr().err
    results = json.loads((tmp_path / "runs" / "paraphrase-score" / "results.json").read_text())
    assert results["dataset"] == "paraphrase-score"
    assert set(results["metrics"]["dev"]) == {"pearson", "spearman", "score", "loss"}


def test_a_datasets_folder_names_its_split(tmp_path) -> None:
    datasets = pytest.importorskip("datasets")
    rows = {"text": ["a b", "c"], "label": [0, 1]}
    datasets.DatasetDict(train=datasets.Dataset.from_dict(rows)).save_to_disk(str(tmp_path / "dict"))
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "single"))
    assert resolve_file("data.train_file", f"{tmp_path / 'dict'}:train").name == "train"
    assert resolve_file("data.eval_files", str(tmp_path / "single")).name == "single"
    table = read_table(resolve_file("data.train_file", f"{tmp_path / 'dict'}:train"), ["text", "label"])
    assert table.columns == rows
    for spec, fragment in ((str(tmp_path / "dict"), f"is a DatasetDict folder: name its split, e.g. "
                            f"{tmp_path / 'dict'}:train"),
                           (f"{tmp_path / 'dict'}:test", "has no split 'test': use one of train"),
                           (f"{tmp_path / 'single'}:train", "is not a DatasetDict folder")):
        with pytest.raises(TpuplexError, match="^data.train_file") as error:
            resolve_file("data.train_file", spec)
        assert fragment in str(error.value)


@pytest.mark.parametrize(("module", "suffix"), [("pyarrow", ".parquet"), ("datasets", "")])
def test_a_missing_optional_library_says_what_to_install(module, suffix, tmp_path, monkeypatch) -> None:
    path = tmp_path / f"train{suffix}"
    if suffix:
        path.write_bytes(b"")
    else:
        path.mkdir()
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if it were not installed
    with pytest.raises(TpuplexError, match=f"needs the {module} library: pip install {module} "):
        read_table(resolve_file("data.train_file", str(path)), ["text"])


# --- the token cache -------------------------------------------------------------------------------------------


def test_the_cache_key_covers_the_content_and_every_column_and_label_setting(tiny_mrpc, tiny_model, tmp_path) -> None:
    paths = write_splits(tmp_path / "data", "csv", mrpc_splits(tiny_mrpc))

    def fingerprint(**changes) -> str:
        return custom_data(*table_config(paths, **changes)).sources()["train"].fingerprint

    settings = [fingerprint(), fingerprint(labels=["1", "0"]), fingerprint(text_columns=[SECOND, FIRST]),
                fingerprint(text_columns=[FIRST]), fingerprint(label_column=FIRST, labels=["word1", "word2"])]
    assert len(set(settings)) == len(settings)
    data = custom_data(*table_config(paths))
    assert file_source(data.dataset, data.files["dev"], labelled=False).fingerprint != data.sources()["dev"].fingerprint

    cache = tmp_path / "cache"
    first = encode_cached(data.dataset, "dev", data.sources()["dev"], tiny_model, 24, cache)
    np.testing.assert_array_equal(encode_cached(data.dataset, "dev", data.sources()["dev"], tiny_model, 24, cache)
                                  .load().input_ids, first.load().input_ids)
    assert len(list(cache.iterdir())) == 1  # the second call read the cache
    with open(paths["dev"], "a", encoding="utf-8") as handle:
        handle.write("1,word1 word2,word1\n")
    edited = encode_cached(data.dataset, "dev", data.sources()["dev"], tiny_model, 24, cache)
    assert len(edited) == len(first) + 1 and len(list(cache.iterdir())) == 2
    glue = load_encoded(get_dataset("mrpc"), "dev", tiny_mrpc, tiny_model, 24, cache)
    np.testing.assert_array_equal(glue.load().input_ids, first.load().input_ids)


def test_glue_configs_resolve_as_before() -> None:
    data = dataset_sources(DataConfig(dataset="SST-2", data_dir="/glue/SST-2"))
    assert data.dataset is get_dataset("sst2") and data.test_source() is None


# --- bad input: one line on stderr, exit code 2, nothing half-written ------------------------------------------


def csv_lines(examples: Examples) -> list[str]:
    """The split as CSV lines, header first (the tiny MRPC texts hold no commas or quotes)."""
    return [",".join(COLUMNS), *(",".join(row[name] for name in COLUMNS) for row in records(examples))]


def replace_line(number: int, text: str):
    """A defect: line `number` (1-based, the header is line 1) replaced by `text`."""
    return lambda lines: [*lines[: number - 1], text, *lines[number:]]


# case: (the training file's name, defect: CSV lines -> file content, extra [data] fields, expected fragment)
BAD_FILES = {
    "missing column": ("train.csv", replace_line(1, f"{LABEL},{FIRST},#2 Text"), {},
                       "train.csv has no column '#2 String' (its header is Quality, #1 String, #2 Text)"),
    "unknown label": ("train.csv", replace_line(4, "2,word1,word2"), {},
                      "train.csv line 4: label '2' is not one of task.labels (0, 1): add it to task.labels"),
    "empty file": ("train.csv", lambda lines: "", {}, "train.csv holds no examples"),
    "header only": ("train.csv", lambda lines: lines[:1], {}, "train.csv holds no examples"),
    "unknown extension": ("train.txt", lambda lines: lines, {}, "has the unknown file type '.txt': use .tsv, .csv"),
    "regression label not a number": ("train.csv", replace_line(3, "high,word1,word2"),
                                      {"task__regression": True, "task__labels": [], "task__metrics": []},
                                      "train.csv line 3: label 'high' is not a number"),
    "empty text": ("train.csv", replace_line(3, "1, ,word2"), {},
                   "train.csv line 3: text column '#1 String' is empty: fill in the text or drop the row"),
    "not UTF-8": ("train.csv", lambda lines: "\n".join([*lines[:5], "1,caf\xe9,word2"]).encode("latin-1"), {},
                  "train.csv is not UTF-8 text (byte 0xe9 on line 6): save it as UTF-8"),
    "quote never closed": ("train.csv", replace_line(3, '1,"word1,word2'), {},
                           "train.csv line 3 has 2 comma-separated fields, the header has 3"),
    "extra field": ("train.csv", replace_line(3, "1,word1,word2,word3"), {},
                    "train.csv line 3 has 4 comma-separated fields, the header has 3"),
    "unreadable parquet": ("train.parquet", lambda lines: b"PAR1 not really", {},
                           "train.parquet is not a readable parquet file"),
    "invalid JSON line": ("train.jsonl", lambda lines: json.dumps({LABEL: 1, FIRST: "word1", SECOND: "word2"}) + "\n{",
                          {},
                          "train.jsonl line 2 is not valid JSON"),
    "JSON text that is a number": ("train.jsonl",
                                   lambda lines: json.dumps({LABEL: 1, FIRST: 5, SECOND: "word2"}), {},
                                   "train.jsonl line 1: text column '#1 String' holds 5, not text"),
    "JSON row missing a field": ("train.jsonl", lambda lines: json.dumps({LABEL: 1, FIRST: "word1"}), {},
                                 "train.jsonl line 1 has no field '#2 String' (it has Quality, #1 String)"),
}
# case: ([data] fields on good CSV files ({folder} is their folder), expected fragment)
BAD_FIELDS = {
    "labels and regression": ({"task__regression": True}, "task.labels and task.regression = true are both set"),
    "no labels": ({"task__labels": []}, "your own data needs task.labels"),
    "one label": ({"task__labels": ["0"]}, "task.labels = ['0'] has one label"),
    "a label twice": ({"task__labels": [0, "0"]}, "task.labels = ['0', '0'] lists '0' twice"),
    "float labels": ({"task__labels": [0.5, 1]}, "task.labels = [0.5, 1] is not allowed: use a list of strings or "
                     "integers"),
    "f1 of three labels": ({"task__labels": ["0", "1", "2"]}, "f1 scores the second label as the positive class"),
    "a regression metric": ({"task__metrics": ["pearson"]},
                            "task.metrics: 'pearson' is not a metric for classification (task.labels): use "
                            "accuracy, f1, mcc"),
    "three text columns": ({"task__text_columns": ["a", "b", "c"]}, "must name one or two text columns"),
    "a table option under [data]": ({"data__labels": ["0", "1"]},
                                    "data.labels is an option of the sequence_classification task now: move it under "
                                    "[task]"),
    "eval file named train": ({"data__eval_files": ["{folder}/train.csv"]},
                              "data.train_file and data.eval_files[0] = "),
    "two eval files named dev": ({"data__eval_files": ["{folder}/dev.csv", "{folder}/more/dev.csv"]},
                                 "/more/dev.csv' would both be the split 'dev'"),
    "no eval files": ({"data__eval_files": []}, "data.eval_files is empty"),
    "missing train file": ({"data__train_file": "{folder}/nope.csv"}, "nope.csv' does not exist"),
    "data_dir with train_file": ({"data__data_dir": "{folder}"}, "(--data-dir) is for GLUE tasks"),
    "task name with a slash": ({"data__dataset": "my/task"}, "data.dataset = 'my/task' cannot name your own task"),
    "eval_files without train_file": ({"data__train_file": ""},
                                      "data.eval_files is set but data.train_file is empty"),
}


@pytest.fixture
def good_csv(tiny_mrpc, tmp_path) -> Path:
    """train.csv and dev.csv of the tiny MRPC split in `<tmp>/data` (and a copy of dev.csv in data/more)."""
    paths = write_splits(tmp_path / "data", "csv", mrpc_splits(tiny_mrpc))
    write_splits(tmp_path / "data" / "more", "csv", {"dev": mrpc_splits(tiny_mrpc)["dev"]})
    return Path(paths["train"]).parent


def assert_one_line_and_nothing_behind(code: int, err: str, fragment: str, tmp_path: Path) -> None:
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("tpuplex: error: ") and fragment in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "run").exists()
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_a_bad_training_file_is_one_clear_line_and_leaves_nothing_behind(case, write_config, tiny_mrpc, good_csv,
                                                                         tmp_path, capsys) -> None:
    name, defect, fields, fragment = BAD_FILES[case]
    content = defect(csv_lines(mrpc_splits(tiny_mrpc)["train"]))
    path = good_csv / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else "\n".join(content) + "\n", encoding="utf-8")
    paths = {"train": str(path), "dev": str(good_csv / "dev.csv")}
    config = write_config(**{**custom_fields(paths), **fields})
    code = cli.main(["train", str(config), "--backend", "numpy"])
    assert_one_line_and_nothing_behind(code, capsys.readouterr().err, fragment, tmp_path)


@pytest.mark.parametrize("case", list(BAD_FIELDS))
def test_bad_data_fields_are_one_clear_line_and_leave_nothing_behind(case, write_config, good_csv, tmp_path,
                                                                     capsys) -> None:
    fields, fragment = BAD_FIELDS[case]
    fields = {name: json.loads(json.dumps(value).replace("{folder}", str(good_csv))) for name, value in fields.items()}
    paths = {"train": str(good_csv / "train.csv"), "dev": str(good_csv / "dev.csv")}
    config = write_config(**{**custom_fields(paths), **fields})
    code = cli.main(["train", str(config), "--backend", "numpy"])
    assert_one_line_and_nothing_behind(code, capsys.readouterr().err, fragment, tmp_path)

"""Input at the edges, through the real CLI: each case is refused in one `tpuplex: error:` line with exit 2 and
nothing written, or accepted and right (the campaign of issue 42: prepare options, image sizes and crops, prepared
folders whose manifest was edited, runs that would train on nothing, eval files named as users name them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tpuplex import config as config_lib
from tpuplex.commands import cli
from tpuplex.data import images
from tpuplex.errors import TpuplexError
from tpuplex.tasks import options as task_options
from tpuplex.tasks.token_classification import TASK as TOKEN_CLASSIFICATION

ROOT = Path(__file__).resolve().parents[2]
SENTENCES = "EU\tB-ORG\nrejects\tO\nGerman\tB-MISC\ncall\tO\n\nPeter\tB-PER\nBlackburn\tI-PER\n"


def one_error(capsys) -> str:
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tpuplex:")]
    assert len(errors) == 1 and errors[0].startswith("tpuplex: error: "), errors
    return errors[0]


@pytest.fixture
def photos(tmp_path) -> Path:
    """Two classes of two 12x10 photos each."""
    for label, colour in (("ant", (10, 200, 40)), ("cat", (200, 40, 10))):
        for index in range(2):
            (tmp_path / "photos" / label).mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (12, 10), colour).save(tmp_path / "photos" / label / f"{index}.png")
    return tmp_path / "photos"


@pytest.mark.parametrize(("arguments", "fragment"), [
    (["--image-size", "0", "0"], "--image-size 0 0: give a height and a width of at least 1 pixel"),
    (["--image-size", "-4", "8"], "--image-size -4 8: give a height and a width of at least 1 pixel"),
    (["--shard-size", "0"], "--shard-size 0: use 1 or more rows per shard"),
])
def test_prepare_options_out_of_range_are_refused(photos, tmp_path, capsys, arguments, fragment) -> None:
    assert cli.main(["prepare", str(photos), "--out", str(tmp_path / "out"), *arguments]) == 2
    assert fragment in one_error(capsys)
    assert not (tmp_path / "out").exists()


def test_a_folder_that_does_not_exist_is_named_with_what_to_give(tmp_path, capsys) -> None:
    assert cli.main(["prepare", str(tmp_path / "no-such-photos"), "--out", str(tmp_path / "out")]) == 2
    assert "no-such-photos does not exist: give a folder with one sub-folder of images per class" in one_error(capsys)


def test_a_read_only_file_system_is_refused_before_anything_is_written(photos, tmp_path, tiny_model,
                                                                      write_config) -> None:
    """`prepare --out` (images, a text corpus) and `train`'s runtime.output_dir on a read-only file system: one line
    naming the folder, exit 2. The mount is a real read-only tmpfs in a private user and mount namespace
    (`unshare`): root, as in a container, writes through permission bits."""
    if subprocess.run(["unshare", "--map-root-user", "--mount", "true"], capture_output=True).returncode:
        pytest.skip("this kernel lets no user and mount namespace be made (unshare), so no read-only mount")
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    (tmp_path / "corpus.txt").write_text("to be, or not to be, that is the question\n" * 20)
    commands = {"prepare images": ["prepare", str(photos), "--out", str(read_only / "images")],
                "prepare text": ["prepare", str(tmp_path / "corpus.txt"), "--out", str(read_only / "corpus"),
                                 "--tokenizer", str(tiny_model), "--max-length", "8"],
                "train": ["train", str(write_config(runtime__output_dir=str(read_only / "run"))), "--backend", "numpy"]}
    mount_then_run = 'mount -t tmpfs -o ro tmpfs "$0" && exec "$@"'
    for name, arguments in commands.items():
        done = subprocess.run(["unshare", "--map-root-user", "--mount", "sh", "-c", mount_then_run, str(read_only),
                               sys.executable, "-m", "tpuplex", *arguments], capture_output=True, text=True)
        errors = [line for line in done.stderr.splitlines() if line.startswith("tpuplex:")]
        assert done.returncode == 2 and len(errors) == 1, (name, done.stderr)
        assert f"cannot be written ({read_only} is read-only): choose another folder" in errors[0], name
    assert not any(read_only.iterdir())


def test_a_one_pixel_image_keeps_its_colour_at_any_aspect_ratio(tmp_path) -> None:
    """The centred crop of a 1x1 image for a 64x32 target was 0 pixels wide (an all-black image)."""
    Image.new("RGB", (1, 1), (200, 40, 10)).save(tmp_path / "dot.png")
    pixels = images.decode((tmp_path / "dot.png").read_bytes(), (64, 32))
    assert pixels.shape == (64, 32, 3) and (pixels == np.array([200, 40, 10], np.uint8)).all()


def image_config(tmp_path: Path, train_file: Path, **task: object) -> Path:
    path = tmp_path / "images.toml"
    options = "".join(f"{name} = {json.dumps(value)}\n" for name, value in task.items())
    path.write_text(f'[task]\nname = "image_classification"\n{options}[model]\narchitecture = "m:Net"\n'
                    f'[data]\ntrain_file = "{train_file}"\n[runtime]\noutput_dir = "{tmp_path / "run"}"\n')
    return path


def test_a_crop_padding_as_large_as_the_images_is_refused(photos, tmp_path, capsys) -> None:
    """task.crop_padding = 100000 asked for 894 GiB of padding (MemoryError); it must be below the images' side."""
    config = image_config(tmp_path, photos, crop_padding=100000, image_size=[8, 8], validation_fraction=0.5)
    assert cli.main(["train", str(config), "--backend", "numpy"]) == 2
    assert "task.crop_padding = 100000 is not smaller than the 8x8 images" in one_error(capsys)
    assert not (tmp_path / "run").exists()


def test_the_numpy_backend_refuses_an_image_model_by_name(tmp_path, capsys) -> None:
    """It is a linear probe for text tests; an image run on it died on KeyError 'hidden_size'."""
    from tpuplex.kinds.image import ImageFamilies
    from tpuplex.protocol import ModelSpec, OptimizerSpec
    from tpuplex.testing.numpy_backend import NumpyBackend

    spec = ModelSpec(kind=ImageFamilies(None, {}, None, None), task=None, head=None, params={})
    with pytest.raises(TpuplexError, match="trains text encoders only, not the 'image' kind of model"):
        NumpyBackend(config_lib.RuntimeConfig()).init(spec, OptimizerSpec())


def edit_manifest(folder: Path, edit) -> None:
    manifest = json.loads((folder / images.MANIFEST).read_text())
    edit(manifest)
    (folder / images.MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize(("edit", "fragment"), [
    (lambda manifest: manifest.pop("fields"), "its 'fields' entry is missing"),
    (lambda manifest: manifest.update(rows=manifest["rows"] + 5), "its shards hold 4 rows, it says 9"),
    (lambda manifest: (manifest["shards"][0].update(rows=9), manifest.update(rows=9)), "shard 0 holds"),
    (lambda manifest: manifest["meta"].update(classes=["ant", "cat", "dog"]), "its meta was edited"),
    (lambda manifest: (manifest["meta"].update(classes=["ant", "cat", "dog"]), manifest.pop("meta_sha256")),
     "names the classes ['ant', 'cat', 'dog'] but counts images of ['ant', 'cat']"),
])
def test_a_prepared_folder_is_checked_against_its_manifest_when_opened(photos, tmp_path, capsys, edit,
                                                                       fragment) -> None:
    assert cli.main(["prepare", str(photos), "--out", str(tmp_path / "prepared")]) == 0
    edit_manifest(tmp_path / "prepared", edit)
    with pytest.raises(TpuplexError, match="run tpuplex prepare again") as refused:
        images.open_prepared(tmp_path / "prepared")
    assert fragment in str(refused.value)
    config = image_config(tmp_path, tmp_path / "prepared", validation_fraction=0.5)
    assert cli.main(["train", str(config), "--backend", "numpy"]) == 2
    assert fragment in one_error(capsys)


def ner_config(tmp_path: Path, model: Path, train: str, evals: list[str], test: str = "",
               max_length: int = 32) -> Path:
    for name in {train, *evals, *([test] if test else [])}:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(SENTENCES)
    path = tmp_path / "ner.toml"
    eval_files = ", ".join(f'"{tmp_path / name}"' for name in evals)
    test_file = f'test_file = "{tmp_path / test}"\n' if test else ""
    path.write_text(f'[task]\nname = "token_classification"\n[model]\ncheckpoint = "{model}"\n'
                    f'[data]\ndataset = "tags"\ntrain_file = "{tmp_path / train}"\neval_files = [{eval_files}]\n'
                    f'{test_file}max_length = {max_length}\n'
                    f'[train]\nmax_steps = 1\nglobal_batch = 8\n[runtime]\noutput_dir = "{tmp_path / "run"}"\n')
    return path


def test_a_max_length_that_keeps_no_word_is_refused(tmp_path, capsys, minilm_dir) -> None:
    """max_length = 2 holds [CLS] and [SEP] only: every word was cut, and the run trained on nothing (loss 0.0)."""
    config = ner_config(tmp_path, minilm_dir, "train.conll", ["dev.conll"], max_length=2)
    assert cli.main(["train", str(config), "--backend", "numpy"]) == 2
    assert "data.max_length = 2 keeps no word of 2 of the 2 training sentences (6 words cut)" in one_error(capsys)
    assert not (tmp_path / "run").exists()


def test_eval_files_named_devel_and_test_are_both_evaluated(tmp_path, minilm_dir) -> None:
    """A corpus distributed as train.tsv, devel.tsv and test.tsv evaluates on both files without renaming."""
    config = config_lib.load(ner_config(tmp_path, minilm_dir, "train.tsv", ["devel.tsv", "test.tsv"]))
    data = TOKEN_CLASSIFICATION.prepare(config, task_options(TOKEN_CLASSIFICATION, config.task.options), minilm_dir)
    assert list(data.eval) == ["devel", "test"] and data.test is None
    assert {"devel", "test"} <= set(data.aligned) and len(data.eval["test"]) == 2


@pytest.mark.parametrize(("evals", "test", "fragment"), [
    (["a/dev.tsv", "b/dev.tsv"], "",
     "data.eval_files[0] = '{tmp}/a/dev.tsv' and data.eval_files[1] = '{tmp}/b/dev.tsv' would both be the split 'dev'"),
    (["test.tsv"], "held/test.conll",
     "data.eval_files holds a file '{tmp}/test.tsv' and data.test_file = '{tmp}/held/test.conll': both would be the "
     "split 'test'"),
    (["train.tsv"], "", "data.train_file and data.eval_files[0] = '{tmp}/train.tsv' would both be the split 'train'"),
])
def test_only_files_that_would_be_one_split_are_refused(tmp_path, capsys, minilm_dir, evals, test, fragment) -> None:
    train = "own/train.tsv" if "train.tsv" in evals else "train.conll"
    config = ner_config(tmp_path, minilm_dir, train, evals, test)
    assert cli.main(["train", str(config), "--backend", "numpy"]) == 2
    error = one_error(capsys)
    assert fragment.format(tmp=tmp_path) in error and "twice" not in error

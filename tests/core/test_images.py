"""Images prepared once into shards (`tpuplex prepare`), image splits, batches and the core's augmentation."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from tpuplex.commands import cli
from tpuplex.data import images
from tpuplex.data.batching import Batcher
from tpuplex.errors import TpuplexError
from tpuplex.tasks.image_classification.data import ImageSplit, augment, held_out


def _jpeg(path, size=(40, 30), mode="RGB", color=(200, 40, 10), suffix_format="JPEG") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.new(mode, size, color if mode != "L" else 128)
    image.save(path, format=suffix_format)


@pytest.fixture
def tree(tmp_path):
    """Two classes of three small photos each, sizes mixed, and a stray text file that is ignored."""
    root = tmp_path / "photos"
    for label, color in (("cat", (200, 40, 10)), ("ant", (10, 200, 40))):
        for index, size in enumerate(((40, 30), (30, 40), (50, 50))):
            _jpeg(root / label / f"{index}.jpg", size, color=color)
    (root / "cat" / "notes.txt").write_text("not an image")
    return root


def test_prepare_writes_sorted_classes_shards_and_a_manifest(tree, tmp_path) -> None:
    listing = images.scan_folder(tree)
    assert listing.classes == ("ant", "cat") and len(listing) == 6
    prepared = images.prepare(listing, tmp_path / "prepared", (16, 24), shard_size=4)
    manifest = json.loads((tmp_path / "prepared" / images.MANIFEST).read_text())
    assert manifest["rows"] == 6 and manifest["meta"]["image_shape"] == [16, 24, 3]
    assert [shard["rows"] for shard in manifest["shards"]] == [4, 2]
    assert manifest["meta"]["class_counts"] == {"ant": 3, "cat": 3}
    assert prepared.labels.tolist() == [0, 0, 0, 1, 1, 1]
    pixels = prepared.images(np.array([5, 0, 3]))
    assert pixels.shape == (3, 16, 24, 3) and pixels.dtype == np.uint8
    # JPEG keeps a flat colour within a few levels: the rows came back in the order asked.
    assert abs(int(pixels[0, 8, 12, 0]) - 200) < 8 and abs(int(pixels[1, 8, 12, 1]) - 200) < 8
    again = images.open_prepared(tmp_path / "prepared")
    assert again.fingerprint() == prepared.fingerprint()
    np.testing.assert_array_equal(again.images(np.arange(6)), prepared.images(np.arange(6)))


def test_resize_crops_the_centre_to_the_target_aspect_ratio() -> None:
    # A 40x20 (W x H) image, left half black, right half white: cropped to 20x20 at the centre, half of each.
    image = np.zeros((20, 40, 3), np.uint8)
    image[:, 20:] = 255
    encoded = io.BytesIO()
    Image.fromarray(image).save(encoded, format="PNG")
    resized = images.decode(encoded.getvalue(), (10, 10))
    assert resized.shape == (10, 10, 3)
    assert resized[:, :4].max() == 0 and resized[:, 6:].min() == 255


def test_grayscale_cmyk_and_alpha_are_converted_to_rgb(tmp_path) -> None:
    for mode, color, suffix, kind in (("L", 128, "g.png", "PNG"), ("CMYK", (0, 0, 0, 0), "c.jpg", "JPEG"),
                                      ("RGBA", (10, 20, 30, 0), "a.png", "PNG")):
        path = tmp_path / suffix
        Image.new(mode, (8, 8), color).save(path, format=kind)
        pixels = images.decode(path.read_bytes(), None, str(path))
        assert pixels.shape == (8, 8, 3), mode
    assert (images.decode((tmp_path / "g.png").read_bytes(), None) == 128).all()


@pytest.mark.parametrize("case", ["empty class", "one class", "truncated", "not an image", "mixed sizes"])
def test_bad_images_give_one_clear_error_and_leave_no_folder(case, tree, tmp_path, capsys) -> None:
    size = ["--image-size", "16", "16"]
    if case == "empty class":
        (tree / "dog").mkdir()
        expected = "holds no .jpg/.jpeg/.png file"
    elif case == "one class":
        for path in (tree / "ant").iterdir():
            path.unlink()
        (tree / "ant").rmdir()
        expected = "at least two"
    elif case == "truncated":
        path = tree / "cat" / "2.jpg"
        path.write_bytes(path.read_bytes()[:200])
        expected = "cannot be decoded"
    elif case == "not an image":
        (tree / "cat" / "fake.jpg").write_text("this is text")
        expected = "is not an image Pillow can read"
    else:
        size, expected = [], "set an image size"
    out = tmp_path / "prepared"
    assert cli.main(["prepare", str(tree), "--out", str(out), *size]) == 2
    error = capsys.readouterr().err
    assert error.startswith("tpuplex: error:") and expected in error and error.count("\n") == 1
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".prepared")]


def test_cli_prepare_and_listing_files(tree, tmp_path, capsys) -> None:
    listing = tmp_path / "pairs.csv"
    listing.write_text("path,label\nphotos/cat/0.jpg,cat\nphotos/ant/1.jpg,ant\nphotos/cat/2.jpg,cat\n")
    assert cli.main(["prepare", str(listing), "--out", str(tmp_path / "p"), "--image-size", "8", "8"]) == 0
    assert "prepared 3 images of 2 classes at 8x8 in 1 shard(s)" in capsys.readouterr().out
    prepared = images.open_prepared(tmp_path / "p")
    assert prepared.classes == ("ant", "cat") and prepared.labels.tolist() == [1, 0, 1]
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text('{"path": "photos/cat/0.jpg", "label": "cat"}\n{"path": "photos/ant/9.jpg", "label": "ant"}\n')
    with pytest.raises(TpuplexError, match="missing file"):
        images.read_listing(jsonl)
    assert cli.main(["prepare", str(listing), "--out", str(tmp_path / "p"), "--image-size", "8", "8"]) == 2
    assert "already exists" in capsys.readouterr().err


def test_augment_crops_and_flips_from_the_generator_alone() -> None:
    rng = np.random.default_rng(0)
    batch = rng.integers(0, 256, size=(6, 8, 10, 3), dtype=np.uint8)
    first = augment(batch, np.random.default_rng([1, 0, 7]), crop_padding=2, flip=True)
    second = augment(batch.copy(), np.random.default_rng([1, 0, 7]), crop_padding=2, flip=True)
    np.testing.assert_array_equal(first, second)
    assert first.shape == batch.shape and first.dtype == np.uint8
    draw = np.random.default_rng([1, 0, 7])
    offsets, flips = draw.integers(0, 5, size=(6, 2)), draw.random(6) < 0.5
    padded = np.pad(batch, [(0, 0), (2, 2), (2, 2), (0, 0)])
    for row, (top, left) in enumerate(offsets):
        expected = padded[row, top : top + 8, left : left + 10]
        np.testing.assert_array_equal(first[row], expected[:, ::-1] if flips[row] else expected)
    np.testing.assert_array_equal(augment(batch, np.random.default_rng(3), 0, False), batch)


def test_a_backend_that_holds_no_data_refuses_images_on_device_before_writing(tree, tmp_path, capsys) -> None:
    """task.images_on_device on a backend without `hold` (tf's, torch_xla, the numpy test backend's): one line
    naming the field and the backends that hold, and no run folder."""
    config = tmp_path / "held.toml"
    config.write_text(f'[task]\nname = "image_classification"\nimages_on_device = true\nimage_size = [16, 16]\n'
                      f'[model]\narchitecture = "nowhere:Model"\n[data]\ntrain_file = "{tree}"\n'
                      f'cache_dir = "{tmp_path / "cache"}"\n[runtime]\noutput_dir = "{tmp_path / "run"}"\n')
    assert cli.main(["train", str(config), "--backend", "numpy"]) == 2
    assert ("task.images_on_device = true: the numpy backend keeps no data on its devices; set it to false, or use "
            "the torch or jax backend") in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_held_out_is_stratified_seeded_and_disjoint() -> None:
    labels = np.repeat(np.arange(5), 200)
    train, validation = held_out(labels, 0.1, seed=42)
    assert len(validation) == 100 and np.bincount(labels[validation]).tolist() == [20] * 5
    assert not set(train) & set(validation) and len(train) + len(validation) == 1000
    np.testing.assert_array_equal(held_out(labels, 0.1, seed=42)[1], validation)
    assert not np.array_equal(held_out(labels, 0.1, seed=43)[1], validation)


def test_image_batches_have_static_shapes_and_count_every_image_once(tree, tmp_path) -> None:
    prepared = images.prepare(images.scan_folder(tree), tmp_path / "prepared", (8, 8))
    split = ImageSplit(prepared, np.array([0, 2, 3, 5], np.int64))
    batcher = Batcher(split, global_batch=3, replicas=1, seed=1)
    train = list(batcher.train_batches(0))
    assert [b["images"].shape for b in train] == [(3, 8, 8, 3)] * 2
    assert sorted(np.concatenate([b["labels"][b["weight"] > 0] for b in train]).tolist()) == [0, 0, 1, 1]
    seen = np.concatenate([item.index[item.index >= 0] for item in batcher.eval_batches()])
    assert sorted(seen.tolist()) == [0, 1, 2, 3]
    assert batcher.padding_efficiency(train=False) == pytest.approx(4 / 6)


def test_the_real_flowers_prepare_into_five_classes_of_200(shared_images, tmp_path) -> None:
    listing = images.scan_folder(shared_images / "flowers")
    assert listing.classes == ("daisy", "dandelion", "roses", "sunflowers", "tulips")
    prepared = images.prepare(listing, tmp_path / "flowers", (64, 64), shard_size=300)
    assert len(prepared) == 1000 and prepared.manifest["meta"]["class_counts"] == dict.fromkeys(listing.classes, 200)
    assert [shard["rows"] for shard in prepared.manifest["shards"]] == [300, 300, 300, 100]
    pixels = prepared.images(np.arange(0, 1000, 97))
    assert pixels.shape == (11, 64, 64, 3) and pixels.std() > 20  # real photos, not blank frames


@pytest.mark.parametrize(("override", "expected"), [
    ('data.train_file="no/such/folder"', "data.train_file = 'no/such/folder' does not exist"),
    ("task.image_size=[32]", "give [height, width] in pixels"),
    ('model.architecture=""', "which the image_classification task cannot train: give a checkpoint folder of a "
                              "resnet, vit model"),
    ("task.validation_fraction=1.5", "task.validation_fraction = 1.5 is not allowed"),
])
def test_image_runs_check_their_settings_before_any_backend_starts(override, expected, tree, capsys) -> None:
    config = tree.parent / "images.toml"
    config.write_text(f'[task]\nname = "image_classification"\n[model]\narchitecture = "m:Net"\n'
                      f'[data]\ntrain_file = "{tree}"\n')
    assert cli.main(["train", str(config), "--backend", "numpy", "--set", override]) == 2
    error = capsys.readouterr().err
    assert error.startswith("tpuplex: error:") and expected in error


def test_a_step_s_augmented_pixels_do_not_depend_on_replicas_or_processes(tree, tmp_path) -> None:
    from tpuplex.hosts import process_rows
    from tpuplex.tasks.image_classification import ImageData

    prepared = images.prepare(images.scan_folder(tree), tmp_path / "prepared", (12, 12))
    data = ImageData("t", ImageSplit(prepared, np.arange(6, dtype=np.int64)), {}, prepared.classes, seed=3,
                     crop_padding=2, flip=True)

    def step_batches(replicas: int) -> list[np.ndarray]:
        batcher = Batcher(data.train, global_batch=4, replicas=replicas, seed=3)
        return [data.train_batch(batch, step)["images"] for step, batch in enumerate(batcher.train_batches(0), 1)]

    one, two, four = step_batches(1), step_batches(2), step_batches(4)
    assert len(one) == len(two) == len(four) == 2
    assert all(np.array_equal(a, b) and np.array_equal(a, c) for a, b, c in zip(one, two, four, strict=True))
    # Each of two processes takes its own rows of the same global batch: together they are the batch.
    rows = [process_rows(4, process, 2) for process in (0, 1)]
    np.testing.assert_array_equal(np.concatenate([one[0][r] for r in rows]), one[0])
    assert not np.array_equal(one[0], step_batches(1)[0][:, :, ::-1])  # flips were drawn, not all or none


def test_a_killed_prepare_leaves_nothing_in_use_and_the_next_one_cleans_up(shared_images, tmp_path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "flowers"
    arguments = ["prepare", str(shared_images / "flowers"), "--out", str(out), "--image-size", "64", "64",
                 "--shard-size", "100"]
    # Held once two shards are written and a third begun, so the run cannot end before the test kills it.
    held = ("import sys, time\nfrom pathlib import Path\nfrom tpuplex.commands.cli import main\n"
            "from tpuplex.data import shards\nadd = shards.ShardWriter.add\n"
            "def held_add(self, **arrays):\n    add(self, **arrays)\n"
            f"    while list(Path({str(tmp_path)!r}).glob('.flowers.partial-*/records-00002.bin')):\n"
            "        time.sleep(0.01)\n"
            "shards.ShardWriter.add = held_add\nsys.exit(main(sys.argv[1:]))\n")
    process = subprocess.Popen([sys.executable, "-c", held, *arguments], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not list(tmp_path.glob(".flowers.partial-*/records-00002.bin")):  # two shards written, a third begun
        assert process.poll() is None and time.monotonic() < deadline, "prepare ended before it could be killed"
        time.sleep(0.005)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not out.exists() and len(list(tmp_path.glob(".flowers.partial-*"))) == 1
    with pytest.raises(TpuplexError, match="no manifest.json"):
        images.open_prepared(out)
    assert subprocess.run([sys.executable, "-m", "tpuplex", *arguments], capture_output=True).returncode == 0
    prepared = images.open_prepared(out)
    assert len(prepared) == 1000 and not list(tmp_path.glob(".flowers.partial-*"))


def test_without_pillow_an_image_run_says_how_to_install_it(monkeypatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "PIL", None)  # `import PIL` now raises ImportError
    with pytest.raises(TpuplexError, match=r"pip install 'tpuplex-core\[images\]'"):
        images.decode(b"", None)

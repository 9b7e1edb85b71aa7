"""Training from prepared shards equals training from the same rows held in memory, bit for bit: the run's splits as
it reads them (records read from `tpuplex.data.shards` folders) against the same splits loaded whole into arrays,
through the same Trainer, backend and initial state."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from tpuplex.commands import run
from tpuplex.config import Config
from tpuplex.engine.run_log import Reporter
from tpuplex.engine.trainer import Trainer
from tpuplex.tasks.image_classification.data import ImageSplit


@dataclasses.dataclass(frozen=True)
class ImagesInMemory:
    """A prepared image folder's images and labels loaded whole into arrays (what PreparedImages reads lazily)."""

    pixels: np.ndarray
    labels: np.ndarray
    classes: tuple[str, ...]
    image_shape: tuple[int, int, int]
    source_fingerprint: str

    def images(self, rows: np.ndarray) -> np.ndarray:
        return self.pixels[rows]

    def fingerprint(self) -> str:
        return self.source_fingerprint


def in_memory(split):
    """The same split with every row in memory: an `Encoded` for tokens, arrays behind an image split."""
    if isinstance(split, ImageSplit):
        prepared = split.prepared
        loaded = ImagesInMemory(prepared.images(np.arange(len(prepared))), prepared.labels.copy(), prepared.classes,
                                prepared.image_shape, prepared.fingerprint())
        return ImageSplit(loaded, split.members)
    return split.load()


def check_prepared_equals_in_memory(config: Config, backend_name: str, folder: Path) -> dict:
    """Train `config` twice from the same initial state: on the run's prepared splits and on them loaded into
    memory. The losses of every step and the final metrics must be equal; returns the prepared run's metrics."""
    results = []
    for name in ("prepared", "memory"):
        experiment = run.prepare(config, backend_name)  # its own backend and initial state (and seeded generators)
        data = experiment.data
        assert all(hasattr(split, "read_stats") for split in (data.train, *data.eval.values())), "not prepared"
        if name == "memory":
            data = dataclasses.replace(data, train=in_memory(data.train),
                                       eval={split: in_memory(values) for split, values in data.eval.items()})
        trainer = Trainer(experiment.backend, config, data, folder / name)
        with Reporter(folder / name) as reporter:
            results.append(trainer.fit(experiment.state, reporter, resume=None))
        if name == "prepared":
            assert data.train.read_stats.records > 0  # the records were read from the shards
    prepared, memory = results
    assert len(prepared.losses) == len(memory.losses) > 0
    assert prepared.losses == memory.losses  # bit for bit
    assert prepared.metrics == memory.metrics
    return prepared.metrics


def masked_lm_config(checkpoint: Path, shared_text: Path, folder: Path) -> Config:
    """Masked-LM pre-training of `checkpoint` (a tiny family checkpoint with its tokenizer) on tiny Shakespeare,
    from a corpus `tpuplex prepare` packed in 4 units by 2 workers, held-out text read as it is."""
    from tpuplex.data.corpus import prepare_corpus
    from tpuplex.tasks.masked_lm.data import CorpusEncoder

    lines = (shared_text / "tinyshakespeare" / "input.txt").read_text().splitlines()
    (folder / "train.txt").write_text("\n".join(lines[:2000]) + "\n")
    (folder / "held-out.txt").write_text("\n".join(lines[2000:2200]) + "\n")
    prepare_corpus(str(folder / "train.txt"), folder / "corpus", CorpusEncoder(str(checkpoint)), 32, workers=2,
                   unit_bytes=20_000)
    return config_from({"task": {"name": "masked_lm", "mask_probability": 0.15},
                        "model": {"checkpoint": str(checkpoint)},
                        "data": {"dataset": "shakespeare", "train_file": str(folder / "corpus"),
                                 "eval_files": [str(folder / "held-out.txt")], "max_length": 32,
                                 "cache_dir": str(folder / "cache")},
                        "train": {"learning_rate": 1e-3, "max_steps": 6, "global_batch": 8, "seed": 3},
                        "runtime": {"output_dir": str(folder / "run"), "eval_every": 3, "log_every": 1}})


def flowers_config(shared_images: Path, folder: Path) -> Config:
    """The flowers example at 24 x 24 for 6 steps (crops, flips and dropout on), its images prepared into shards."""
    from image_checks import EXAMPLE

    from tpuplex.plugins import add_search_path

    add_search_path(EXAMPLE)
    return config_from({"task": {"name": "image_classification", "image_size": [24, 24], "validation_fraction": 0.2,
                                 "crop_padding": 4, "flip": True},
                        "model": {"architecture": "flowers_cnn.{backend}_model:FlowersCNN"},
                        "data": {"dataset": "flowers", "train_file": str(shared_images / "flowers"),
                                 "cache_dir": str(folder / "cache")},
                        "train": {"learning_rate": 3e-3, "max_steps": 6, "global_batch": 16, "seed": 3},
                        "runtime": {"output_dir": str(folder / "run"), "eval_every": 3, "log_every": 1}})


def config_from(sections: dict) -> Config:
    from tpuplex import config as config_lib

    return config_lib.from_dict(sections)

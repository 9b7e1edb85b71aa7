"""Speech recognition on the torch backend: tests/common/speech_checks.py's checks, and the torch.export program
(`tpuplex export --format torch_export`) transcribing as `Run.predict` does."""

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile
from speech_checks import (  # noqa: F401  (collected here)
    speech_run,
    test_ctc_training_follows_torch_on_real_recordings,
    test_the_torch_checkpoint_transcribes_alike,
)

import torch
import tpuplex
from tpuplex.data.audio import LogMel


@pytest.fixture(scope="module")
def backend_name() -> str:
    return "torch"


def test_the_exported_program_transcribes_as_predict_does(speech_run) -> None:  # noqa: F811 (the fixture)
    """The drawn checkpoint (a different transcript for each recording) exported with torch.export: the 20 dev
    recordings' log-mel features, computed as serving.json says, in one padded batch, give `Run.predict`'s
    transcripts once greedy CTC decoding is applied."""
    run = tpuplex.Run.open(speech_run["initial"])
    recordings = [Path(line.split("\t")[0]) for line in (speech_run["root"] / "dev.tsv").read_text().splitlines()[1:]]
    exported = run.export("torch_export", out=speech_run["root"] / "program")
    assert transcribed_by_the_program(exported, recordings) == run.predict(recordings)


def transcribed_by_the_program(exported: Path, recordings: list[Path]) -> list[str]:
    contract = json.loads((exported / "serving.json").read_text())
    settings = LogMel(**{name: contract["features"][name] for name in ("sample_rate", "mel_bins", "frame_ms",
                                                                        "hop_ms")})
    features = [settings(soundfile.read(path, dtype="float32")[0]) for path in recordings]
    batch = np.zeros((len(features), max(map(len, features)), settings.mel_bins), np.float32)
    mask = np.zeros(batch.shape[:2], np.int64)
    for row, feature in enumerate(features):
        batch[row, : len(feature)], mask[row, : len(feature)] = feature, 1
    ids = torch.export.load(exported / "model.pt2").module()(torch.from_numpy(batch), torch.from_numpy(mask))
    texts = []
    for row in ids.numpy():
        kept = [int(i) for index, i in enumerate(row) if i > 0 and (index == 0 or i != row[index - 1])]
        texts.append("".join(contract["characters"][i - 1] for i in kept))
    assert len(set(texts)) >= 15  # the drawn model says something different to nearly every recording
    return texts

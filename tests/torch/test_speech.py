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


RATE = 8000


def tone(seconds: float, frequency: float) -> np.ndarray:
    time = np.arange(int(RATE * seconds)) / RATE
    return (0.3 * np.sin(2 * np.pi * frequency * time)).astype(np.float32)


@pytest.fixture(scope="module")
def tone_run(tmp_path_factory) -> tpuplex.Run:
    """A tiny Conformer trained one step on tones (seconds, in-process): a 1.2 s recording whose 40-character
    transcript is longer than the 28 frames of every dev recording (whose predict outputs are padded to 28)."""
    root = tmp_path_factory.mktemp("tones")
    recordings = {"long.wav": (1.2, "one two three four five six seven eight"), "a.wav": (0.5, "one"),
                  "b.wav": (0.6, "two"), "c.wav": (0.3, "six"), "d.wav": (0.3, "ten")}
    for index, (name, (seconds, _)) in enumerate(recordings.items()):
        soundfile.write(root / name, tone(seconds, 200 + 90 * index), RATE, subtype="PCM_16")
    (root / "train.tsv").write_text("path\ttext\n" + "".join(f"{name}\t{text}\n" for name, (_, text)
                                                             in list(recordings.items())[:3]))
    (root / "dev.tsv").write_text("path\ttext\nc.wav\tsix\nd.wav\tten\n")
    (root / "model").mkdir()
    (root / "model" / "config.json").write_text(json.dumps(
        {"model_type": "conformer_ctc", "hidden_size": 16, "num_layers": 1, "num_heads": 2, "ffn_multiplier": 2,
         "conv_kernel": 3, "subsampling_channels": 4}))
    config = tpuplex.Config.from_dict({
        "task": {"name": "speech_recognition", "sample_rate": RATE, "mel_bins": 16},
        "model": {"checkpoint": str(root / "model")},
        "data": {"train_file": str(root / "train.tsv"), "eval_files": [str(root / "dev.tsv")],
                 "cache_dir": str(root / "cache")},
        "train": {"max_steps": 1, "global_batch": 2}, "runtime": {"output_dir": str(root / "run")}})
    return tpuplex.train(config, "torch")


def test_predict_transcribes_a_folder_and_reads_data_dir_s_manifest_checked(tone_run, tmp_path, capsys) -> None:
    """`tpuplex predict RUN --split FOLDER` transcribes every recording under it into FOLDER's name.tsv, as
    `Run.predict` does; `--data-dir` reads the run's dev.tsv from that folder, its recordings checked as training's
    (a stereo file: exit 2, one line naming it)."""
    from tpuplex.commands import cli

    mine = tmp_path / "my_wavs"
    (mine / "more").mkdir(parents=True)
    soundfile.write(mine / "x.wav", tone(0.7, 300), RATE)
    soundfile.write(mine / "more" / "y.flac", tone(0.4, 500), RATE)
    run = str(tone_run.folder)
    assert cli.main(["predict", run, "--split", str(mine), "--out", str(tmp_path / "out")]) == 0, \
        capsys.readouterr().err
    lines = (tmp_path / "out" / "my_wavs.tsv").read_text().splitlines()
    files = [mine / "more" / "y.flac", mine / "x.wav"]
    assert lines == ["path\ttranscript", *(f"{file}\t{text}" for file, text in zip(files, tone_run.predict(files),
                                                                                   strict=True))]
    soundfile.write(mine / "w.wav", np.full(4000, np.nan, np.float32), RATE, subtype="FLOAT")
    capsys.readouterr()
    assert cli.main(["predict", run, "--split", str(mine), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip().endswith(f"{mine / 'w.wav'} holds 4000 NaN or infinite sample(s) "
                                                    "(recording 2 of --split my_wavs), which would make the loss "
                                                    "nan: fix or re-export the recording (samples are numbers in "
                                                    "[-1, 1]), or remove it from the manifest")

    other = tmp_path / "other"
    other.mkdir()
    soundfile.write(other / "e.wav", tone(0.5, 250), RATE)
    soundfile.write(other / "s.wav", np.stack([tone(0.5, 250)] * 2, axis=1), RATE)
    (other / "dev.tsv").write_text("path\ttext\ne.wav\tone\ns.wav\ttwo\n")
    capsys.readouterr()
    assert cli.main(["predict", run, "--split", "dev", "--data-dir", str(other), "--out", str(tmp_path / "o2")]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and f"{other / 's.wav'} has 2 channels" in error
    (other / "dev.tsv").write_text("path\ttext\ne.wav\tone\n")
    assert cli.main(["predict", run, "--split", "dev", "--data-dir", str(other), "--out", str(tmp_path / "o2")]) == 0
    lines = (tmp_path / "o2" / "dev.tsv").read_text().splitlines()
    assert [line.split("\t")[0] for line in lines] == ["path", str(other / "e.wav")]
    assert lines[1].split("\t")[1] == tone_run.predict(other / "e.wav")


def test_predict_of_one_recording_and_its_log_probability(tone_run) -> None:
    """One path alone gives one transcript; `scores=True` adds the transcript's CTC log-probability."""
    recordings = sorted(Path(tone_run.config.data.train_file).parent.glob("*.wav"))
    transcripts = tone_run.predict(recordings)
    assert tone_run.predict(recordings[0]) == transcripts[0] and isinstance(transcripts[0], str)
    records = tone_run.predict(recordings, scores=True)
    assert [record["transcript"] for record in records] == transcripts
    assert all(set(record) == {"transcript", "log_probability"} for record in records)
    assert all(np.isfinite(record["log_probability"]) and record["log_probability"] < 0 for record in records)
    assert tone_run.predict(str(recordings[1]), scores=True) == records[1]

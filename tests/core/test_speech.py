"""The speech task's framework-free half (`tpuplex.tasks.speech_recognition`, `tpuplex.data.audio`): recordings
prepared into log-mel shards once, the character vocabulary, batches of static shape, SpecAugment from the seed,
greedy CTC decoding, and one clear line for each kind of bad audio."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import soundfile

from tpuplex.config import from_dict
from tpuplex.data import audio
from tpuplex.errors import TpuplexError
from tpuplex.tasks import get, options
from tpuplex.tasks.speech_recognition.data import Vocabulary, spec_augment

RATE = 8000
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TASK = get("speech_recognition")


def tone(seconds: float, frequency: float = 440.0) -> np.ndarray:
    time = np.arange(int(RATE * seconds)) / RATE
    return (0.3 * np.sin(2 * np.pi * frequency * time)).astype(np.float32)


def write_data(folder, recordings: dict[str, tuple[np.ndarray, str]], rate: int = RATE) -> str:
    """Wav files and a manifest (path relative to it, text) -> the manifest's path."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["path\ttext"]
    for name, (samples, text) in recordings.items():
        soundfile.write(folder / name, samples, rate, subtype="PCM_16")
        lines.append(f"{name}\t{text}")
    (folder / "train.tsv").write_text("\n".join(lines) + "\n")
    return str(folder / "train.tsv")


def prepare(tmp_path, manifest: str, **task):
    config = from_dict({"task": {"name": "speech_recognition", "sample_rate": RATE, "mel_bins": 16, **task},
                        "data": {"train_file": manifest, "cache_dir": str(tmp_path / "cache")},
                        "train": {"seed": 1}})
    chosen = options(TASK, config.task.options)
    TASK.check(config, chosen)
    return TASK.prepare(config, chosen, None)


def test_recordings_become_features_labels_and_static_batches(tmp_path) -> None:
    recordings = {f"u{i}.wav": (tone(0.3 + 0.1 * i, 200 + 100 * i), text)
                  for i, text in enumerate(["one two", "three", "four five six", "seven", "eight nine", "zero"])}
    data = prepare(tmp_path, write_data(tmp_path / "audio", recordings), validation_fraction=0.3)
    assert data.vocabulary.characters == " efghinorstuvwxz" and data.vocabulary.size == 17
    assert len(data.train) == 4 and len(data.eval["validation"]) == 2
    frames = audio.LogMel(RATE, 16).frames
    assert sorted(data.train.lengths.tolist() + data.eval["validation"].lengths.tolist()) == sorted(
        frames(len(samples)) for samples, _ in recordings.values())
    rows = data.train.rows(np.arange(4), 40)
    assert rows["features"].shape == (4, 40, 16) and rows["features"].dtype == np.float32
    assert rows["attention_mask"].sum(axis=1).tolist() == np.minimum(data.train.lengths, 40).tolist()
    assert rows["labels"].shape == (4, len("four five six"))
    spelled = ["".join(data.vocabulary.characters[i - 1] for i in row if i) for row in rows["labels"]]
    assert spelled == list(data.train.texts)
    # Prepared once: a second run reads the same folder.
    again = prepare(tmp_path, str(tmp_path / "audio" / "train.tsv"), validation_fraction=0.3)
    assert again.train.shards.location == data.train.shards.location


def test_features_are_log_mel_frames_normalised_per_utterance_when_asked(tmp_path) -> None:
    settings = audio.LogMel(RATE, 16, 25.0, 10.0)
    features = settings(tone(1.0))
    assert features.shape == (settings.frames(RATE), 16) == (98, 16)
    normalised = dataclasses.replace(settings, normalize="utterance")(tone(1.0))
    np.testing.assert_allclose(normalised.mean(axis=0), 0.0, atol=1e-4)
    varying = features.std(axis=0) > 0.1  # the tone's own bins; flat ones stay near 0
    assert varying.any() and not np.allclose(features.mean(axis=0), 0.0, atol=0.1)
    np.testing.assert_allclose(normalised.std(axis=0)[varying], 1.0, atol=1e-2)
    matrix = audio.mel_matrix(16, 129, RATE)
    assert matrix.shape == (129, 16) and not matrix[0].any() and np.all(matrix.max(axis=0) > 0.5)
    manifest = write_data(tmp_path / "audio", {"a.wav": (tone(0.5), "one"), "b.wav": (tone(0.5), "two")})
    with pytest.raises(TpuplexError, match='task.normalize = \'global\' is not a normalization: use "none"'):
        prepare(tmp_path, manifest, normalize="global")


def test_greedy_ctc_merges_repeats_and_drops_blanks() -> None:
    vocabulary = Vocabulary("abc")
    assert vocabulary.decode(np.array([0, 1, 1, 0, 1, 2, 2, 0, 3, -1, -1])) == "aabc"


def test_spec_augment_masks_are_drawn_from_the_seed() -> None:
    features = np.ones((2, 50, 16), np.float32)
    frames = np.array([50, 30])
    first = spec_augment(features, frames, np.random.default_rng([1, 1, 7]), 2, 10, 2, 4)
    again = spec_augment(features, frames, np.random.default_rng([1, 1, 7]), 2, 10, 2, 4)
    np.testing.assert_array_equal(first, again)
    assert 0 < (first == 0).mean() < 0.6
    assert np.all(first[1, 30:] == first[1, 30:31])  # time masks stay inside the utterance's 30 frames


def stereo(path):
    soundfile.write(path, np.stack([tone(0.5)] * 2, axis=1), RATE)


def with_nan(path):
    samples = tone(0.5)
    samples[100] = np.nan
    soundfile.write(path, samples, RATE, subtype="FLOAT")


def cut_short(path):
    """A wav whose header promises 0.5 s of samples, the file holding the first half of them (a copy cut off)."""
    soundfile.write(path, tone(0.5), RATE, subtype="PCM_16")
    whole = path.read_bytes()
    path.write_bytes(whole[: 44 + RATE // 2])


BAD = {
    "a missing file": (lambda folder: None, "missing.wav does not exist"),
    "NaN samples": (lambda folder: with_nan(folder / "bad.wav"), "bad.wav holds 1 NaN or infinite sample"),
    "a wav cut short": (lambda folder: cut_short(folder / "bad.wav"),
                        r"bad.wav is cut short \(.*train.tsv line 3 of data.train_file\): its header promises 4000 "
                        r"samples \(0.50 s\), the file holds 2000: copy the recording again whole"),
    "a truncated file": (lambda folder: (folder / "bad.wav").write_bytes(b"RIFF\x00\x00"),
                         "bad.wav cannot be read as audio"),
    "stereo": (lambda folder: stereo(folder / "bad.wav"), "bad.wav has 2 channels"),
    "no samples": (lambda folder: soundfile.write(folder / "bad.wav", np.zeros(0, np.float32), RATE),
                   "bad.wav holds 0 samples, less than one 25 ms frame"),
    "a 10-minute file": (lambda folder: soundfile.write(folder / "bad.wav", np.zeros(600 * RATE, np.float32), RATE),
                         "bad.wav lasts 600.0 s, more than task.max_seconds = 30"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_audio_is_one_line_naming_the_file_and_nothing_is_prepared(tmp_path, case) -> None:
    write, message = BAD[case]
    folder = tmp_path / "audio"
    manifest = write_data(folder, {"good.wav": (tone(0.5), "one")})
    write(folder)
    name = "missing.wav" if case == "a missing file" else "bad.wav"
    with open(manifest, "a") as handle:
        handle.write(f"{name}\ttwo\n")
    with pytest.raises(TpuplexError, match=message) as error:
        prepare(tmp_path, manifest, validation_fraction=0.5)
    assert "line 3" in str(error.value)
    assert not (tmp_path / "cache" / "audio").exists() or not any((tmp_path / "cache" / "audio").iterdir())


def test_a_recording_at_another_rate_is_resampled_to_the_task_s(tmp_path) -> None:
    """A 440 Hz tone recorded at 16 kHz reads as the same tone at 8 kHz: half the samples, equal within the polyphase
    filter's ripple, and the same log-mel features in the bins around the tone (the bins far from it hold the two
    16-bit files' different quantization noise, whose logs differ)."""
    settings = audio.LogMel(RATE, 16)
    seconds = np.arange(2 * RATE) / (2 * RATE)
    soundfile.write(tmp_path / "high.wav", (0.3 * np.sin(2 * np.pi * 440 * seconds)).astype(np.float32), 2 * RATE)
    soundfile.write(tmp_path / "low.wav", tone(1.0), RATE)
    high = audio.read_recording(tmp_path / "high.wav", settings, 30, "row 1")
    low = audio.read_recording(tmp_path / "low.wav", settings, 30, "row 2")
    assert high.shape == low.shape == (RATE,) and high.dtype == np.float32
    inner = slice(100, -100)  # the filter's edges aside
    np.testing.assert_allclose(high[inner], low[inner], atol=2e-3)
    features_high, features_low = settings(high)[2:-2], settings(low)[2:-2]
    centers = audio.mel_matrix(16, settings.fft_length // 2 + 1, RATE).argmax(axis=0) * RATE / settings.fft_length
    near = centers < 600  # the bins around the tone
    np.testing.assert_allclose(features_high[:, near], features_low[:, near], atol=0.01)


def test_a_held_out_transcript_outside_the_vocabulary_is_named(tmp_path) -> None:
    folder = tmp_path / "audio"
    write_data(folder, {"a.wav": (tone(0.5), "one"), "b.wav": (tone(0.5), "two")})
    (folder / "dev.tsv").write_text("path\ttext\nb.wav\tten!\n")
    config = from_dict({"task": {"name": "speech_recognition", "sample_rate": RATE, "mel_bins": 16},
                        "data": {"train_file": str(folder / "train.tsv"), "eval_files": [str(folder / "dev.tsv")],
                                 "cache_dir": str(tmp_path / "cache")}})
    with pytest.raises(TpuplexError, match=r"b.wav \(data.eval_files\[0\]\) has '!', characters the training"):
        TASK.prepare(config, options(TASK, config.task.options), None)


def test_tpuplex_prepare_of_a_config_prepares_what_its_runs_read(tmp_path, capsys) -> None:
    from tpuplex.commands import cli
    from tpuplex.data import shards

    recordings = {f"u{i}.wav": (tone(0.3 + 0.1 * i, 200 + 100 * i), text)
                  for i, text in enumerate(["one two", "three", "four five", "seven"])}
    manifest = write_data(tmp_path / "audio", recordings)
    config = tmp_path / "speech.toml"
    config.write_text(f'[task]\nname = "speech_recognition"\nsample_rate = {RATE}\nmel_bins = 16\n'
                      f'[model]\ncheckpoint = "{EXAMPLES / "speech" / "conformer-s"}"\n'
                      f'[data]\ntrain_file = "{manifest}"\ncache_dir = "{tmp_path / "cache"}"\n')
    assert cli.main(["prepare", str(config), "--set", "train.seed=1"]) == 0
    printed = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines())
    assert printed["characters"] == " efhinorstuvw" and shards.is_prepared(Path(printed["prepared"]))
    assert prepare(tmp_path, manifest, validation_fraction=0.1).train.shards.location == printed["prepared"]
    assert cli.main(["prepare", str(config), "--out", str(tmp_path / "out")]) == 2
    assert "takes its settings from the config, not --out" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_transcript_longer_than_its_audio_s_frames_is_one_line_from_the_cli(tmp_path, capsys) -> None:
    """CTC cannot align more characters than the recording has frames (a transcript of another recording): `tpuplex
    prepare` (and so train) exits 2 naming the file, not a ValueError from a later padding."""
    from tpuplex.commands import cli

    manifest = write_data(tmp_path / "audio", {"a.wav": (tone(0.5), "one"), "b.wav": (tone(0.3), "x" * 400)})
    config = tmp_path / "speech.toml"
    config.write_text(f'[task]\nname = "speech_recognition"\nsample_rate = {RATE}\nmel_bins = 16\n'
                      'validation_fraction = 0.5\n'
                      f'[model]\ncheckpoint = "{EXAMPLES / "speech" / "conformer-s"}"\n'
                      f'[data]\ntrain_file = "{manifest}"\ncache_dir = "{tmp_path / "cache"}"\n')
    assert cli.main(["prepare", str(config)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.endswith("b.wav (data.train_file) has a transcript of 400 characters, more than CTC can fit in the "
                          "28 feature frames of its audio: it needs 799 (one a character, a blank between repeated "
                          "ones): check that the transcript is this recording's, or remove the row from the manifest")
    assert len(error.splitlines()) == 1


def speech_config(tmp_path, folder, **data):
    return from_dict({"task": {"name": "speech_recognition", "sample_rate": RATE, "mel_bins": 16},
                      "data": {"train_file": str(folder / "train.tsv"), "eval_files": [str(folder / "dev.tsv")],
                               "cache_dir": str(tmp_path / "cache"), **data}})


def test_predict_takes_a_folder_of_recordings_and_reads_data_dir_s_manifests(tmp_path) -> None:
    """`tpuplex predict --split` names a split of the run, or recordings (a file, or every .wav/.flac/.ogg under a
    folder); `--data-dir` is the folder the run's evaluation manifests are read from by name, their recordings
    checked as training's are. (tests/torch/test_speech.py transcribes both through the CLI.)"""
    folder = tmp_path / "audio"
    write_data(folder, {"a.wav": (tone(0.5), "one"), "b.wav": (tone(0.5), "two")})
    (folder / "dev.tsv").write_text("path\ttext\nb.wav\ttwo\n")
    mine = tmp_path / "my_wavs"
    (mine / "more").mkdir(parents=True)
    soundfile.write(mine / "z.wav", tone(0.4), RATE)
    soundfile.write(mine / "more" / "a.flac", tone(0.4), RATE)
    (mine / "notes.txt").write_text("not audio")
    config = speech_config(tmp_path, folder)
    assert TASK.prediction_sources(config, "dev") == {"dev": None}
    assert TASK.prediction_sources(config, str(mine)) == {"my_wavs": [mine / "more" / "a.flac", mine / "z.wav"]}
    assert TASK.prediction_sources(config, str(mine / "z.wav")) == {"z": [mine / "z.wav"]}
    (tmp_path / "empty").mkdir()
    with pytest.raises(TpuplexError, match=r"empty holds no .wav/.flac/.ogg recording: give an audio file or a folder"):
        TASK.prediction_sources(config, str(tmp_path / "empty"))
    with pytest.raises(TpuplexError, match=r"--split 'nope' is neither an evaluation split of the run \(dev\) nor an "
                                           "audio file or a folder of them"):
        TASK.prediction_sources(config, "nope")

    other = tmp_path / "other"
    other.mkdir()
    moved = speech_config(tmp_path, folder, data_dir=str(other))
    with pytest.raises(TpuplexError, match=r"data.data_dir .*other \(--data-dir\) holds no dev.tsv, the run's "
                                           r"data.eval_files\[0\]: give the folder that holds it"):
        TASK.prediction_sources(moved, "dev")
    with pytest.raises(TpuplexError, match="names recordings already: drop --data-dir"):
        TASK.prediction_sources(moved, str(mine))
    with pytest.raises(TpuplexError, match="holds its validation split out of data.train_file"):
        TASK.prediction_sources(dataclasses.replace(moved, data=dataclasses.replace(moved.data, eval_files=())), "dev")

    soundfile.write(other / "c.wav", tone(0.6), RATE)
    stereo(other / "d.wav")
    (other / "dev.tsv").write_text("path\ttext\nc.wav\tone\nd.wav\ttwo\n")
    assert TASK.prediction_sources(moved, "dev") == {"dev": None}
    chosen = options(TASK, moved.task.options)
    TASK.check(moved, chosen)
    with pytest.raises(TpuplexError, match=r"other/d.wav has 2 channels \(.*other/dev.tsv line 3 of "
                                           r"data.eval_files\[0\] in "
                                           r"data.data_dir\): tpuplex reads mono recordings"):
        TASK.prepare(moved, chosen, None)
    (other / "dev.tsv").write_text("path\ttext\nc.wav\tone\n")
    data = TASK.prepare(moved, chosen, None)
    assert data.eval["dev"].paths == (str((other / "c.wav").resolve()),) and len(data.train) == 2

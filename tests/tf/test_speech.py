"""Speech recognition on the tf backend: tests/common/speech_checks.py's checks, and the SavedModel that takes wav
bytes."""

import csv

import numpy as np
import pytest
import soundfile
import tensorflow as tf
from fresh_process import tpuplex
from speech_checks import (  # noqa: F401  (collected here)
    speech_run,
    test_ctc_training_follows_torch_on_real_recordings,
    test_the_torch_checkpoint_transcribes_alike,
)

from tpuplex.data.audio import LogMel
from tpuplex_tf.tasks.speech_recognition import log_mel

pytestmark = pytest.mark.started_first


@pytest.fixture(scope="module")
def backend_name() -> str:
    return "tf"


def test_the_saved_model_transcribes_wav_bytes_as_predict_does(speech_run, tmp_path):  # noqa: F811
    """`tpuplex export --format saved_model` of a torch checkpoint: fed the 20 dev recordings as wav bytes, its
    transcripts are `tpuplex predict`'s; its features, computed in the graph, are `tpuplex.data.audio`'s (1e-4)."""
    run, exported = speech_run["initial"], tmp_path / "saved"
    tpuplex("predict", str(run), "--backend", "tf", "--split", "dev", "--out", str(tmp_path / "predicted"))
    tpuplex("export", str(run), "--format", "saved_model", "--out", str(exported))
    with (tmp_path / "predicted" / "dev.tsv").open(encoding="utf-8", newline="") as handle:
        predicted = list(csv.DictReader(handle, delimiter="\t"))
    wavs = [open(row["path"], "rb").read() for row in predicted]
    served = tf.saved_model.load(str(exported)).signatures["serving_default"](audio=tf.constant(wavs))
    assert [text.decode() for text in served["transcripts"].numpy()] == [row["transcript"] for row in predicted]
    assert len(predicted) == 20
    samples, _ = soundfile.read(predicted[0]["path"], dtype="float32")
    for normalize in ("none", "utterance"):
        settings = LogMel(8000, 24, normalize=normalize)
        np.testing.assert_allclose(log_mel(tf.constant(samples), settings).numpy(), settings(samples), atol=1e-4)

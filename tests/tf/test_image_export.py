"""An image run served from JPEG bytes: the SavedModel decodes and resizes exactly as `tpuplex prepare` does, and,
loaded by plain TensorFlow, classifies raw files as `tpuplex predict` does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import image_checks
import numpy as np
import tensorflow as tf
from fresh_process import tpuplex

from tpuplex.data import images
from tpuplex_tf.tasks.image_classification import decode_and_resize

REPO = Path(__file__).resolve().parents[2]


def test_the_serving_decode_and_resize_are_prepare_s_to_the_pixel(shared_images):
    files = sorted((shared_images / "flowers").rglob("*.jpg"))[::25]
    for size in ((128, 128), (96, 160), (32, 32)):
        for path in files:
            data = path.read_bytes()
            served = decode_and_resize(tf.constant(data), *size).numpy()
            np.testing.assert_array_equal(served, images.decode(data, size), err_msg=f"{path} at {size}")


SERVE = """
import json, sys
from pathlib import Path
import tensorflow as tf
model = tf.saved_model.load(sys.argv[1])
files = sorted(Path(sys.argv[2]).iterdir())
out = model.signatures["serving_default"](images=tf.constant([f.read_bytes() for f in files]))
print(json.dumps({"names": [f.name for f in files], "classes": out["classes"].numpy().tolist(),
                  "class_names": [n.decode() for n in out["class_names"].numpy()],
                  "probabilities": out["probabilities"].numpy().tolist()}))
"""


def test_the_saved_model_classifies_raw_jpegs_as_tpuplex_predict_does(shared_images, tmp_path):
    run, photos, rows = image_checks.predicted_run("tf", shared_images, tmp_path, every=40)
    tpuplex("export", str(run), "--format", "saved_model", "--out", str(tmp_path / "served"))
    classes = json.loads((run / "results.json").read_text())["data"]["classes"]
    done = subprocess_json(SERVE, str(tmp_path / "served"), str(photos))
    assert [Path(row["image"]).name for row in rows] == done["names"] and len(rows) == 25
    assert [int(row["class"]) for row in rows] == done["classes"]
    assert [row["label"] for row in rows] == done["class_names"]
    predicted = np.array([[float(row[name]) for name in classes] for row in rows])
    np.testing.assert_allclose(np.array(done["probabilities"]), predicted, atol=1e-5, rtol=0)


def subprocess_json(script: str, *args: str) -> dict:
    """`script` in a fresh interpreter (plain TensorFlow, no tpuplex); the JSON object it prints last."""
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, check=False,
                          timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])

"""An image run exported with torch.export: plain torch loads it and, given the pixels of the documented
preprocessing, gives `tpuplex predict`'s classes and probabilities."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import image_checks
import numpy as np
from fresh_process import tpuplex

from tpuplex.data import images

REPO = Path(__file__).resolve().parents[2]
LOAD = """
import json, sys
import numpy as np, torch
program = torch.export.load(sys.argv[1]).module()
probabilities, classes = program(torch.from_numpy(np.load(sys.argv[2])))
print(json.dumps({"probabilities": probabilities.tolist(), "classes": classes.tolist()}))
"""


def test_plain_torch_runs_the_exported_program_as_tpuplex_predict_does(shared_images, tmp_path):
    run, photos, rows = image_checks.predicted_run("torch", shared_images, tmp_path, every=50)
    tpuplex("export", str(run), "--format", "torch_export", "--out", str(tmp_path / "exported"))
    contract = json.loads((tmp_path / "exported" / "serving.json").read_text())
    assert contract["image_shape"] == [48, 48, 3]
    files = sorted(photos.iterdir())
    pixels = np.stack([images.decode(path.read_bytes(), (48, 48)) for path in files])  # the documented rule
    np.save(tmp_path / "pixels.npy", pixels)
    done = subprocess.run([sys.executable, "-c", LOAD, str(tmp_path / "exported" / "model.pt2"),
                           str(tmp_path / "pixels.npy")], capture_output=True, text=True, check=True, timeout=300)
    served = json.loads(done.stdout.strip().splitlines()[-1])
    assert [Path(row["image"]).name for row in rows] == [path.name for path in files] and len(rows) == 20
    assert [int(row["class"]) for row in rows] == served["classes"]
    predicted = np.array([[float(row[name]) for name in contract["classes"]] for row in rows])
    np.testing.assert_allclose(np.array(served["probabilities"]), predicted, atol=1e-5, rtol=0)

"""examples/notebooks/quickstart.ipynb executed top to bottom in a real Jupyter kernel (nbclient, as papermill does:
the test's parameters in a cell after the one tagged "parameters"), on a cut of the real MRPC files at 2 steps:
MiniLM fine-tuned on torch, the checkpoint evaluated on jax in the same kernel, three pairs predicted, the loss
plotted, a bad config caught as a ConfigError. The cells' outputs are what is checked. In the fast tier although it
takes 57-78 s: it is the one run of the notebook in a kernel, and its cost is MiniLM on two frameworks."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from shared_subset import subset_path

pytestmark = pytest.mark.started_first

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "examples" / "notebooks" / "quickstart.ipynb"


def text_of(cell: nbformat.NotebookNode) -> str:
    """A code cell's printed text and its result's text/plain, joined."""
    parts = []
    for output in cell.outputs:
        if output.output_type == "stream" and output.name == "stdout":
            parts.append(output.text)
        elif output.output_type == "execute_result":
            parts.append(output.data["text/plain"])
    return "".join(parts)


def cell_with(notebook: nbformat.NotebookNode, source: str) -> nbformat.NotebookNode:
    return next(cell for cell in notebook.cells if cell.cell_type == "code" and source in cell.source)


def test_the_quickstart_notebook_runs_in_a_kernel(shared_glue, minilm_dir, tmp_path) -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert all(cell.get("outputs", []) == [] for cell in notebook.cells), "commit the notebook without outputs"
    tagged = next(index for index, cell in enumerate(notebook.cells) if "parameters" in cell.metadata.get("tags", []))
    data = subset_path(shared_glue.parent, shared_glue / "MRPC", tmp_path / "subset")
    output_dir = tmp_path / "run-{backend}"
    injected = (f"data_dir = {str(data)!r}\nmax_steps = 2\nlog_every = 1\noutput_dir = {str(output_dir)!r}\n")
    notebook.cells.insert(tagged + 1, nbformat.v4.new_code_cell(injected, metadata={"tags": ["injected-parameters"]}))

    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()

    assert text_of(cell_with(notebook, "tpuplex.devices()")).startswith("cpu x")
    trained = ast.literal_eval(text_of(cell_with(notebook, "run = tpuplex.train(")))
    results = json.loads((tmp_path / "run-torch" / "results.json").read_text())
    assert trained == results["metrics"] and results["step"] == 2 and results["backend"] == "torch"
    evaluated = ast.literal_eval(text_of(cell_with(notebook, "run.evaluate(backend=other_backend)")))
    for name, value in trained["dev"].items():  # the torch checkpoint on jax: the same numbers
        assert evaluated["dev"][name] == pytest.approx(value, abs=1e-5), name
    predicted = ast.literal_eval(text_of(cell_with(notebook, "run.predict(pairs)")))
    assert len(predicted) == 3 and set(predicted) <= {"0", "1"}
    plot = cell_with(notebook, "plt.show()")
    assert any("image/png" in output.get("data", {}) for output in plot.outputs)
    caught = text_of(cell_with(notebook, "except tpuplex.ConfigError"))
    assert caught.startswith("ConfigError: train.learning_rate = -1.0") and "\n" == caught[-1]

"""The XLA session shares the eager session's helpers (tests/torch/helpers.py).

pytest puts tests/ on sys.path for the top-level conftest; there the folders tests/jax and tests/torch_xla pass
for namespace packages, and torch_xla's optional `import jax` would find the folder (jax is not installed here)
and fail. The folder is taken off the path once that conftest is loaded.
"""

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != TESTS]
sys.path.insert(0, str(TESTS / "torch"))

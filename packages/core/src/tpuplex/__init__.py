"""tpuplex: one experiment, three frameworks, static shapes.

The public API (docs/python.md): `Config`, `train`, `Run`, `devices`, `tune` (docs/tune.md), and the errors
`TpuplexError`, `ConfigError`, `DataError`, `CheckpointError` and `Preempted`. Everything else is internal.

The core is framework-free: importing it never imports TensorFlow, PyTorch, JAX or Flax.
"""

from typing import Any

from tpuplex.errors import CheckpointError, ConfigError, DataError, TpuplexError

__version__ = "0.1.0"
__all__ = ["CheckpointError", "Config", "ConfigError", "DataError", "Preempted", "Run", "TpuplexError", "devices",
           "train", "tune", "__version__"]

_LAZY = {"Config": "tpuplex.config", "Preempted": "tpuplex.engine.preemption", "Run": "tpuplex.commands.api",
         "train": "tpuplex.commands.api", "devices": "tpuplex.commands.api", "tune": "tpuplex.commands.api"}
"""Names imported on first use: `import tpuplex` stays quick for the CLI, which needs none of them to start."""


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'tpuplex' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)

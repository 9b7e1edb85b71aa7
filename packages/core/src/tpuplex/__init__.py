"""tpuplex: one experiment, three frameworks, static shapes.

The core is framework-free: importing it never imports TensorFlow, PyTorch, JAX or Flax.
"""

from tpuplex.errors import TpuplexError

__version__ = "0.1.0"
__all__ = ["TpuplexError", "__version__"]

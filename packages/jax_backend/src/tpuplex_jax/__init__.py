"""tpuplex's JAX backend: `jax.pmap` data parallelism over the selected devices, Flax models, optax's AdamW.

The backend class is `tpuplex_jax.backend.JaxBackend`, registered under the `tpuplex.backends` entry point.
"""

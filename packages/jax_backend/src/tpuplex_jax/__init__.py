"""tpuplex's JAX backend: one `jax.jit` program per step over a device mesh (data, fsdp and tensor axes, GSPMD),
Flax models, optax's AdamW.

The backend class is `tpuplex_jax.backend.JaxBackend`, registered under the `tpuplex.backends` entry point.
"""

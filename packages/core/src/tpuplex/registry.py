"""Backends announce themselves through the `tpuplex.backends` entry-point group; this module finds them.

A backend class is constructed with the run's `RuntimeConfig` and implements `tpuplex.protocol.Backend`.
"""

from __future__ import annotations

import sys
from importlib.metadata import entry_points

from tpuplex import sharding
from tpuplex.config import RuntimeConfig
from tpuplex.errors import ConfigError, MeshError
from tpuplex.protocol import Backend

GROUP = "tpuplex.backends"
INSTALL = {
    "tf": "pip install './packages/tf_backend[cpu]' from a tpuplex clone  (or [gpu], [tpu])",
    "torch": "pip install ./packages/torch_backend from a tpuplex clone  (add [xla] for torch_xla)",
    "jax": "pip install ./packages/jax_backend from a tpuplex clone  (or './packages/jax_backend[tpu]', [gpu])",
}
"""How to install each backend: the packages are on no index, so from their folders in the repository."""
TEST_BACKEND = "numpy"
"""The framework-free backend of tpuplex's own tests (tpuplex.testing): it runs when named, but no message offers
it to a user."""


def available() -> list[str]:
    """Names of the installed backends."""
    return sorted(ep.name for ep in entry_points(group=GROUP))


def offered(names: list[str] | set[str]) -> list[str]:
    """`names` as a message lists them to a user: sorted, without the test backend."""
    return sorted(set(names) - {TEST_BACKEND})


def check_known(name: str) -> None:
    """`name` is an installed backend: else one ConfigError line, the pip command that installs it or the backends
    there are. Nothing is imported."""
    found = available()
    if name not in found:
        installed = ", ".join(offered(set(found))) or "none"
        if name in INSTALL:
            raise ConfigError(f"backend {name!r} is not installed (installed: {installed}): {INSTALL[name]}")
        raise ConfigError(f"backend {name!r} is not known: use one of {', '.join(offered(set(INSTALL) | set(found)))}")


def create(name: str, runtime: RuntimeConfig) -> Backend:
    """Construct the backend `name`; a missing one gives the pip command that installs it."""
    check_known(name)
    found = {ep.name: ep for ep in entry_points(group=GROUP)}
    try:
        cls = found[name].load()
    except ImportError as error:
        raise ConfigError(
            f"backend {name!r} is installed but cannot be imported ({error}): reinstall it with {INSTALL.get(name)}"
        ) from None
    if not getattr(cls, "shards_parameters", False) and sharding.asks_to_shard(runtime.mesh):
        raise MeshError(
            f"runtime.mesh = {runtime.mesh} splits parameters over fsdp or tensor, which the {name} backend does not "
            "do (it keeps every parameter whole on each device): train this mesh with --backend jax, or set "
            "runtime.mesh = {data = -1} (docs/sharding.md)",
            f"runtime.mesh = {runtime.mesh} splits parameters, which the {name} backend keeps whole")
    if name != "torch":  # one config serves every backend: a torch setting is a warning elsewhere, not an error
        for field, default in (("torch_mode", "auto"), ("torch_random", "eager")):
            if (value := getattr(runtime, field)) != default:
                print(f"tpuplex: warning: runtime.{field} = {value!r} sets how the torch backend runs; the {name} "
                      "backend ignores it", file=sys.stderr)
    backend = cls(runtime)
    topology = backend.topology()
    if topology.mesh is None:  # a data-only backend: the mesh must still name its devices
        sharding.resolve(runtime.mesh, topology.device_count)
    return backend

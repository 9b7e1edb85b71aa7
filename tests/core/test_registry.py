"""Finding backends through the `tpuplex.backends` entry-point group."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from tpuplex import registry
from tpuplex.config import RuntimeConfig
from tpuplex.errors import TpuplexError
from tpuplex.protocol import Backend
from tpuplex.testing.numpy_backend import NumpyBackend


def test_the_numpy_backend_is_installed_and_follows_the_protocol() -> None:
    assert "numpy" in registry.available()
    backend = registry.create("numpy", RuntimeConfig(cpu_devices=3))
    assert isinstance(backend, NumpyBackend) and isinstance(backend, Backend)
    assert backend.topology().device_count == 3
    assert registry.create("numpy", RuntimeConfig()).topology().device_count == 1


@pytest.mark.parametrize("name", sorted(registry.INSTALL))
def test_a_known_backend_that_is_missing_names_its_pip_command(name: str, monkeypatch) -> None:
    monkeypatch.setattr(registry, "entry_points", lambda group: [])
    with pytest.raises(TpuplexError) as error:
        registry.create(name, RuntimeConfig())
    assert f"backend {name!r} is not installed" in str(error.value)
    assert registry.INSTALL[name] in str(error.value)


def test_an_unknown_backend_lists_the_known_ones() -> None:
    with pytest.raises(TpuplexError) as error:
        registry.create("mxnet", RuntimeConfig())
    assert str(error.value) == "backend 'mxnet' is not known: use one of jax, tf, torch"  # not the test backend


def test_a_backend_that_fails_to_import_says_how_to_reinstall(monkeypatch) -> None:
    broken = EntryPoint(name="jax", value="tpuplex_missing_module:Backend", group=registry.GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [broken])
    with pytest.raises(TpuplexError) as error:
        registry.create("jax", RuntimeConfig())
    assert "is installed but cannot be imported" in str(error.value)
    assert registry.INSTALL["jax"] in str(error.value)


def test_a_torch_setting_on_another_backend_is_one_warning_line(capsys) -> None:
    """One config serves every backend, so a setting only torch reads is named, not refused, elsewhere."""
    registry.create("numpy", RuntimeConfig(torch_mode="compile"))
    assert capsys.readouterr().err == ("tpuplex: warning: runtime.torch_mode = 'compile' sets how the torch backend "
                                       "runs; the numpy backend ignores it\n")
    registry.create("numpy", RuntimeConfig(torch_random="compiled"))
    assert capsys.readouterr().err == ("tpuplex: warning: runtime.torch_random = 'compiled' sets how the torch "
                                       "backend runs; the numpy backend ignores it\n")
    registry.create("numpy", RuntimeConfig())
    assert capsys.readouterr().err == ""

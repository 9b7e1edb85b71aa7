"""docs/ARCHITECTURE.md names only what exists: every module, file, folder and name it cites.

Read from the source (the AST of each cited module), so the core session checks the backends' modules too without
importing a framework.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
SOURCES = [ROOT / "packages" / folder / "src" for folder in ("core", "tf_backend", "torch_backend", "jax_backend")]
DOTTED = re.compile(r"`((?:tpuplex|tpuplex_tf|tpuplex_torch|tpuplex_jax)(?:\.\w+)+)")
"""A module or a name in it, as the page writes it in code: `tpuplex.protocol.decays`, `tpuplex_jax`."""
PATH = re.compile(r"(?<![\w./-])((?:docs|tests|benchmarks|examples|packages|tpuplex)/[\w./-]*\w/?)")
"""A repository path (`tpuplex/...` is under packages/core/src)."""


def cited(pattern: re.Pattern) -> list[str]:
    return sorted({match for match in pattern.findall(DOC.read_text(encoding="utf-8"))})


def module_file(dotted: str) -> Path | None:
    for source in SOURCES:
        for candidate in (source / f"{dotted.replace('.', '/')}.py", source / dotted.replace(".", "/") / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


@cache
def defined_names(path: Path) -> dict[str, set[str]]:
    """Top-level name -> the names defined in its body (a class's attributes and methods; empty otherwise)."""
    names: dict[str, set[str]] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef):
            members = {item.name for item in node.body if isinstance(item, ast.FunctionDef | ast.ClassDef)}
            members |= {target.id for item in node.body if isinstance(item, ast.Assign) for target in item.targets
                        if isinstance(target, ast.Name)}
            members |= {item.target.id for item in node.body if isinstance(item, ast.AnnAssign)
                        and isinstance(item.target, ast.Name)}
            names[node.name] = members
        elif isinstance(node, ast.FunctionDef):
            names[node.name] = set()
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    names[target.id] = set()
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names |= {(alias.asname or alias.name).split(".")[0]: set() for alias in node.names}
    return names


@pytest.mark.parametrize("name", cited(DOTTED))
def test_every_cited_module_and_name_exists(name: str) -> None:
    parts = name.split(".")
    found = next(((i, path) for i in range(len(parts), 0, -1) if (path := module_file(".".join(parts[:i])))), None)
    assert found is not None, f"docs/ARCHITECTURE.md cites {name}, but no module {parts[0]}... exists"
    index, path = found
    rest = parts[index:]
    if rest:
        names = defined_names(path)
        assert rest[0] in names, f"docs/ARCHITECTURE.md cites {name}: {path.name} defines no {rest[0]}"
        if len(rest) > 1 and names[rest[0]]:
            assert rest[1] in names[rest[0]], f"docs/ARCHITECTURE.md cites {name}: {rest[0]} has no {rest[1]}"


@pytest.mark.parametrize("path", cited(PATH))
def test_every_cited_path_exists(path: str) -> None:
    where = ROOT / "packages" / "core" / "src" / path if path.startswith("tpuplex/") else ROOT / path
    assert where.exists(), f"docs/ARCHITECTURE.md cites {path}, which does not exist"


def test_the_page_cites_the_layers_it_draws() -> None:
    """The contracts file the page points to exists and names every top-level part of the core in its layers."""
    contracts = (ROOT / ".importlinter").read_text(encoding="utf-8")
    core = ROOT / "packages" / "core" / "src" / "tpuplex"
    parts = {path.stem for path in core.glob("*.py") if path.stem != "__init__"}
    parts |= {path.name for path in core.iterdir() if (path / "__init__.py").is_file()}
    layers = contracts.split("[importlinter:contract:core-layers]")[1].split("[importlinter:contract")[0]
    listed = set(re.findall(r"\b\w+\b", layers.split("layers =")[1].split("exhaustive")[0]))
    assert parts <= listed, f"the layers in .importlinter leave out {sorted(parts - listed)}"
    assert len(cited(DOTTED)) > 20 and len(cited(PATH)) > 10

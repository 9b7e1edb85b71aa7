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

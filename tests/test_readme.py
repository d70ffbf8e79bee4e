"""The README's command tour stays true: every ``serving-bench`` line in its shell blocks parses with the real CLI,
and every file it names exists in the repository (a renamed flag or profile fails here, not for a new user)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from serving_bench.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[list[str]]:
    """The ``serving-bench`` command lines of the README's ``sh`` blocks, continuation lines joined, as argv lists."""
    text = (ROOT / "README.md").read_text()
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv[:1] == ["serving-bench"]:
                commands.append(argv[1:])
    return commands


COMMANDS = readme_commands()


def test_the_tour_has_every_stage():
    assert {argv[0] for argv in COMMANDS} >= {"export", "serve", "replay", "profile", "simulate", "validate", "tune",
                                              "plan", "report"}


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(a[:2]) for a in COMMANDS])
def test_readme_command_parses_and_names_existing_inputs(argv):
    build_parser(argv[0]).parse_args(argv)  # SystemExit (a failure) on an unknown flag or subcommand
    for arg in argv[1:]:
        if arg.startswith("load_profiles/"):
            assert (ROOT / arg).is_file(), f"README names {arg}, which is not in the repository"

"""The README's command examples (`$ gemmgen ...` followed by what it prints) run as shown and print what the
README says, so the examples cannot drift from the tool. Commands that write files or need a GPU are left out
(the dry run's export is checked in tests/test_cli_tune.py); everything here runs on a CPU in about a second."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from gemmgen.cli import main

README = Path(__file__).resolve().parent.parent / "README.md"


def examples() -> "list[tuple[str, list[str]]]":
    """(command line, the lines the README shows after it) for every `$ gemmgen` line of a fenced block."""
    found, current, fenced = [], None, False
    for line in README.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced, current = not fenced, None
            continue
        if not fenced:
            continue
        if line.startswith("$ gemmgen "):
            current = (line[2:], [])
            found.append(current)
        elif current is not None:
            current[1].append(line)
    return [(cmd, shown) for cmd, shown in found if "--out" not in cmd]


def run(command: str, capsys) -> "tuple[int, list[str]]":
    """Exit status and the lines the command line prints (stdout, or stderr when it fails), `| head -N` applied."""
    head = re.search(r"\|\s*head -(\d+)\s*$", command)
    argv = shlex.split(command[:head.start()] if head else command)[1:]
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    lines = (out if code == 0 else err).splitlines()
    return code, lines[:int(head.group(1))] if head else lines


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    # The shipped records and calibration, nothing from this user's data directory.
    monkeypatch.delenv("GEMMGEN_RESULTS", raising=False)
    monkeypatch.setenv("GEMMGEN_DATA", str(tmp_path / "data"))


def test_the_readme_has_command_examples():
    commands = [cmd.split()[1] for cmd, _ in examples()]
    assert {"roofline", "intensity", "lookup", "tune"} <= set(commands)


@pytest.mark.parametrize("command, shown", examples(), ids=[cmd for cmd, _ in examples()])
def test_a_readme_example_prints_what_the_readme_shows(capsys, command, shown):
    code, printed = run(command, capsys)
    assert code in (0, 2)
    # A command shown without `| head` prints at least what is shown; the README may stop early.
    assert [line.rstrip() for line in printed[:len(shown)]] == [line.rstrip() for line in shown]

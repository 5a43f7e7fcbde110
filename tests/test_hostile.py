"""Hostile archives through the real ``foundry`` command, one class of bad input at a time.

Each archive is a committed fixture or the bundled sample, tampered with and
re-sealed so every check before the one under test passes. A refusal must be
one line on stderr and exit status 2 (with ``--json``: one JSON object on stdout,
nothing else there), never a traceback, exit 70, a hang or a terminal's control
codes; a command that reads the archive must show its strings as text.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from foundry.archive.sample import sample_path
from foundry.archive.schema import CATALOG_FILE

from .archive_tools import edit_json
from .hostile import CONTROL, HOSTILE, assert_clean_output, assert_refused, hostile_names

SAMPLE = sample_path()
RENAMED = "decode" + HOSTILE


def copy(tmp_path: Path, source: Path = SAMPLE, name: str = "archive") -> Path:
    target = tmp_path / name
    shutil.copytree(source, target)
    return target


# -- 1, 2: markup and terminal escapes in archive strings ---------------------------------------


@pytest.fixture
def hostile(tmp_path) -> Path:
    return hostile_names(tmp_path / "hostile")


@pytest.mark.parametrize(
    ("command", "names_shown"),
    [
        (["archive", "inspect", "{a}"], True),
        (["graph", "show", "{a}", RENAMED], True),
        (["graph", "show", "{a}", "decode.bs2"], False),  # the kernel column is cut before the name's end
        (["archive", "diff", "{a}", "{sample}"], True),
        (["archive", "diff", "{sample}", "{a}"], True),
        (["graph", "lint", "{a}"], False),
        (["archive", "verify", "{a}"], False),
        (["graph", "export", "{a}", RENAMED, "--format", "dot"], True),
        (["graph", "export", "{a}", RENAMED, "--format", "graphml"], True),
    ],
    ids=lambda c: " ".join(c[:2] + c[-2:]) if isinstance(c, list) else "",
)
def test_markup_and_escapes_in_archive_strings_are_shown_as_text(cli, hostile, command, names_shown):
    outcome = cli.run(*(arg.format(a=hostile, sample=SAMPLE) for arg in command))
    assert_clean_output(outcome)  # exit 0 or 1, and not one control character on the terminal
    shown = outcome.stdout
    if names_shown:
        assert "[/][/bold]" in shown, shown[:3000]  # the markup, as text
        assert "\\x1b[2J" in shown and "\\x07" in shown and "\\u202e" in shown  # the escapes, escaped


def test_a_field_named_with_escapes_is_refused_in_one_line_without_them(cli, tmp_path):
    path = copy(tmp_path)
    edit_json(path / CATALOG_FILE, lambda c: c.update({"\x1b[2J\x1b]0;all ok\x07" + "x": 1}))
    text = assert_refused(cli.run("archive", "inspect", path), match=r"unknown field")
    assert "\\x1b[2J" in text  # named, escaped
    as_json = cli.run("archive", "inspect", path, "--json")
    assert_refused(as_json, match="unknown field")
    assert "\x1b[2J" in json.loads(as_json.stdout)["error"]["message"]  # JSON keeps the text; it escapes it itself


def test_a_refusal_with_json_is_one_object_on_stdout_and_nothing_else(cli, tmp_path):
    path = copy(tmp_path)
    edit_json(path / CATALOG_FILE, lambda c: c.update(world_size="one"))
    for command in (["archive", "inspect"], ["graph", "lint"], ["archive", "verify"]):
        outcome = cli.run(*command, path, "--json")
        assert_refused(outcome, match="Expected `int`, got `str`")
        assert json.loads(outcome.stdout)["error"]["field"] == "world_size"
    missing = cli.run("archive", "diff", tmp_path / "nowhere", SAMPLE, "--json")
    assert_refused(missing, match="no such archive")


def test_the_error_line_escapes_what_the_archive_wrote(cli, tmp_path):
    path = copy(tmp_path)
    edit_json(path / "rank0" / "session.json", lambda s: s["graphs"][0].update(file=f"../{HOSTILE}"), root=path)
    line = assert_refused(cli.run("archive", "inspect", path), match="stay inside the archive")
    assert not CONTROL.search(line) and "[/][/bold]" in line

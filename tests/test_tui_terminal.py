"""``foundry-tui`` in a real pseudo-terminal: spawned with pexpect, its output fed
to a pyte screen of 120x40, keys sent as a person would type them.

No GPU and no display needed; TERM is xterm-256color.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pexpect
import pyte
import pytest

from .test_tui import unresolved_archive

COLUMNS, LINES = 120, 40
TIMEOUT = 20.0


class Terminal:
    """A child process on a pty, its screen kept by pyte."""

    def __init__(self, *args: str, cwd: Path | None = None) -> None:
        env = dict(os.environ, TERM="xterm-256color", COLUMNS=str(COLUMNS), LINES=str(LINES))
        for key in ("TEXTUAL", "TEXTUAL_DRIVER", "NO_COLOR"):
            env.pop(key, None)
        self.screen = pyte.Screen(COLUMNS, LINES)
        self.stream = pyte.ByteStream(self.screen)
        self.child = pexpect.spawn(
            sys.executable,
            ["-m", "foundry.tui.app", *args],
            dimensions=(LINES, COLUMNS),
            env=env,
            cwd=str(cwd) if cwd else None,
        )

    def pump(self, seconds: float = 0.05) -> None:
        """Read what the child wrote in the next ``seconds`` into the screen."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                data = self.child.read_nonblocking(65536, timeout=max(0.0, deadline - time.monotonic()))
            except pexpect.TIMEOUT:
                return
            except pexpect.EOF:
                return
            self.stream.feed(data)
            if time.monotonic() >= deadline:
                return

    @property
    def text(self) -> str:
        return "\n".join(self.screen.display)

    def wait_for(self, *needles: str, timeout: float = TIMEOUT) -> str:
        """Pump until every needle is on screen; fail with the screen if they do not appear."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.pump(0.1)
            text = self.text
            if all(needle in text for needle in needles):
                return text
        pytest.fail(f"timed out waiting for {needles!r}; the screen shows:\n{self.text}")

    def send(self, keys: str) -> None:
        self.child.send(keys)

    def exit_status(self, timeout: float = TIMEOUT) -> int | None:
        self.child.expect(pexpect.EOF, timeout=timeout)
        self.child.close()
        return self.child.exitstatus

    def close(self) -> None:
        if self.child.isalive():
            self.child.terminate(force=True)


@pytest.fixture
def terminal():
    started: list[Terminal] = []

    def start(*args: str, cwd: Path | None = None) -> Terminal:
        term = Terminal(*args, cwd=cwd)
        started.append(term)
        return term

    yield start
    for term in started:
        term.close()


def test_browse_the_sample_in_a_real_terminal(terminal, tmp_path):
    term = terminal(cwd=tmp_path)  # no argument: the bundled sample
    screen = term.wait_for("Foundry — @sample (tiny-qwen3)", "decode.bs1 155", "155 nodes · 154 edges")
    assert "decode.bs2 155" in screen and "decode.bs4 155" in screen
    assert "/ Search" in screen and "? Help" in screen and "q Quit" in screen  # the footer
    assert "gpu     NVIDIA H200" in screen  # the archive pane

    term.send("\x1b[B")  # down: the second graph
    term.wait_for("Nodes · rank 0 decode.bs2", "node 0 · kernel · rank 0 decode.bs2")  # its nodes loaded
    term.send("\r")  # enter: into its nodes
    term.send("\x1b[B\x1b[B")  # two nodes down
    term.send("\r")  # open node 2
    screen = term.wait_for("node 2 · kernel · rank 0 decode.bs2", "mangled", "demangled")
    assert "(anon)::elementwise_kernel_with_index<...>" in screen
    term.send("\x1b[6~")  # page down in the node pane: launch config and parameters
    term.wait_for("Launch", "grid        (1, 1, 1)", "Parameters (")

    term.send("?")
    screen = term.wait_for("Keys: browse", "Next collective kernel", "Next lint finding")
    assert "Search kernel names in this graph" in screen
    term.send("\x1b")  # escape closes help
    deadline = time.monotonic() + TIMEOUT
    while "Keys: browse" in term.text and time.monotonic() < deadline:
        term.pump(0.1)
    assert "Keys: browse" not in term.text and "Parameters (" in term.text

    term.send("q")
    assert term.exit_status() == 0


def test_jump_to_unresolved_operand_in_a_real_terminal(terminal, tmp_path):
    archive = unresolved_archive(tmp_path)
    term = terminal(str(archive))
    term.wait_for("a.clean 6", "b.unresolved 6", "6 nodes · 5 edges")
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:  # the summary worker finds the other graph; retry until it is ready
        term.send("u")
        term.pump(0.3)
        if "Nodes · rank 0 b.unresolved" in term.text and "unresolved 0xdead00001000" in term.text:
            break
    screen = term.wait_for("Nodes · rank 0 b.unresolved", "unresolved 0xdead00001000")
    assert "memset" in screen
    term.send("q")
    assert term.exit_status() == 0


def test_bad_path_prints_one_line_and_exits_2(terminal):
    term = terminal("/nonexistent/archive")
    output = term.child.read().decode()
    term.child.close()
    assert term.child.exitstatus == 2
    assert output.strip() == "foundry-tui: error: /nonexistent/archive: no such archive"

"""``foundry-tui [ARCHIVE] [B]``: the Foundry TUI.

One archive opens the browse screen; two open the diff screen (A against B);
none opens the sample archive that ships with the package. Archives are opened
here, before the terminal is taken over, so a bad path is one line on stderr
(``foundry-tui: error: ...``) and exit status 2, never a traceback; so is a
standard output or input that is not a terminal.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import NoReturn

from foundry.tui.model import OpenedArchive
from foundry.tui.screens.browse import BrowseScreen
from foundry.tui.screens.diff import DiffScreen
from foundry.tui.screens.help import HelpScreen
from textual.app import App
from textual.binding import Binding
from textual.screen import Screen

from foundry import __version__
from foundry.archive.sample import SAMPLE_NAME
from foundry.backends.registry import BackendRegistry
from foundry.errors import FoundryError
from foundry.text import printable

EXIT_OK, EXIT_ERROR = 0, 2


class FoundryApp(App[int]):
    """Browse one archive, or diff two. ``timings`` records when the first screen
    painted and when the first graph's nodes were shown (``bench/tui_first_paint.py``)."""

    CSS_PATH = "foundry.tcss"
    TITLE = "Foundry"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("question_mark", "help", "Help", tooltip="Show every key"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        archive: OpenedArchive,
        other: OpenedArchive | None = None,
        *,
        registry: BackendRegistry | None = None,
    ) -> None:
        self.timings: dict[str, float] = {"start": time.perf_counter()}
        super().__init__()
        self.archive = archive
        self.other = other
        self.registry = registry if registry is not None else BackendRegistry.discover()

    def get_default_screen(self) -> Screen:
        if self.other is None:
            return BrowseScreen(self.archive, self.registry)
        return DiffScreen(self.archive, self.other)

    def mark(self, event: str) -> None:
        """Record the first time ``event`` happened (seconds since the app was made)."""
        self.timings.setdefault(event, time.perf_counter())

    def elapsed(self, event: str) -> float | None:
        at = self.timings.get(event)
        return None if at is None else at - self.timings["start"]

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss(None)
        else:
            self.push_screen(HelpScreen(self.screen, list(self.BINDINGS)))


class _Parser(argparse.ArgumentParser):
    """A usage error is one line on stderr and exit 2, as the ``foundry`` command gives it."""

    def error(self, message: str) -> NoReturn:
        print(f"foundry-tui: error: {printable(message)} (see 'foundry-tui --help')", file=sys.stderr)
        sys.exit(EXIT_ERROR)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="foundry-tui",
        description="Browse a Foundry archive (ranks -> graphs -> nodes), or diff two archives.",
        epilog=f"With no ARCHIVE the bundled sample ({SAMPLE_NAME}) opens. Press ? inside for the keys.",
    )
    parser.add_argument(
        "archives",
        nargs="*",
        metavar="ARCHIVE",
        help=f"an archive directory, or {SAMPLE_NAME}; give two (A B) for diff mode",
    )
    parser.add_argument("--version", action="version", version=f"foundry-tui {__version__}")
    return parser


def open_archives(texts: list[str]) -> list[OpenedArchive]:
    """Open every archive argument; raise FoundryError (or OSError) for the first bad one."""
    return [OpenedArchive.open(text) for text in texts or [SAMPLE_NAME]]


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``foundry-tui``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if len(args.archives) > 2:
        parser.error("give one ARCHIVE to browse, or two (A B) to diff")
    try:
        opened = open_archives(args.archives)
    except FoundryError as err:
        print(f"foundry-tui: error: {printable(str(err))}", file=sys.stderr)  # the archive's text, escaped
        return EXIT_ERROR
    except OSError as err:
        print(f"foundry-tui: error: {printable(str(err.filename or ''))}: {err.strerror or err}", file=sys.stderr)
        return EXIT_ERROR
    if not (sys.stdout.isatty() and sys.stdin.isatty()):  # it would draw escape codes into a file and wait
        which = "stdout" if not sys.stdout.isatty() else "stdin"
        print(f"foundry-tui: error: {which} is not a terminal: foundry-tui draws on one and reads its keys "
              "(for text, use `foundry archive inspect` or `foundry graph show`)", file=sys.stderr)  # fmt: skip
        return EXIT_ERROR
    app = FoundryApp(*opened)
    app.run()
    return app.return_code or EXIT_OK


if __name__ == "__main__":
    sys.exit(main())

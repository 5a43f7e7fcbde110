"""One error hierarchy for Foundry.

Every error carries what a person needs to act on it (the file, the field, the
node, the kernel, what was expected and what was found), so the CLI and the TUI
render the same fields and scripts can read them from ``--json`` output.
"""

from __future__ import annotations

from typing import Any

from foundry.text import printable


class FoundryError(Exception):
    """Base of every error Foundry raises on purpose."""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        field: str | None = None,
        node: int | None = None,
        kernel: str | None = None,
        expected: Any = None,
        found: Any = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.field = field
        self.node = node
        self.kernel = kernel
        self.expected = expected
        self.found = found

    def __str__(self) -> str:
        where = [str(p) for p in (self.path, self.field) if p]
        if self.node is not None:
            where.append(f"node {self.node}")
        if self.kernel:
            where.append(f"kernel {self.kernel}")
        head = ": ".join(where)
        text = f"{head}: {self.message}" if head else self.message
        facts = [f"{k} {v!r}" for k, v in (("expected", self.expected), ("found", self.found)) if v is not None]
        if facts:
            text += f" ({', '.join(facts)})"
        return printable(text)  # names and fields come from archives: never a terminal's control codes

    def to_dict(self) -> dict[str, Any]:
        """The error as plain data, for ``--json`` output."""
        fields = {
            "error": type(self).__name__,
            "message": self.message,
            "path": self.path,
            "field": self.field,
            "node": self.node,
            "kernel": self.kernel,
            "expected": self.expected,
            "found": self.found,
        }
        return {k: v for k, v in fields.items() if v is not None}


class ArchiveError(FoundryError):
    """An archive is missing, malformed, tampered with, or from an unreadable version."""


class IRError(FoundryError):
    """A graph IR breaks one of its invariants."""


class LintError(FoundryError):
    """A lint request is malformed (an unknown rule or kind, a bad expectation)."""


class BackendError(FoundryError):
    """A backend is missing, broken, or refuses what an archive asks of it."""


class DriverError(FoundryError):
    """A CUDA driver call failed."""


class HookError(FoundryError):
    """The native hook is absent, inactive, or reports a loss of determinism."""


class CaptureError(FoundryError):
    """A SAVE cannot record a step deterministically."""


class DriftError(FoundryError):
    """The live process differs from what the archive recorded; LOAD refuses before any replay."""


class NoGpuError(FoundryError):
    """SAVE or LOAD was asked for where torch has no CUDA GPU (or no CUDA, or is not installed)."""

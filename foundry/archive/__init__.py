"""The on-disk archive: catalog, per-rank sessions, graphs, module blobs, backend state."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from foundry.archive.reader import Archive
from foundry.archive.schema import Environment

if TYPE_CHECKING:
    from foundry.archive.writer import ArchiveWriter

__all__ = ["Archive", "ArchiveWriter", "Environment"]


def __getattr__(name: str) -> Any:
    """``ArchiveWriter`` on first use: the commands that only read archives never import the writer."""
    if name == "ArchiveWriter":
        from foundry.archive.writer import ArchiveWriter

        return ArchiveWriter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""The on-disk archive: catalog, per-rank sessions, graphs, module blobs, backend state."""

from foundry.archive.reader import Archive
from foundry.archive.schema import Environment
from foundry.archive.writer import ArchiveWriter

__all__ = ["Archive", "ArchiveWriter", "Environment"]

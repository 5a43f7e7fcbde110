"""The on-disk archive: catalog, per-rank sessions, graphs, module blobs, JIT caches, backend state."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# where each public name lives; imported on first use, so that importing a module of this
# package (`foundry run` does) does not import all of it
_WHERE = {
    "Archive": "foundry.archive.reader",
    "Environment": "foundry.archive.schema",
    "ArchiveWriter": "foundry.archive.writer",
}

if TYPE_CHECKING:
    from foundry.archive.reader import Archive
    from foundry.archive.schema import Environment
    from foundry.archive.writer import ArchiveWriter

__all__ = ["Archive", "ArchiveWriter", "Environment"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value

"""GPU side of Foundry, by concern: the hook's bindings (``native``), the code a graph
runs (``code``), captured and restored graphs (``graphs``), SAVE and LOAD sessions
(``sessions``) and ``foundry run`` (``launch``); docs/architecture.md has the map.
This package gives programs the session API.

Everything here imports torch and cuda-bindings lazily, inside functions.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# where each public name lives; imported on first use, so that importing a module of this
# package (`foundry run` does) does not import all of it
_WHERE = {
    "Session": "foundry.runtime.sessions.base",
    "LoadSession": "foundry.runtime.sessions.load",
    "open_session": "foundry.runtime.sessions.open",
    "SaveSession": "foundry.runtime.sessions.save",
}

if TYPE_CHECKING:
    from foundry.runtime.sessions.base import Session
    from foundry.runtime.sessions.load import LoadSession
    from foundry.runtime.sessions.open import open_session
    from foundry.runtime.sessions.save import SaveSession

__all__ = ["LoadSession", "SaveSession", "Session", "open_session"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value

"""GPU side of Foundry, by concern: the hook's bindings (``native``), the code a graph
runs (``code``), captured and restored graphs (``graphs``), SAVE and LOAD sessions
(``sessions``) and ``foundry run`` (``launch``); docs/architecture.md has the map.
This package gives programs the session API.

Everything here imports torch and cuda-bindings lazily, inside functions.
"""

from foundry.runtime.sessions.base import Session
from foundry.runtime.sessions.load import LoadSession
from foundry.runtime.sessions.open import open_session
from foundry.runtime.sessions.save import SaveSession

__all__ = ["LoadSession", "SaveSession", "Session", "open_session"]

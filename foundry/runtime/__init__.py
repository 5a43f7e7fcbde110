"""GPU side of Foundry: environment capture, graph capture helpers, SAVE/LOAD sessions.

Everything here imports torch and cuda-bindings lazily, inside functions.
"""

from foundry.runtime.sessions.base import Session
from foundry.runtime.sessions.load import LoadSession
from foundry.runtime.sessions.open import open_session
from foundry.runtime.sessions.save import SaveSession

__all__ = ["LoadSession", "SaveSession", "Session", "open_session"]

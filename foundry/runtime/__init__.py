"""GPU side of Foundry: environment capture, graph capture helpers, SAVE/LOAD sessions.

Everything here imports torch and cuda-bindings lazily, inside functions.
"""

from foundry.runtime.load import LoadSession
from foundry.runtime.save import SaveSession
from foundry.runtime.session import Session, open_session

__all__ = ["LoadSession", "SaveSession", "Session", "open_session"]

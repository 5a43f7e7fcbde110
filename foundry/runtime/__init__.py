"""GPU side of Foundry: environment capture, graph capture helpers, SAVE/LOAD sessions.

Everything here imports torch and cuda-bindings lazily, inside functions.
"""

from foundry.runtime.session import LoadSession, SaveSession, Session, open_session

__all__ = ["LoadSession", "SaveSession", "Session", "open_session"]

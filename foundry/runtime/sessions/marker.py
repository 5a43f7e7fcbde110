"""The file a SAVE or LOAD session writes when a program opens it.

``foundry run`` names the file (``FOUNDRY_SESSION_MARKER``, :data:`foundry.env.SESSION_MARKER`)
and reads it once the program has exited: a LOAD whose program never opened a
session restored nothing, and must not pass for one that did. The marker also
carries a refusal the session already told the user about in one line (no CUDA
GPU), so the launcher adds nothing to it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from foundry.archive.files import atomic_write
from foundry.env import SESSION_MARKER


def note_session(mode: str, *, refused: str | None = None) -> None:
    """Record that this process opened a ``mode`` session (and why it refused, if it did)."""
    path = SESSION_MARKER.read()
    if path is None:  # not started by `foundry run`: nobody asks
        return
    record = {"mode": mode, "pid": os.getpid(), "refused": refused}
    atomic_write(Path(path), json.dumps(record).encode())


def read_marker(path: Path) -> dict[str, Any] | None:
    """What a session wrote at ``path``; None when no session was opened (or the file is unreadable)."""
    try:
        with open(path, "rb") as f:
            record = json.loads(f.read(4096))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None

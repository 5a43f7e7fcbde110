"""Opening the session ``foundry run`` asked for, from its environment."""

from __future__ import annotations

import os
from typing import Any

from foundry.errors import FoundryError
from foundry.runtime.sessions.base import MODES, Session


def open_session(*, device: int = 0, model: dict[str, str] | None = None) -> Session:
    """The session ``foundry run`` asked for (``FOUNDRY_MODE``, ``FOUNDRY_ARCHIVE``,
    ``FOUNDRY_RANK``, ``FOUNDRY_WORLD_SIZE``, ``FOUNDRY_LOAD_WARMUP``, ``FOUNDRY_BUILDER``,
    ``FOUNDRY_BUILD_THREADS``, ``FOUNDRY_INSTANTIATE``, ``FOUNDRY_RELOCATE``, ``FOUNDRY_OVERWRITE``); mode ``off``
    when none. Programs that need more control construct :class:`~foundry.runtime.sessions.save.SaveSession` or
    :class:`~foundry.runtime.sessions.load.LoadSession` themselves."""
    mode = os.environ.get("FOUNDRY_MODE", "off") or "off"
    if mode not in MODES:
        raise FoundryError("unknown mode", field="FOUNDRY_MODE", expected=MODES, found=mode)
    if mode == "off":
        return Session(device=device)
    archive = os.environ.get("FOUNDRY_ARCHIVE")
    if not archive:
        raise FoundryError(f"FOUNDRY_ARCHIVE must name the archive in mode {mode}", field="FOUNDRY_ARCHIVE")
    text = os.environ.get("FOUNDRY_RANK", "0")
    if not text.isdigit():
        raise FoundryError("FOUNDRY_RANK must be a rank number", field="FOUNDRY_RANK", found=text)
    rank = int(text)
    if mode == "save":
        from foundry.runtime.sessions.save import SaveSession

        size = os.environ.get("FOUNDRY_WORLD_SIZE", "1")
        if not size.isdigit() or not 0 <= rank < int(size):
            raise FoundryError("FOUNDRY_WORLD_SIZE must be a number above FOUNDRY_RANK", field="FOUNDRY_WORLD_SIZE",
                               found=size)  # fmt: skip
        overwrite = os.environ.get("FOUNDRY_OVERWRITE") == "1"
        return SaveSession(archive, device=device, rank=rank, world_size=int(size), model=model, overwrite=overwrite)
    from foundry.runtime.sessions.load import LoadSession

    return LoadSession(archive, device=device, rank=rank, **load_options())


def load_options() -> dict[str, Any]:
    """:class:`~foundry.runtime.sessions.load.LoadSession`'s options as ``foundry run`` set them
    (``FOUNDRY_LOAD_WARMUP``, ``FOUNDRY_BUILDER``, ``FOUNDRY_BUILD_THREADS``, ``FOUNDRY_RELOCATE``,
    ``FOUNDRY_INSTANTIATE``)."""
    threads = os.environ.get("FOUNDRY_BUILD_THREADS", "1")
    if not threads.isdigit():
        raise FoundryError("FOUNDRY_BUILD_THREADS must be a number", field="FOUNDRY_BUILD_THREADS", found=threads)
    return {
        "warmup": os.environ.get("FOUNDRY_LOAD_WARMUP", "replay"),
        "builder": os.environ.get("FOUNDRY_BUILDER", "python"),
        "relocate": os.environ.get("FOUNDRY_RELOCATE") == "1",
        "build_threads": int(threads),
        "instantiate": os.environ.get("FOUNDRY_INSTANTIATE", "now"),
    }

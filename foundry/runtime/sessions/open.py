"""Opening the session ``foundry run`` asked for, from its environment
(:class:`foundry.env.RunEnvironment`)."""

from __future__ import annotations

from typing import Any

from foundry.env import ARCHIVE, RANK, WORLD_SIZE, RunEnvironment
from foundry.errors import FoundryError
from foundry.runtime.sessions.base import Session


def open_session(*, device: int = 0, model: dict[str, str] | None = None) -> Session:
    """The session ``foundry run`` asked for (its mode, archive, rank and world size,
    and LOAD's options: see :data:`foundry.env.VARIABLES`); mode ``off`` when none.
    Programs that need more control construct
    :class:`~foundry.runtime.sessions.save.SaveSession` or
    :class:`~foundry.runtime.sessions.load.LoadSession` themselves."""
    run = RunEnvironment.from_env()
    if run.mode == "off":
        return Session(device=device)
    if run.archive is None:
        raise FoundryError(f"{ARCHIVE.name} must name the archive in mode {run.mode}", field=ARCHIVE.name)
    if run.mode == "save":
        from foundry.runtime.sessions.save import SaveSession

        if not run.rank < run.world_size:
            raise FoundryError(f"{WORLD_SIZE.name} must be a number above {RANK.name}", field=WORLD_SIZE.name,
                               found=str(run.world_size))  # fmt: skip
        return SaveSession(run.archive, device=device, rank=run.rank, world_size=run.world_size, model=model,
                           overwrite=run.overwrite)  # fmt: skip
    from foundry.runtime.sessions.load import LoadSession

    return LoadSession(run.archive, device=device, rank=run.rank, **load_options(run))


def load_options(run: RunEnvironment | None = None) -> dict[str, Any]:
    """:class:`~foundry.runtime.sessions.load.LoadSession`'s options as ``foundry run`` set
    them (``run``, default: read from this process's environment)."""
    run = RunEnvironment.from_env() if run is None else run
    return {
        "warmup": run.load_warmup,
        "builder": run.builder,
        "relocate": run.relocate,
        "build_threads": run.build_threads,
        "instantiate": run.instantiate,
    }

"""``foundry run``: start a program with the native hook and a SAVE/LOAD session configured.

The program itself opens the session (:func:`foundry.runtime.session.open_session`);
the launcher sets ``LD_PRELOAD`` and the ``FOUNDRY_*`` variables, and for a LOAD
checks the archive before anything starts, taking the region base and size SAVE used.

A SAVE runs with address-space randomisation off and ``PYTHONHASHSEED=0``:
launchers leave return addresses and heap pointers in the unused bytes of
kernel parameters, and with a fixed layout two SAVEs leave the same ones, so
their fingerprints agree (see :mod:`foundry.runtime.definedness`).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from foundry.archive.reader import Archive
from foundry.errors import DriftError, HookError
from foundry.runtime.hook import LIBRARY, library_path


@dataclass(frozen=True)
class RunConfig:
    mode: str
    archive: Path
    region_base: int | None = None
    region_size: int | None = None
    warmup: str = "replay"
    rank: int = 0
    fixed_layout: bool = True  # SAVE: no address-space randomisation, fixed hash seed


ADDR_NO_RANDOMIZE = 0x0040000


def _no_randomization() -> None:
    """Runs in the child before exec: the new program gets a fixed address-space layout."""
    libc = ctypes.CDLL(None, use_errno=True)
    current = libc.personality(0xFFFFFFFF)
    if current == -1 or libc.personality(current | ADDR_NO_RANDOMIZE) == -1:
        raise OSError(ctypes.get_errno(), "personality(ADDR_NO_RANDOMIZE) failed")


def preexec(config: RunConfig) -> Callable[[], None] | None:
    """What the child runs before exec, or None."""
    return _no_randomization if config.mode == "save" and config.fixed_layout else None


def environment(config: RunConfig, base_env: dict[str, str] | None = None) -> dict[str, str]:
    """The child's environment: the hook preloaded and the session described."""
    env = dict(os.environ if base_env is None else base_env)
    lib = library_path()
    if lib is None:
        raise HookError(f"the native hook ({LIBRARY}) is not built: install the package where CUDA headers exist, "
                        "or run `make -C native`")  # fmt: skip
    base, size = config.region_base, config.region_size
    if config.mode == "load":
        region = Archive.open(config.archive).session(config.rank).region
        if region is None:
            raise DriftError("the archive has no region record (it was not saved with the hook)", field="region")
        if base is not None and base != region.base:
            raise DriftError("LOAD at another region base than SAVE's needs relocation, which this version refuses",
                             field="region.base", expected=hex(region.base), found=hex(base))  # fmt: skip
        base, size = region.base, size or region.size
    preload = [str(lib), *[p for p in env.get("LD_PRELOAD", "").split(":") if p and Path(p).name != LIBRARY]]
    env.update(LD_PRELOAD=":".join(preload), FOUNDRY_MODE=config.mode, FOUNDRY_ARCHIVE=str(config.archive.resolve()),
               FOUNDRY_LOAD_WARMUP=config.warmup, FOUNDRY_RANK=str(config.rank))  # fmt: skip
    if config.mode == "save" and config.fixed_layout:
        env.setdefault("PYTHONHASHSEED", "0")
    if base is not None:
        env["FOUNDRY_REGION_BASE"] = hex(base)
    if size is not None:
        env["FOUNDRY_REGION_SIZE"] = str(size)
    return env

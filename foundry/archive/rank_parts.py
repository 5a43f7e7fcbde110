"""One archive written by several processes, one rank each.

A multi-GPU SAVE has a process per rank. Each seals its own ``rank<N>/`` (graphs,
session) and writes ``rank<N>/part.json``: what the catalog needs from it (its
session's hash, its module images, its environment and model description)
under the SAVE's id, which every rank's process is given. Whichever process
finds every rank's part of this SAVE present writes the catalog, once (an
lock on ``.commit.lock`` serialises the check, and ``.committed.<id>`` records
that it was done), after checking that the parts agree; a part left by an
earlier SAVE in the same directory carries another id and counts as missing, and
an id already committed there is refused up front. The archive exists only from
that moment: a rank that dies leaves no catalog, and readers refuse a directory
without one.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import re
from collections.abc import Iterable
from pathlib import Path

import msgspec

from foundry import __version__
from foundry.archive.files import atomic_write, encode_record
from foundry.archive.reader import decode_typed
from foundry.archive.schema import (
    ARCHIVE_FORMAT,
    CATALOG_FILE,
    Catalog,
    Environment,
    ModuleBlob,
    ModuleIndex,
    ModuleState,
    RankEntry,
    catalog_version,
)
from foundry.env import SAVE_ID
from foundry.errors import ArchiveError

PART_FILE = "part.json"
LOCK_FILE = ".commit.lock"
SAVE_ID_FORM = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class RankPart(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What one rank's process contributes to the catalog."""

    save_id: str
    world_size: int
    rank: RankEntry
    environment: Environment
    modules: tuple[ModuleBlob, ...] = ()
    module_state: ModuleState = ModuleState.ABSENT
    model: dict[str, str] = {}


def check_id_form(save_id: str) -> None:
    if not SAVE_ID_FORM.match(save_id):  # it names files in the archive directory
        raise ArchiveError("a SAVE id is 1-64 of A-Z a-z 0-9 . _ -", field=SAVE_ID.name, found=save_id)


def committed_marker(root: Path, save_id: str) -> Path:
    """The file that says SAVE ``save_id`` wrote ``root``'s catalog."""
    return root / f".committed.{save_id}"


def failed_marker(root: Path, save_id: str) -> Path:
    """The file that says a rank of SAVE ``save_id`` failed (``foundry.runtime.launch.rank_runs``)."""
    return root / f".failed.{save_id}"


def check_save_id(root: Path, save_id: str) -> None:
    """Refuse an id that could leave the archive directory, or that was committed or
    failed there before (``foundry.runtime.launch.rank_runs`` marks a failed one)."""
    check_id_form(save_id)
    for marker, what in ((committed_marker, "was committed here already"), (failed_marker, "failed here before")):
        if marker(root, save_id).exists():
            raise ArchiveError(f"this SAVE id {what}; give the new SAVE a new {SAVE_ID.name}", path=str(root),
                               field=SAVE_ID.name, found=save_id)  # fmt: skip


def read_part(path: Path) -> RankPart:
    return decode_typed(path.read_bytes(), RankPart, path=path)


def write_part(root: Path, part: RankPart) -> None:
    atomic_write(root / f"rank{part.rank.rank}" / PART_FILE, msgspec.json.encode(part))


def commit_when_complete(root: Path, world_size: int, save_id: str) -> bool:
    """Write the catalog if every rank's part of SAVE ``save_id`` is present and no
    other process took the commit; True when this call wrote it."""
    check_id_form(save_id)
    parts = [_part(root / f"rank{r}" / PART_FILE, save_id) for r in range(world_size)]
    if any(part is None for part in parts):
        return False
    marker = committed_marker(root, save_id)
    with open(root / LOCK_FILE, "a") as lock:  # released when this process ends, however it ends
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists():  # another rank's process committed
            return False
        atomic_write(root / CATALOG_FILE, encode_record(_catalog([p for p in parts if p], world_size)))
        atomic_write(marker, b"")
    return True


def _part(path: Path, save_id: str) -> RankPart | None:
    if not path.is_file():
        return None
    part = read_part(path)
    return part if part.save_id == save_id else None  # an earlier SAVE's


def make_catalog(environment: Environment, world_size: int, ranks: tuple[RankEntry, ...], module_state: ModuleState,
                 blobs: Iterable[ModuleBlob], model: dict[str, str]) -> Catalog:  # fmt: skip
    """The catalog of a SAVE whose ranks are all sealed: written now, modules and model
    keys in sorted order."""
    return Catalog(
        format=ARCHIVE_FORMAT,
        format_version=catalog_version(None),
        tool_version=__version__,
        created=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        environment=environment,
        world_size=world_size,
        ranks=ranks,
        modules=ModuleIndex(module_state, tuple(sorted(blobs, key=lambda b: b.sha256))),
        model=dict(sorted(model.items())),
    )


def _catalog(parts: list[RankPart], world_size: int) -> Catalog:
    first = parts[0]
    model: dict[str, str] = {}
    modules: dict[str, ModuleBlob] = {}
    for index, part in enumerate(parts):
        if part.rank.rank != index or part.world_size != world_size:
            raise ArchiveError("a rank's part does not belong to this archive", field=f"rank{index}.part",
                               expected=f"rank {index} of {world_size}",
                               found=f"rank {part.rank.rank} of {part.world_size}")  # fmt: skip
        if part.environment != first.environment:
            raise ArchiveError("ranks saved in different environments", field=f"rank{index}.environment")
        for key, value in part.model.items():
            if model.setdefault(key, value) != value:
                raise ArchiveError("ranks describe the model differently", field=f"model.{key}",
                                   expected=model[key], found=value)  # fmt: skip
        if part.module_state != first.module_state:
            raise ArchiveError("ranks stored their module images differently", field=f"rank{index}.module_state",
                               expected=first.module_state, found=part.module_state)  # fmt: skip
        modules.update((blob.sha256, blob) for blob in part.modules)
    ranks = tuple(part.rank for part in parts)
    return make_catalog(first.environment, world_size, ranks, first.module_state, modules.values(), model)

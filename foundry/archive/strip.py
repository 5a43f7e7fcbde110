"""Make an archive small: drop its module images, warm-up bytes and JIT caches, and say so.

A stripped archive still inspects, lints and diffs; a LOAD refuses it, naming
``modules.state``. Stripping only the JIT caches (``caches_only``) keeps the archive
loadable: its LOADs then compile what the caches held, and nothing of the archive's
host code is left in it (``jit.state`` is ``stripped``, the manifest kept for inspect).

Stripping is atomic: the catalog is its commit point. A rank whose session
changes (its warm-up bytes go) gets the new session under the other of two
names (``session.json``, ``session.stripped.json``), so the old catalog and the
old session stay intact until the new catalog replaces the old one; only then
are files removed. A strip killed at any moment leaves the old archive (its
catalog unchanged) or the stripped one, possibly with files the stripped one no
longer names: running strip again (on either) removes those.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from foundry.archive.files import atomic_write, contained_path, encode_record, read_bounded, sha256_hex
from foundry.archive.jit_manifest import blob_path, read_manifest
from foundry.archive.jit_schema import JitState
from foundry.archive.reader import Archive, decode_typed
from foundry.archive.schema import CATALOG_FILE, ModuleIndex, ModuleState, RankEntry, Session
from foundry.errors import ArchiveError

SESSION_NAMES = ("session.json", "session.stripped.json")


@dataclass
class _Plan:
    """What one strip writes (sessions, then the catalog) and removes afterwards."""

    sessions: list[tuple[Path, bytes]] = field(default_factory=list)
    ranks: list[RankEntry] = field(default_factory=list)
    remove: list[Path] = field(default_factory=list)


def strip(archive: Archive, *, keep_warmup: bool = False, caches_only: bool = False) -> dict[str, int]:
    """Strip ``archive`` in place; returns what was removed (files, bytes)."""
    plan = _Plan(ranks=list(archive.catalog.ranks)) if caches_only else _plan(archive, keep_warmup)
    for path, data in plan.sessions:
        atomic_write(path, data)
    modules = archive.catalog.modules
    if modules.state is ModuleState.COMPLETE and not caches_only:
        modules = ModuleIndex(ModuleState.STRIPPED, modules.blobs)
    jit = archive.catalog.jit
    if jit is not None:  # blobs of a complete or (a killed strip's) stripped manifest
        plan.remove += [blob_path(archive.root, e.sha256) for e in read_manifest(archive.root, jit).entries]
        jit = msgspec.structs.replace(jit, state=JitState.STRIPPED)
    catalog = msgspec.structs.replace(archive.catalog, ranks=tuple(plan.ranks), modules=modules, jit=jit)
    if catalog != archive.catalog:
        atomic_write(archive.root / CATALOG_FILE, encode_record(catalog))  # the commit point
    return _remove(plan.remove)


def _plan(archive: Archive, keep_warmup: bool) -> _Plan:
    plan = _Plan()
    for entry in archive.catalog.ranks:
        session = archive.session(entry.rank)
        session_path = archive.session_path(entry.rank)
        plan.remove += _leftovers(session_path, session)
        region = session.region
        if region is None or region.warmup_bytes is None or keep_warmup:
            plan.ranks.append(entry)
            continue
        plan.remove.append(_rank_file(session_path, region.warmup_bytes.file))
        stripped = msgspec.structs.replace(session, region=msgspec.structs.replace(region, warmup_bytes=None))
        data = encode_record(stripped)
        new_path = session_path.with_name(_other_name(session_path.name))
        plan.sessions.append((new_path, data))
        plan.remove.append(session_path)
        relative = str(Path(entry.session).with_name(new_path.name))
        plan.ranks.append(RankEntry(entry.rank, relative, sha256_hex(data)))
    if archive.catalog.modules.state in (ModuleState.COMPLETE, ModuleState.STRIPPED):  # stripped: a killed strip's
        plan.remove += [archive.root / "modules" / f"{blob.sha256}.bin" for blob in archive.catalog.modules.blobs]
    written = {path for path, _ in plan.sessions}  # a killed strip's new session is written again, not removed
    plan.remove = [path for path in plan.remove if path not in written]
    return plan


def _other_name(name: str) -> str:
    return SESSION_NAMES[1] if name == SESSION_NAMES[0] else SESSION_NAMES[0]


def _rank_file(session_path: Path, relative: str) -> Path:
    return contained_path(session_path.parent, relative, field="region.warmup_bytes.file", source=session_path)


def _leftovers(session_path: Path, session: Session) -> list[Path]:
    """What a strip killed after its commit left beside ``session``: the session it
    replaced, and that session's warm-up bytes when the current one does not keep them."""
    old = session_path.with_name(_other_name(session_path.name))
    if not old.is_file() or old.is_symlink():
        return []
    kept = session.region.warmup_bytes.file if session.region and session.region.warmup_bytes else None
    found = []
    try:
        replaced = decode_typed(read_bounded(old, 64 << 20, what="replaced session"), Session, path=old)
        warm = replaced.region.warmup_bytes if replaced.region else None
        if warm is not None and warm.file != kept:
            found.append(_rank_file(old, warm.file))
    except ArchiveError:  # unreadable: nothing of it is kept
        pass
    return [*found, old]  # the session last: until it goes, the next strip can still find its warm-up bytes


def _remove(paths: list[Path]) -> dict[str, int]:
    removed = {"files": 0, "bytes": 0}
    for path in dict.fromkeys(paths):  # content-addressed blobs may be named twice
        if path.is_file() and not path.is_symlink():
            removed["files"] += 1
            removed["bytes"] += path.stat().st_size
            path.unlink()
    return removed

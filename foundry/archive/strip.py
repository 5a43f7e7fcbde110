"""Make an archive small: drop its module images and warm-up bytes, and say so.

A stripped archive still inspects, lints and diffs; a LOAD refuses it, naming
``modules.state``. The catalog is rewritten last, so an interrupted strip leaves
either the old archive's catalog (now pointing at missing blobs, which every
reader reports) or the new one.
"""

from __future__ import annotations

import msgspec

from foundry.archive.files import atomic_write, contained_path, encode_record, sha256_hex
from foundry.archive.reader import Archive
from foundry.archive.schema import CATALOG_FILE, ModuleIndex, ModuleState, RankEntry


def strip(archive: Archive, *, keep_warmup: bool = False) -> dict[str, int]:
    """Strip ``archive`` in place; returns what was removed (files, bytes)."""
    removed = {"files": 0, "bytes": 0}

    def drop(path) -> None:
        if path.is_file() and not path.is_symlink():
            removed["files"] += 1
            removed["bytes"] += path.stat().st_size
            path.unlink()

    ranks = []
    for entry in archive.catalog.ranks:
        session = archive.session(entry.rank)
        region = session.region
        if region is not None and region.warmup_bytes is not None and not keep_warmup:
            session_path = archive.session_path(entry.rank)
            drop(contained_path(session_path.parent, region.warmup_bytes.file, field="region.warmup_bytes.file",
                                source=session_path))  # fmt: skip
            session = msgspec.structs.replace(session, region=msgspec.structs.replace(region, warmup_bytes=None))
        data = encode_record(session)
        atomic_write(archive.session_path(entry.rank), data)
        ranks.append(RankEntry(entry.rank, entry.session, sha256_hex(data)))
    modules = archive.catalog.modules
    if modules.state is ModuleState.COMPLETE:
        for blob in modules.blobs:
            drop(archive.root / "modules" / f"{blob.sha256}.bin")
        modules = ModuleIndex(ModuleState.STRIPPED, modules.blobs)
    catalog = msgspec.structs.replace(archive.catalog, ranks=tuple(ranks), modules=modules)
    atomic_write(archive.root / CATALOG_FILE, encode_record(catalog))
    return removed

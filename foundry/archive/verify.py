"""The files ``foundry archive verify`` checks besides the graphs: module images (when the
archive keeps them), each rank's warm-up bytes and the JIT caches' files, against the
sha256 and size their records give, read in pieces so memory stays flat however large
they are (a cache file marked as data is also checked not to be host code by content).
Their paths were checked to stay inside the archive when the catalog, sessions and
manifest were read."""

from __future__ import annotations

from dataclasses import dataclass

from foundry.archive.jit_manifest import check_blob, read_manifest
from foundry.archive.jit_schema import JitState
from foundry.archive.reader import Archive
from foundry.archive.schema import ModuleState


@dataclass
class FilesChecked:
    """How many files of each kind matched their records."""

    modules: int = 0
    warmup: int = 0
    jit: int = 0  # JIT cache files


def check_files(archive: Archive) -> FilesChecked:
    """Check every module image and warm-up file the archive names; raise ArchiveError on the first that
    is missing, of another size or sha256, or not a regular file."""
    checked = FilesChecked()
    if archive.catalog.modules.state is ModuleState.COMPLETE:
        for blob in archive.catalog.modules.blobs:
            archive.check_module(blob.sha256, blob.size)
            checked.modules += 1
    for rank in archive.ranks:
        region = archive.session(rank).region
        warm = region.warmup_bytes if region is not None else None
        if warm is not None:
            archive.check_rank_blob(rank, warm.file, sha256=warm.sha256, size=warm.size, what="warm-up bytes")
            checked.warmup += 1
    jit = archive.catalog.jit
    manifest = None if jit is None else read_manifest(archive.root, jit)  # checked stripped or not
    if jit is not None and manifest is not None and jit.state is JitState.COMPLETE:
        for entry in manifest.entries:
            check_blob(archive.root, entry)
            checked.jit += 1
    return checked

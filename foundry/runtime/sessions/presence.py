"""What a LOAD needs present in the archive, known without reading it: its module images,
and any file at its recorded size.

``foundry run`` checks this before the program starts (``launch/precheck.py``, whose imports
stay few: this module imports only the archive's), and the LOAD again when its session opens,
before it hashes the images on a thread (``validate.start_module_check``).
"""

from __future__ import annotations

import os
from pathlib import Path

from foundry.archive.reader import Archive
from foundry.archive.schema import ModuleState
from foundry.errors import ArchiveError, DriftError

WHY_NOT_COMPLETE = {
    ModuleState.STRIPPED: "were stripped (foundry archive strip)",
    ModuleState.ABSENT: "were not recorded (it was not saved with the hook)",
}


def check_modules_present(archive: Archive) -> None:
    """The archive holds its module images (not stripped), each one's file there at its recorded
    size: what can be known without reading them (``foundry run`` checks it before the program
    starts, the LOAD again when its session opens)."""
    modules = archive.catalog.modules
    if modules.state is not ModuleState.COMPLETE:
        why = WHY_NOT_COMPLETE.get(modules.state, modules.state.value)
        raise DriftError(f"the archive's module images {why}: it inspects, lints and diffs, but a LOAD needs them all",
                         path=str(archive.root), field="modules.state", expected=ModuleState.COMPLETE.value,
                         found=modules.state.value)  # fmt: skip
    for blob in modules.blobs:
        check_file_size(archive.root / "modules" / f"{blob.sha256}.bin", blob.size, f"module image {blob.sha256[:12]}",
                        error=DriftError, field=f"modules/{blob.sha256}.bin")  # fmt: skip


def check_file_size(path: Path, size: int, what: str, *, error: type[ArchiveError | DriftError] = ArchiveError,
                    field: str | None = None) -> None:  # fmt: skip
    """``path`` is there at ``size`` bytes, else ``error`` naming ``what`` (and ``field``)."""
    try:
        found = os.stat(path).st_size
    except FileNotFoundError:
        raise error(f"the archive is incomplete: {what} is missing", path=str(path), field=field) from None
    if found != size:
        raise error(f"the archive is incomplete or damaged: {what} has another size than recorded", path=str(path),
                    field=field or "size", expected=size, found=found)  # fmt: skip

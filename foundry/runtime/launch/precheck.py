"""What ``foundry run --mode load`` checks before it starts the program.

A LOAD that fails inside the program fails after the program has spent its
start-up (imports, weights) and as the program's own traceback. Whatever can be
known without a GPU is checked here first, and refused in one line: the archive
opens (catalog and the rank's session, their format versions and hashes), it is
complete (module images recorded and present, every file the session lists
present at its recorded size), it holds a region record (and the warm-ups' bytes
for a LOAD that restores them), the backends it needs
are installed and able to restore it, and the environment agrees where it can
be read without CUDA (the driver's version where the system shows it; torch's
version when the program runs in the launcher's own Python environment). The
LOAD itself checks all of it again, hashes included, and the rest on the GPU.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path

from foundry.archive.named import open_named
from foundry.archive.reader import Archive
from foundry.errors import ArchiveError, DriftError
from foundry.runtime.sessions.presence import check_file_size, check_modules_present

ENV_FIELD = "environment.{}"


def check_load(archive_path: Path, rank: int, command: list[str], warmup: str = "replay") -> Archive:
    """Refuse (:class:`ArchiveError`, :class:`DriftError`) a LOAD of ``rank`` that cannot work
    (``warmup``: the LOAD's warm-up mode); the opened archive otherwise."""
    archive = open_named(archive_path)
    if rank not in archive.ranks:
        raise ArchiveError(f"archive has no rank {rank} (--rank)", path=str(archive.root), field="ranks",
                           expected=archive.ranks, found=rank)  # fmt: skip
    session = archive.session(rank)
    if session.region is None:
        raise DriftError("the archive has no region record (it was not saved with the hook)", field="region")
    check_modules_present(archive)
    _check_files(archive, rank)
    if warmup == "restore":  # after the archive's completeness: an engine would start, then refuse from inside it
        from foundry.runtime.sessions.validate import check_warmup_restorable

        check_warmup_restorable(session.region, archive.catalog.model)
    if session.backends:  # discovering them reads every installed distribution's entry points: only when needed
        from foundry.backends.registry import BackendRegistry
        from foundry.runtime.sessions.validate import required_backends

        required_backends(session, BackendRegistry.discover())
    _check_environment(archive, command)
    return archive


def _check_files(archive: Archive, rank: int) -> None:
    """Every file the rank's session lists is there, at its recorded size."""
    session = archive.session(rank)
    for entry in session.graphs:
        check_file_size(archive.graph_path(rank, entry), entry.size, f"graph {entry.name!r}")
        if entry.plan is not None:
            check_file_size(archive.session_path(rank).parent / entry.plan.file, entry.plan.size,
                            f"launch plan of {entry.name!r}")  # fmt: skip
    warm = session.region.warmup_bytes if session.region is not None else None
    if warm is not None:
        check_file_size(archive.session_path(rank).parent / warm.file, warm.size, "warm-up bytes")


def _check_environment(archive: Archive, command: list[str]) -> None:
    """The fields a LOAD compares that can be read here without CUDA."""
    from foundry.runtime.sessions.environment import driver_version

    recorded = archive.catalog.environment
    live = driver_version()
    if live != "unknown" and live != recorded.driver_version:
        raise DriftError("the archive was saved with another NVIDIA driver", field=ENV_FIELD.format("driver_version"),
                         expected=recorded.driver_version, found=live)  # fmt: skip
    if recorded.torch_version and _runs_here(command):
        torch = installed_torch()
        if torch is not None and torch != recorded.torch_version:
            raise DriftError("the archive was saved with another torch (the one installed with Foundry here)",
                             field=ENV_FIELD.format("torch_version"), expected=recorded.torch_version,
                             found=torch)  # fmt: skip


def installed_torch() -> str | None:
    """The version torch says of itself (``torch.__version__``, which SAVE records), read from
    ``torch/version.py`` without importing torch; None when torch is not installed. Its
    distribution's metadata is no substitute: a CUDA build's may leave out the local part
    (``2.11.0`` for ``2.11.0+cu130``, seen on the H200 test machine)."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    for location in spec.submodule_search_locations or []:
        try:
            text = (Path(location) / "version.py").read_text()
        except OSError:
            continue
        found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
        if found:
            return found.group(1)
    from importlib import metadata  # only here: importing it cost the launcher 25 ms on the H200 test machine

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def _runs_here(command: list[str]) -> bool:
    """Whether the program runs in the launcher's Python environment (its interpreter from the
    same directory), so what is installed here is what it imports."""
    found = shutil.which(command[0]) if command else None
    return found is not None and Path(found).absolute().parent == Path(sys.executable).absolute().parent

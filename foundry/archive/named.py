"""Archives named on a command line: a directory, or ``@sample`` for the one shipped in the package.

Every command that reads an archive opens it through :func:`open_named`, so ``@sample``
works wherever an archive is read, and a directory that holds no archive is called
what it is rather than reported as a missing file. Commands that change an archive
(``strip``, a SAVE) take it through :func:`writable_path`, which refuses the sample.
"""

from __future__ import annotations

import os
from pathlib import Path

from foundry.archive.files import DEFAULT_LIMITS, Limits
from foundry.archive.reader import Archive
from foundry.archive.sample import SAMPLE_NAME, resolve_archive_arg, sample_path
from foundry.archive.schema import CATALOG_FILE
from foundry.errors import ArchiveError


def archive_path(text: str | Path) -> Path:
    """The directory an archive argument names (``@sample``: the bundled sample's)."""
    return resolve_archive_arg(str(text))


def check_is_archive(path: Path) -> None:
    """Refuse a directory that holds no catalog, before any file in it is read."""
    if path.is_dir() and not os.path.lexists(path / CATALOG_FILE):
        raise ArchiveError(f"not a Foundry archive: no {CATALOG_FILE} in it", path=str(path))


def open_named(text: str | Path, *, limits: Limits = DEFAULT_LIMITS) -> Archive:
    """Open the archive an argument names; :class:`ArchiveError` for anything that is not one."""
    path = archive_path(text)
    check_is_archive(path)
    return Archive.open(path, limits=limits)


def writable_path(text: str | Path, what: str) -> Path:
    """The directory a command that changes an archive works on; the sample is refused
    (it belongs to the installed package)."""
    if str(text) == SAMPLE_NAME:
        raise ArchiveError(f"{what} would change the sample shipped in the package; copy it first "
                           f"(cp -r {sample_path()} DIR) and name the copy", path=SAMPLE_NAME)  # fmt: skip
    return Path(text)

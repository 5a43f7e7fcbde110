"""An archive's JIT caches installed into a directory of their own, safely.

- **One directory per archive and trust level**, never the user's caches:
  ``<root>/<cache_id>`` holds every entry (host code included: a LOAD that trusts the
  archive's code), ``<root>/<cache_id>-data`` only the entries that are not host code.
  A LOAD that did not opt in therefore never sees host code from the archive, even one
  an earlier, trusting LOAD installed.
- **Several LOADs at once**: installers take a lock per directory (``<dir>.lock``,
  ``flock``), and each file appears whole (written beside its place, checked, then
  linked in: never replacing a file already there). The index (``.foundry-jit.json``,
  the manifest's digest) is written last, so a later LOAD finds a complete install
  and checks nothing more, and an install killed midway is finished by the next.
- **A file already in place that differs** from the archive's is kept and named
  (:attr:`InstallReport.kept`): the engine wrote it (caches the driver updates, a
  kernel compiled anew); the archive never overwrites a file.
- **The empty files a library makes beside builds it finds** (FlashInfer's lock per
  module and its log, :func:`~foundry.archive.jit_caches.made_on_first_use`) are laid
  down with the entries, so a program that compiles nothing adds no file to the
  directory (:func:`changed_since_install` counts them as installed while empty).
- **Free disk space** is checked first; a failed install removes what it wrote.
- **Every file is checked while it is copied**: its size before a byte is read, its
  sha256 as it streams, and its first bytes, so a file marked as data that is host
  code by content is refused.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from foundry.archive.files import MiB, atomic_write, encode_record, iter_bounded, read_bounded
from foundry.archive.jit_caches import SNIFF_BYTES, SPECS, is_host_code, made_on_first_use
from foundry.archive.jit_manifest import DEFAULT_JIT_LIMITS, JitLimits, blob_path, group_to_absolute
from foundry.archive.jit_schema import Form, JitEntry, JitManifest
from foundry.archive.reader import decode_typed
from foundry.errors import ArchiveError, FoundryError

INDEX_FILE = ".foundry-jit.json"
INSTALL_FORMAT = "foundry-jit-installed"
SPACE_MARGIN = 64 * MiB  # left free beyond what the install writes


class InstallIndex(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``<dir>/.foundry-jit.json``: which manifest the directory holds, written last."""

    format: str
    manifest_sha256: str
    host_code: bool
    files: int


@dataclass
class InstallReport:
    """What one install did."""

    directory: Path
    reused: bool = False  # the directory held this manifest's files already (its index said so)
    installed: int = 0  # files written
    present: int = 0  # files already there, the same
    kept: list[str] = field(default_factory=list)  # files already there, different, kept ("cache/path")
    left_out: int = 0  # host-code entries, not trusted
    placed: int = 0  # empty files made where a library would make them on first use
    bytes: int = 0


def install_directory(root: Path, cache_id: str, *, trust_host_code: bool) -> Path:
    """The directory one archive's caches go to, per trust level."""
    return root / (cache_id if trust_host_code else f"{cache_id}-data")


def install(archive_root: Path, manifest: JitManifest, manifest_sha256: str, directory: Path, *,
            trust_host_code: bool, limits: JitLimits = DEFAULT_JIT_LIMITS) -> InstallReport:  # fmt: skip
    """Install the manifest's entries (host code only when trusted) from the archive at
    ``archive_root`` into ``directory``."""
    report = InstallReport(directory)
    wanted = [e for e in manifest.entries if trust_host_code or not e.host_code]
    report.left_out = len(manifest.entries) - len(wanted)
    directory.mkdir(parents=True, exist_ok=True)
    with _locked(directory):
        if _index_matches(directory, manifest_sha256, trust_host_code):
            report.reused = True
            return report
        (directory / INDEX_FILE).unlink(missing_ok=True)
        _check_space(directory, wanted)
        written: list[Path] = []
        made: list[Path] = []
        try:
            for entry in wanted:
                _install_one(archive_root, entry, directory, limits, report, written, made)
            for target in sorted(_first_use_targets(directory, wanted)):
                _place_empty(target, directory, report, written, made)
            for folder in {p.parent for p in written}:
                _fsync_dir(folder)
        except BaseException:
            for path in reversed(written):
                path.unlink(missing_ok=True)
            for folder in reversed(made):
                with suppress(OSError):  # not empty: another process's files
                    folder.rmdir()
            raise
        index = InstallIndex(INSTALL_FORMAT, manifest_sha256, trust_host_code, len(wanted))
        atomic_write(directory / INDEX_FILE, encode_record(index))  # last: the install is complete
    return report


def reindex(directory: Path, manifest_sha256: str, *, trust_host_code: bool, files: int) -> None:
    """Record that ``directory`` holds the manifest with this digest (a SAVE's own install,
    once its archive's manifest is final), under the directory's lock."""
    with _locked(directory):
        index = InstallIndex(INSTALL_FORMAT, manifest_sha256, trust_host_code, files)
        atomic_write(directory / INDEX_FILE, encode_record(index))


def changed_since_install(directory: Path, manifest: JitManifest, *, trust_host_code: bool) -> list[str]:
    """The files below an install ``directory`` that are not the archive's as installed
    ("cache/path", sorted): ones a program created there, and entries it rewrote (another
    size, or a modification time other than the entry's, which the install restores). A
    program that compiled nothing leaves none."""
    wanted = [e for e in manifest.entries if trust_host_code or not e.host_code]
    entries = {_target(directory, e): e for e in wanted}
    placed = _first_use_targets(directory, wanted)
    changed = []
    for folder, _, names in os.walk(directory):  # links not followed: a link is a file here
        paths = [Path(folder, name) for name in names]
        changed += [p for p in paths if p != directory / INDEX_FILE and _changed(p, entries.get(p), p in placed)]
    return sorted(p.relative_to(directory).as_posix() for p in changed)


def _changed(path: Path, entry: JitEntry | None, placed: bool) -> bool:
    info = path.lstat()
    if placed:  # laid down empty; FlashInfer reopens its lock with truncation at every load
        return not stat.S_ISREG(info.st_mode) or info.st_size != 0
    if entry is None:
        return True
    resized = entry.form is Form.FILE and info.st_size != entry.size  # a group file is rewritten at install
    return resized or info.st_mtime_ns != entry.mtime_ns


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """The directory's lock (a file beside it), held while installing."""
    lock = directory.parent / f"{directory.name}.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _index_matches(directory: Path, manifest_sha256: str, trust_host_code: bool) -> bool:
    path = directory / INDEX_FILE
    if not path.exists():
        return False
    try:
        index = decode_typed(read_bounded(path, 1 * MiB, what="JIT install index"), InstallIndex, path=path)
    except ArchiveError:  # damaged: installed again, files already there compared
        return False
    return (
        index.format == INSTALL_FORMAT
        and index.manifest_sha256 == manifest_sha256
        and (index.host_code == trust_host_code)
    )


def _check_space(directory: Path, entries: list[JitEntry]) -> None:
    needed = sum(e.size for e in entries if not _target(directory, e).exists())
    info = os.statvfs(directory)
    free = info.f_bavail * info.f_frsize
    if needed + SPACE_MARGIN > free:
        raise FoundryError("not enough free disk space for the archive's JIT caches", path=str(directory),
                           expected=f">= {needed + SPACE_MARGIN} bytes free", found=f"{free} bytes")  # fmt: skip


def _target(directory: Path, entry: JitEntry) -> Path:
    spec = SPECS[entry.cache]
    return spec.root(directory / entry.cache.value).joinpath(*entry.path.split("/"))


def _cache_root(directory: Path, entry: JitEntry) -> Path:
    return SPECS[entry.cache].root(directory / entry.cache.value)


def _make_parents(folder: Path, directory: Path, made: list[Path]) -> None:
    """Create ``folder`` and its missing parents below ``directory``, refusing any that
    exists as something other than a directory (a link could lead outside)."""
    missing = []
    current = folder
    while current != directory:
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            missing.append(current)
            current = current.parent
            continue
        if not stat.S_ISDIR(info.st_mode):
            raise FoundryError("a cache directory is not a plain directory", path=str(current))
        break
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o755)
            made.append(path)
        except FileExistsError:  # another process made it meanwhile
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                raise FoundryError("a cache directory is not a plain directory", path=str(path)) from None


def _first_use_targets(directory: Path, entries: list[JitEntry]) -> set[Path]:
    """Where the empty files the entries' libraries make on first use go."""
    targets: set[Path] = set()
    for cache in {e.cache for e in entries}:
        spec = SPECS[cache]
        made = made_on_first_use(spec, [e.path for e in entries if e.cache is cache])
        targets |= {spec.root(directory / cache.value).joinpath(*path.split("/")) for path in made}
    return targets


def _place_empty(target: Path, directory: Path, report: InstallReport, written: list[Path],
                 made: list[Path]) -> None:  # fmt: skip
    """An empty file at ``target``, unless one is there (the library's, or another installer's)."""
    _make_parents(target.parent, directory, made)
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except FileExistsError:
        return
    os.close(fd)
    written.append(target)
    report.placed += 1


def _install_one(archive_root: Path, entry: JitEntry, directory: Path, limits: JitLimits, report: InstallReport,
                 written: list[Path], made: list[Path]) -> None:  # fmt: skip
    target = _target(directory, entry)
    _make_parents(target.parent, directory, made)
    if entry.form is Form.FILE and os.path.lexists(target):  # compared without copying
        _compare_existing(target, entry, None, report)
        return
    source = blob_path(archive_root, entry.sha256)
    what = f"JIT cache file {entry.cache}/{entry.path}"
    tmp = target.parent / f".{target.name[:100]}.foundry-{os.getpid()}-{secrets.token_hex(4)}.tmp"
    try:
        data = _copy_checked(source, tmp, entry, limits, what, _cache_root(directory, entry))
        try:
            os.link(tmp, target)  # never replaces a file already in place
        except FileExistsError:
            _compare_existing(target, entry, data, report)
            return
    finally:
        tmp.unlink(missing_ok=True)
    written.append(target)
    report.installed += 1
    report.bytes += entry.size


def _copy_checked(source: Path, tmp: Path, entry: JitEntry, limits: JitLimits, what: str,
                  cache_root: Path) -> bytes | None:  # fmt: skip
    """Copy the blob to ``tmp`` checking size, sha256 and content; the bytes written when they
    differ from the blob's (a Triton group file made absolute), else None."""
    digest = hashlib.sha256()
    head = b""
    rendered: bytes | None = None
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        group = [] if entry.form is Form.TRITON_GROUP else None
        if group is not None and entry.size > limits.group:
            raise ArchiveError("a Triton group file is larger than the reader accepts", path=str(source),
                               field="size", expected=f"<= {limits.group}", found=entry.size)  # fmt: skip
        for chunk in iter_bounded(source, limits.file, what=what, size=entry.size):
            digest.update(chunk)
            if len(head) < SNIFF_BYTES:
                head += chunk[: SNIFF_BYTES - len(head)]
            if group is not None:
                group.append(chunk)
            else:
                _write_all(fd, chunk)
        if digest.hexdigest() != entry.sha256:
            raise ArchiveError(f"{what} does not match its sha256 (altered or damaged)", path=str(source),
                               field="sha256", expected=entry.sha256, found=digest.hexdigest())  # fmt: skip
        if not entry.host_code and is_host_code(SPECS[entry.cache], entry.path, head):
            raise ArchiveError(f"{what} is marked as data but is host code", path=str(source), field="host_code",
                               found=f"{entry.cache}/{entry.path}")  # fmt: skip
        if group is not None:
            rendered = group_to_absolute(b"".join(group), cache_root, limits=limits, source=str(source))
            _write_all(fd, rendered)
        os.fchmod(fd, entry.mode & 0o755)
        os.utime(fd, ns=(entry.mtime_ns, entry.mtime_ns))  # ninja compares it with its log
        os.fsync(fd)
    finally:
        os.close(fd)
    return rendered


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _compare_existing(target: Path, entry: JitEntry, rendered: bytes | None, report: InstallReport) -> None:
    """A file already at ``target``: the same as the archive's, or kept and named."""
    name = f"{entry.cache}/{entry.path}"
    try:
        info = os.lstat(target)
        if not stat.S_ISREG(info.st_mode):
            report.kept.append(name)
            return
        if rendered is not None:
            same = read_bounded(target, len(rendered), what=name) == rendered
        else:
            digest = hashlib.sha256()
            for chunk in iter_bounded(target, entry.size, what=name, size=entry.size):
                digest.update(chunk)
            same = digest.hexdigest() == entry.sha256
    except ArchiveError:  # another size, unreadable, a link: not the archive's
        same = False
    if same:
        report.present += 1
    else:
        report.kept.append(name)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

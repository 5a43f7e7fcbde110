"""Safe file handling for archives: atomic writes, bounded reads, contained paths."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import msgspec

from foundry.errors import ArchiveError

MiB = 1 << 20
GiB = 1 << 30


class Limits(msgspec.Struct, frozen=True):
    """Largest file a reader accepts, per kind; larger ones are refused unread. Launch
    plans are held to the graph limit (a plan is its graph packed). ``sessions`` bounds
    the sessions of all ranks together (a reader keeps the ones it has read)."""

    catalog: int = 16 * MiB
    session: int = 64 * MiB  # real sessions: 0.3 MiB (a few graphs, 1,700 device globals)
    sessions: int = 64 * MiB  # 4x 8 ranks of vLLM's 2,000 graphs (about 1 KiB of session each)
    graph: int = 32 * MiB  # 4x a graph of 7,000 nodes of 1.1-1.2 KiB: see foundry.graphir.limits
    module: int = 2 * GiB
    warmup: int = 256 * GiB  # region bytes: read by LOAD only, hashed in pieces by verify


DEFAULT_LIMITS = Limits()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_encode = msgspec.json.Encoder().encode


def encode_record(record: msgspec.Struct) -> bytes:
    """Canonical JSON of a catalog or session record, newline-terminated."""
    return msgspec.json.format(_encode(record), indent=1) + b"\n"


def atomic_write(path: Path, data: bytes, *, swept: bool = False, sync_dir: bool = True) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never a part.

    The temporary file is named after the writing host and process
    (``.<name>.<host>.<pid>.<random>.tmp``), so a later write of the same file
    removes what a killed writer left (:func:`remove_stale_temporaries`; ``swept``: the
    caller has swept the directory already). ``sync_dir=False`` leaves the rename's
    durability to the caller (:class:`DirectoryWriter` syncs the directory once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not swept:
        remove_stale_temporaries(path)
    import tempfile  # only here: the launcher, which writes nothing, does without it

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{_HOST}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; archives are shared like other files
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if sync_dir:
        _fsync_dir(path.parent)


class DirectoryWriter:
    """Atomic writes of many files into one directory (an archive's graphs, plans, module
    images): what killed writers left is swept once, at the first write, and the directory
    is synced once, by :meth:`sync`, before anything that names the files is written;
    per file, both would make writing n files take n² directory reads. ``shared``: a
    directory other processes write into at once (a SAVE's ranks share the module images):
    each write sweeps its own file's temporaries only, as :func:`atomic_write` does."""

    def __init__(self, directory: Path, *, shared: bool = False) -> None:
        self.directory = directory
        self.shared = shared  # other processes write here too (module images): sweep per file, as before
        self._swept = False
        self._unsynced = False

    def write(self, name: str, data: bytes) -> None:
        if not self._swept and not self.shared:
            remove_stale_temporaries(self.directory / name, any_name=True)
            self._swept = True
        atomic_write(self.directory / name, data, swept=not self.shared, sync_dir=False)
        self._unsynced = True

    def sync(self) -> None:
        """Make the renames durable (the files' bytes are, as each was written)."""
        if self._unsynced:
            _fsync_dir(self.directory)
            self._unsynced = False


_HOST = re.sub(r"[^A-Za-z0-9-]", "-", os.uname().nodename)[:64] or "host"
_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.(?P<host>[A-Za-z0-9-]+)\.(?P<pid>[0-9]+)\.[^.]+\.tmp$")


def remove_stale_temporaries(path: Path, *, any_name: bool = False) -> list[Path]:
    """Remove the temporary files of ``path`` (``any_name``: of every file in its directory)
    that writers on this host left when they were killed (their process is gone); another
    live writer's are kept. Returns them."""
    removed = []
    try:
        entries = list(os.scandir(path.parent))
    except FileNotFoundError:
        return removed
    for entry in entries:
        found = _TEMPORARY.match(entry.name)
        if found is None or (found["name"] != path.name and not any_name):
            continue
        if found["host"] != _HOST or _alive(int(found["pid"])):
            continue
        Path(entry.path).unlink(missing_ok=True)
        removed.append(Path(entry.path))
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_bounded(path: Path, limit: int, *, what: str, size: int | None = None) -> bytes:
    """Read a regular file of at most ``limit`` bytes; refuse links, devices, FIFOs.
    With ``size`` (what the archive records), a file of another size is refused unread.

    The checks are made on the open descriptor, not on the name: a name checked
    first and opened after can be swapped in between (a FIFO would block the
    reader forever). The file is opened without following a link and without
    blocking, then examined with ``fstat``."""
    fd = _open_regular(path, what=what)
    try:
        length = _checked_size(fd, path, limit, what=what, size=size)
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(length + 1)
    except OSError as err:
        raise ArchiveError(f"{what} cannot be read: {err.strerror}", path=str(path)) from None
    finally:
        os.close(fd)
    if len(data) != length:
        raise ArchiveError(f"{what} changed size while being read", path=str(path), expected=length, found=len(data))
    return data


def hash_bounded(path: Path, limit: int, *, what: str, size: int | None = None) -> str:
    """The sha256 of a file checked as :func:`read_bounded` checks it, read in 1 MiB
    pieces: memory does not grow with the file (module images, warm-up bytes)."""
    fd = _open_regular(path, what=what)
    digest = hashlib.sha256()
    try:
        length = _checked_size(fd, path, limit, what=what, size=size)
        read = 0
        while chunk := os.read(fd, MiB):
            read += len(chunk)
            digest.update(chunk)
    except OSError as err:
        raise ArchiveError(f"{what} cannot be read: {err.strerror}", path=str(path)) from None
    finally:
        os.close(fd)
    if read != length:
        raise ArchiveError(f"{what} changed size while being read", path=str(path), expected=length, found=read)
    return digest.hexdigest()


def _checked_size(fd: int, path: Path, limit: int, *, what: str, size: int | None) -> int:
    """The size of the regular file open at ``fd``: within ``limit``, and ``size`` when one is recorded."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise ArchiveError(f"{what} is not a regular file", path=str(path))
    if max(info.st_size, size or 0) > limit:
        raise ArchiveError(f"{what} is larger than the reader accepts", path=str(path), field="size",
                           expected=f"<= {limit} bytes", found=f"{max(info.st_size, size or 0)} bytes")  # fmt: skip
    if size is not None and info.st_size != size:
        raise ArchiveError(f"{what} is not the size its record says", path=str(path), field="size", expected=size,
                           found=info.st_size)  # fmt: skip
    return info.st_size


def _open_regular(path: Path, *, what: str) -> int:
    """A read-only descriptor of ``path`` itself: never a link's target, never a blocking open."""
    try:
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ArchiveError(f"{what} is missing", path=str(path)) from None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise ArchiveError(f"{what} is a symbolic link; archives hold plain files only", path=str(path)) from None
        raise ArchiveError(f"{what} cannot be read: {err.strerror}", path=str(path)) from None


def contained_path(root: Path, relative: str, *, field: str, source: Path,
                   resolved: dict[Path, Path] | None = None) -> Path:  # fmt: skip
    """``root / relative`` for a relative POSIX path that stays inside ``root``, links followed.
    ``resolved``: directories already resolved, for a caller checking many paths in a few
    directories (a session's 2,000 graphs are in one): each file then costs one ``lstat``."""
    pure = PurePosixPath(relative)
    bad = (
        not relative
        or "\x00" in relative
        or "\\" in relative
        or pure.is_absolute()
        or any(part in ("..", "") for part in relative.split("/"))
    )
    if bad:
        raise ArchiveError(
            "path must be relative and stay inside the archive", path=str(source), field=field, found=relative
        )
    path = root.joinpath(*pure.parts)
    memo = {} if resolved is None else resolved
    try:
        target = path.resolve() if _maybe_link(path) else _resolved(path.parent, memo) / path.name
        target.relative_to(_resolved(root, memo))
    except ValueError:
        raise ArchiveError("path leaves the archive", path=str(source), field=field, found=relative) from None
    except (RuntimeError, OSError) as err:  # a loop of links, a name too long for the file system
        raise ArchiveError(f"path cannot be followed: {err}", path=str(source), field=field, found=relative) from None
    return path


def _maybe_link(path: Path) -> bool:
    """Whether ``path`` must be resolved whole: a link, or a name ``lstat`` cannot read (resolving
    it then decides, as it did for every path)."""
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False
    except OSError:
        return True


def _resolved(directory: Path, memo: dict[Path, Path]) -> Path:
    if directory not in memo:
        memo[directory] = directory.resolve()
    return memo[directory]


def iter_bounded(path: Path, limit: int, *, what: str, size: int | None = None) -> Iterator[bytes]:
    """The bytes of a file checked as :func:`read_bounded` checks it, in pieces of at most
    1 MiB (memory does not grow with the file); a file that changes size while it is
    read is refused after its last piece."""
    fd = _open_regular(path, what=what)
    try:
        length = _checked_size(fd, path, limit, what=what, size=size)
        read = 0
        while True:
            try:
                chunk = os.read(fd, MiB)
            except OSError as err:
                raise ArchiveError(f"{what} cannot be read: {err.strerror}", path=str(path)) from None
            if not chunk:
                break
            read += len(chunk)
            if read > length:
                break
            yield chunk
    finally:
        os.close(fd)
    if read != length:
        raise ArchiveError(f"{what} changed size while being read", path=str(path), expected=length, found=read)

"""The JIT manifest read and checked like every other archive record: bounded, sealed
by the catalog's sha256, decoded by type, and refused whole (one :class:`ArchiveError`
naming the field) for a path that could leave its directory, a link, a count or size
beyond the limits, a mode with more than permission bits, or a file named like host
code but marked as data. Triton's group files are archived with their child paths
relative to the cache and made absolute again where they are installed."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path, PurePosixPath

import msgspec

from foundry.archive.files import DEFAULT_LIMITS, GiB, MiB, encode_record, iter_bounded, read_bounded, sha256_hex
from foundry.archive.jit_caches import SNIFF_BYTES, SPECS, host_code_by_name, is_host_code
from foundry.archive.jit_schema import (
    BLOB_DIR,
    JIT_FORMAT,
    JIT_VERSIONS_READ,
    MANIFEST_FILE,
    GroupFile,
    JitEntry,
    JitIndex,
    JitManifest,
    lowest_version,
)
from foundry.archive.reader import decode_typed
from foundry.errors import ArchiveError

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_CACHE_ID = re.compile(r"^[0-9a-f]{32}$")
GROUP_PREFIX = "__grp__"


class JitLimits(msgspec.Struct, frozen=True):
    """What a reader accepts of a manifest: a file as large as a module image, a total
    and a count that bound a LOAD's disk use and time, paths that fit any file system."""

    manifest: int = 64 * MiB  # as a session
    entries: int = 200_000
    file: int = DEFAULT_LIMITS.module
    total: int = 64 * GiB
    path: int = 1024  # characters
    depth: int = 32  # path components
    component: int = 255  # bytes of one component
    group: int = 1 * MiB  # a Triton group file, decoded at install


DEFAULT_JIT_LIMITS = JitLimits()


def encode_manifest(manifest: JitManifest) -> bytes:
    """Canonical JSON of a manifest, entries in (cache, path) order."""
    entries = tuple(sorted(manifest.entries, key=lambda e: (e.cache.value, e.path)))
    return encode_record(msgspec.structs.replace(manifest, entries=entries))


def check_path(relative: str, *, limits: JitLimits, source: Path, field: str) -> None:
    """A relative POSIX path of plain components that stays inside its directory."""
    parts = relative.split("/")
    bad = (
        not relative
        or len(relative) > limits.path
        or len(parts) > limits.depth
        or PurePosixPath(relative).is_absolute()
        or any(part in ("", ".", "..") or len(part.encode()) > limits.component for part in parts)
        or any(ord(c) < 0x20 or c in "\\\x7f" for c in relative)
    )
    if bad:
        raise ArchiveError("a cache path must be relative, plain and stay inside its cache", path=str(source),
                           field=field, found=relative[:200])  # fmt: skip


def check_manifest(manifest: JitManifest, *, limits: JitLimits, source: Path, index: JitIndex | None = None) -> None:
    """Everything a manifest must be before a byte of it is installed."""
    if manifest.format != JIT_FORMAT or manifest.format_version not in JIT_VERSIONS_READ:
        raise ArchiveError("not a JIT manifest this Foundry reads", path=str(source), field="format_version",
                           expected=f"{JIT_FORMAT} {' or '.join(map(str, JIT_VERSIONS_READ))}",
                           found=f"{manifest.format} {manifest.format_version}")  # fmt: skip
    needed = lowest_version(manifest.versions, manifest.entries)
    if manifest.format_version < needed:  # only vLLM's cache needs more than version 1
        raise ArchiveError(f"vLLM's cache in a JIT manifest of version {manifest.format_version} (it came with "
                           f"version {needed})", path=str(source), field="format_version",
                           expected=f">= {needed}", found=manifest.format_version)  # fmt: skip
    if not _CACHE_ID.match(manifest.cache_id):
        raise ArchiveError("not a cache id (32 lowercase hex digits)", path=str(source), field="cache_id",
                           found=manifest.cache_id[:64])  # fmt: skip
    if len(manifest.entries) > limits.entries:
        raise ArchiveError("too many cache files", path=str(source), field="entries",
                           expected=f"<= {limits.entries}", found=len(manifest.entries))  # fmt: skip
    total = 0
    seen: set[tuple[str, str]] = set()
    for i, entry in enumerate(manifest.entries):
        field = f"entries[{i}]"
        check_path(entry.path, limits=limits, source=source, field=f"{field}.path")
        if not _SHA256.match(entry.sha256):
            raise ArchiveError("not a sha256 (64 lowercase hex digits)", path=str(source), field=f"{field}.sha256",
                               found=entry.sha256[:80])  # fmt: skip
        if entry.size > limits.file:
            raise ArchiveError("a cache file is larger than the reader accepts", path=str(source),
                               field=f"{field}.size", expected=f"<= {limits.file} bytes", found=entry.size)  # fmt: skip
        if entry.mode & ~0o777:
            raise ArchiveError("a mode holds more than permission bits", path=str(source), field=f"{field}.mode",
                               found=oct(entry.mode))  # fmt: skip
        if entry.mtime_ns < 0:
            raise ArchiveError("a negative modification time", path=str(source), field=f"{field}.mtime_ns")
        if not entry.host_code and host_code_by_name(SPECS[entry.cache], entry.path):
            raise ArchiveError("a file named like host code is marked as data", path=str(source),
                               field=f"{field}.host_code", found=f"{entry.cache}/{entry.path}")  # fmt: skip
        key = (entry.cache.value, entry.path)
        if key in seen:
            raise ArchiveError("a cache file is listed twice", path=str(source), field=f"{field}.path",
                               found=entry.path)  # fmt: skip
        seen.add(key)
        total += entry.size
    _check_no_file_is_a_directory(manifest, source)
    if total > limits.total:
        raise ArchiveError("the caches are larger than the reader accepts", path=str(source), field="entries",
                           expected=f"<= {limits.total} bytes", found=f"{total} bytes")  # fmt: skip
    if index is not None:
        counted = (len(manifest.entries), total, any(e.host_code for e in manifest.entries))
        if counted != (index.files, index.bytes, index.host_code):
            raise ArchiveError("the catalog's JIT entry disagrees with the manifest", path=str(source), field="jit",
                               expected=(index.files, index.bytes, index.host_code), found=counted)  # fmt: skip


def _check_no_file_is_a_directory(manifest: JitManifest, source: Path) -> None:
    """A path that is one entry's file and another's directory could not be installed."""
    files = {(e.cache.value, e.path) for e in manifest.entries}
    for entry in manifest.entries:
        parts = entry.path.split("/")
        for depth in range(1, len(parts)):
            if (entry.cache.value, "/".join(parts[:depth])) in files:
                raise ArchiveError("a cache path lies below another entry's file", path=str(source),
                                   field="entries", found=entry.path)  # fmt: skip


def read_manifest(root: Path, index: JitIndex, *, limits: JitLimits = DEFAULT_JIT_LIMITS) -> JitManifest:
    """The manifest of the archive at ``root``, checked against the catalog's ``index``."""
    path = root / MANIFEST_FILE
    try:
        data = read_bounded(path, limits.manifest, what="JIT manifest", size=index.size)
    except ArchiveError as err:
        if err.field == "size" and err.expected == index.size:
            raise ArchiveError("the JIT manifest's size differs from the catalog's", path=str(path), field="jit.size",
                               expected=index.size, found=err.found) from None  # fmt: skip
        raise
    if sha256_hex(data) != index.sha256:
        raise ArchiveError("the JIT manifest does not match the catalog's sha256 (altered or damaged)",
                           path=str(path), field="jit.sha256", expected=index.sha256,
                           found=sha256_hex(data))  # fmt: skip
    manifest = decode_typed(data, JitManifest, path=path)
    check_manifest(manifest, limits=limits, source=path, index=index)
    return manifest


def blob_path(root: Path, sha256: str) -> Path:
    """Where an entry's bytes are in the archive at ``root`` (``sha256`` already checked)."""
    return root / BLOB_DIR / sha256


def check_blob(root: Path, entry: JitEntry, *, limits: JitLimits = DEFAULT_JIT_LIMITS) -> None:
    """An entry's blob against its size and sha256, read in pieces, and its first bytes
    against its ``host_code`` mark (``foundry archive verify``)."""
    path = blob_path(root, entry.sha256)
    what = f"JIT cache file {entry.cache}/{entry.path}"
    digest = hashlib.sha256()
    head = b""
    for chunk in iter_bounded(path, limits.file, what=what, size=entry.size):
        digest.update(chunk)
        head += chunk[: max(0, SNIFF_BYTES - len(head))]
    if digest.hexdigest() != entry.sha256:
        raise ArchiveError(f"{what} does not match its sha256 (altered or damaged)", path=str(path), field="sha256",
                           expected=entry.sha256, found=digest.hexdigest())  # fmt: skip
    if not entry.host_code and is_host_code(SPECS[entry.cache], entry.path, head):
        raise ArchiveError(f"{what} is marked as data but is host code", path=str(path), field="host_code")


# -- Triton's group files -------------------------------------------------------------


def is_group(relative: str) -> bool:
    return relative.rsplit("/", 1)[-1].startswith(GROUP_PREFIX) and relative.endswith(".json")


def group_to_relative(data: bytes, cache_root: Path) -> bytes | None:
    """A group file with its child paths relative to ``cache_root``, or None when it is not
    one Triton wrote there (then it is archived as it is)."""
    try:
        group = msgspec.json.decode(data, type=GroupFile)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError):
        return None
    relative = {}
    for name, child in group.child_paths.items():
        try:
            relative[name] = Path(child).relative_to(cache_root).as_posix()
        except ValueError:
            return None
    return msgspec.json.encode(GroupFile(relative))


def group_to_absolute(data: bytes, cache_root: Path, *, limits: JitLimits, source: str) -> bytes:
    """An archived group file with its child paths made absolute under ``cache_root``,
    as Triton reads them; a child path that would leave the cache is refused."""
    try:
        group = msgspec.json.decode(data, type=GroupFile)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError) as err:
        raise ArchiveError(f"a Triton group file cannot be decoded: {err}", path=source, field="form") from None
    absolute = {}
    for name, child in group.child_paths.items():
        check_path(child, limits=limits, source=Path(source), field="child_paths")
        absolute[name] = str(cache_root.joinpath(*child.split("/")))
    return msgspec.json.encode({"child_paths": absolute})

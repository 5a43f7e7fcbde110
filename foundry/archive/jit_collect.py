"""A SAVE's JIT caches put in its archive: the final artefacts of each cache directory,
content-addressed (``jit/blobs/<sha256>``, hashed while they are copied), with a
manifest, sealed by the catalog.

Collecting happens in two steps, because the archive does not exist yet when the
caches are filled (the priming run comes before the SAVE's runs): :func:`stage` copies
the files into a staging directory beside the archive, and :func:`attach`, once the
SAVE's runs have written the archive, moves them in, writes the manifest and then the
catalog, its commit point (a SAVE killed before that leaves an archive without caches,
never a catalog naming missing files)."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec

from foundry.archive.files import atomic_write, encode_record
from foundry.archive.jit_caches import SNIFF_BYTES, SPECS, Cache, CacheSpec, is_artefact, is_host_code
from foundry.archive.jit_manifest import (
    DEFAULT_JIT_LIMITS,
    JitLimits,
    check_manifest,
    check_path,
    encode_manifest,
    group_to_relative,
    is_group,
)
from foundry.archive.jit_schema import (
    BLOB_DIR,
    JIT_FORMAT,
    MANIFEST_FILE,
    Form,
    JitEntry,
    JitIndex,
    JitManifest,
    JitState,
    JitVersions,
    lowest_version,
)
from foundry.archive.reader import Archive
from foundry.archive.schema import CATALOG_FILE, catalog_version
from foundry.errors import FoundryError

PIECE = 1 << 20


@dataclass
class Staged:
    """What :func:`stage` found: the entries, and the files it left out."""

    entries: list[JitEntry]
    links: int = 0  # symbolic links and other non-regular files, never archived
    skipped: int = 0  # temporary files, locks, logs, object files


def stage(directory: Path, staging: Path, *, limits: JitLimits = DEFAULT_JIT_LIMITS) -> Staged:
    """Copy the final artefacts of every cache under ``directory`` (``directory/<cache>``,
    as :func:`foundry.archive.jit_caches.cache_environment` laid it out) into
    ``staging/jit/blobs`` (where an archive keeps them, so an install reads the staging
    directory as it reads an archive); a file the reader would refuse is refused now."""
    blobs = staging / BLOB_DIR
    blobs.mkdir(parents=True, exist_ok=True)
    staged = Staged([])
    for spec in SPECS.values():
        root = spec.root(directory / spec.cache.value)
        for folder, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(files):
                path = Path(folder, name)
                relative = path.relative_to(root).as_posix()
                info = os.lstat(path)
                if not stat.S_ISREG(info.st_mode):
                    staged.links += 1
                    continue
                if not is_artefact(spec, relative):
                    staged.skipped += 1
                    continue
                check_path(relative, limits=limits, source=path, field=f"{spec.cache}.path")
                staged.entries.append(_copy(spec, root, path, relative, blobs, limits))
            # links to directories are not walked (os.walk follows none), but count them
            staged.links += sum(1 for d in dirs if os.path.islink(os.path.join(folder, d)))
    total = sum(e.size for e in staged.entries)
    if len(staged.entries) > limits.entries or total > limits.total:
        raise FoundryError("the JIT caches are larger than an archive's reader accepts", path=str(directory),
                           expected=f"<= {limits.entries} files, <= {limits.total} bytes",
                           found=f"{len(staged.entries)} files, {total} bytes")  # fmt: skip
    return staged


def _copy(spec: CacheSpec, root: Path, path: Path, relative: str, blobs: Path, limits: JitLimits) -> JitEntry:
    """One file into ``blobs`` under its sha256, hashed as it is copied."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if info.st_size > limits.file:
            raise FoundryError("a JIT cache file is larger than an archive's reader accepts", path=str(path),
                               expected=f"<= {limits.file} bytes", found=info.st_size)  # fmt: skip
        form = Form.FILE
        if is_group(relative) and info.st_size <= limits.group:
            data = _read_all(fd)
            relocatable = group_to_relative(data, root)
            if relocatable is not None:
                data, form = relocatable, Form.TRITON_GROUP
            digest, head, size = _write_blob([data], blobs)
        else:
            digest, head, size = _write_blob(_pieces(fd), blobs)
    finally:
        os.close(fd)
    return JitEntry(cache=spec.cache, path=relative, sha256=digest, size=size, mode=info.st_mode & 0o777,
                    host_code=is_host_code(spec, relative, head), mtime_ns=info.st_mtime_ns, form=form)  # fmt: skip


def _pieces(fd: int) -> Iterator[bytes]:
    while chunk := os.read(fd, PIECE):
        yield chunk


def _read_all(fd: int) -> bytes:
    return b"".join(_pieces(fd))


def _write_blob(pieces: Iterable[bytes], blobs: Path) -> tuple[str, bytes, int]:
    """Write ``pieces`` to ``blobs/<sha256>``; (sha256, the first bytes, size)."""
    digest = hashlib.sha256()
    head = b""
    size = 0
    tmp = blobs / f".incoming.{os.getpid()}.tmp"
    with open(tmp, "wb") as out:
        for chunk in pieces:
            if len(head) < SNIFF_BYTES:
                head += chunk[: SNIFF_BYTES - len(head)]
            digest.update(chunk)
            out.write(chunk)
            size += len(chunk)
        out.flush()
        os.fsync(out.fileno())
    name = digest.hexdigest()
    os.replace(tmp, blobs / name)  # the same name is the same bytes
    return name, head, size


def make_manifest(staged: Staged, *, cache_id: str, saved_root: Path, versions: JitVersions) -> JitManifest:
    """The manifest of what :func:`stage` copied, at the lowest version that holds it. vLLM's
    version keys only vLLM's cache: an archive without it is not refused where vLLM differs."""
    if not any(e.cache is Cache.VLLM for e in staged.entries):
        versions = msgspec.structs.replace(versions, vllm=None)
    return JitManifest(format=JIT_FORMAT, format_version=lowest_version(versions, staged.entries), cache_id=cache_id,
                       saved_root=str(saved_root), versions=versions, entries=tuple(staged.entries))  # fmt: skip


def new_artefacts(directory: Path, manifest: JitManifest) -> list[str]:
    """The final artefacts under ``directory`` the manifest does not list ("cache/path"):
    what a run made with the caches installed compiled anew."""
    listed = {(e.cache, e.path) for e in manifest.entries}
    found = []
    for spec in SPECS.values():
        root = spec.root(directory / spec.cache.value)
        for folder, _, files in os.walk(root):
            for name in files:
                relative = Path(folder, name).relative_to(root).as_posix()
                if not stat.S_ISREG(os.lstat(Path(folder, name)).st_mode):  # never archived
                    continue
                if is_artefact(spec, relative) and (spec.cache, relative) not in listed:
                    found.append(f"{spec.cache}/{relative}")
    return sorted(found)


def attach(archive_root: Path, staging: Path, manifest: JitManifest) -> JitIndex:
    """Move the staged blobs into the committed archive at ``archive_root``, write the
    manifest (its ``gpu_arch`` the catalog's compute capability), then the catalog."""
    archive = Archive.open(archive_root)
    versions = msgspec.structs.replace(manifest.versions, gpu_arch=archive.catalog.environment.compute_capability)
    manifest = msgspec.structs.replace(manifest, versions=versions)
    data = encode_manifest(manifest)
    index = JitIndex(state=JitState.COMPLETE, sha256=hashlib.sha256(data).hexdigest(), size=len(data),
                     files=len(manifest.entries), bytes=sum(e.size for e in manifest.entries),
                     host_code=any(e.host_code for e in manifest.entries))  # fmt: skip
    check_manifest(manifest, limits=DEFAULT_JIT_LIMITS, source=archive_root / MANIFEST_FILE, index=index)
    jit = archive_root / "jit"
    if jit.exists():  # not named by the catalog: left by an earlier SAVE at this path
        shutil.rmtree(jit)
    jit.mkdir()
    os.replace(staging / BLOB_DIR, archive_root / BLOB_DIR)
    atomic_write(archive_root / MANIFEST_FILE, data)
    catalog = msgspec.structs.replace(archive.catalog, jit=index)
    catalog = msgspec.structs.replace(catalog, format_version=catalog_version(catalog))
    atomic_write(archive_root / CATALOG_FILE, encode_record(catalog))  # the commit point
    return index

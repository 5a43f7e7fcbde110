"""Device globals of module images: found at SAVE, checked or restored at LOAD.

A kernel may read ``__device__``/``__constant__`` state its application set
before capture (``cudaMemcpyToSymbol``, NVSHMEM and DeepEP device state). A
graph restored against a freshly loaded copy of the image would see the
image's initial values instead — right on the first token, wrong after. So
SAVE lists the globals of every image its graphs use (from the cubin's ELF
symbol table), records a hash of each one's bytes and keeps the bytes of those
the application wrote. LOAD then:

- bound to the live process's own copy: every global must hold SAVE's bytes;
- bound to a freshly loaded archived copy: written globals are restored;
- an image whose globals cannot be listed (PTX only, a malformed image) may be
  bound live, but a fresh copy of it is refused. Compressed fatbins (torch's, on
  the H200 test machine) are read with the zstandard module; SAVE refuses to run
  without it rather than record their globals as unknown.

Words the module loader itself fills (code addresses in a table of device
function pointers, such as NCCL's ``ncclDevFuncTable``) differ with every load
of an image; SAVE finds them as the words two fresh copies disagree on, and
they are left out of the comparison and of what is restored.

Words that hold an address mapped in the host process (NVSHMEM's device state
points at its pinned host buffers, which every process maps anew) are the
process's own: SAVE lists them, LOAD bound to the live copy wants a host
address of its own process there, and a fresh copy, which no initialisation
of this process filled, is refused.
"""

from __future__ import annotations

import ctypes
import hashlib
import struct
from collections.abc import Iterator
from typing import Any

import msgspec

from foundry.archive.schema import GlobalRecord, ImageRecord
from foundry.errors import CaptureError, DriftError
from foundry.graphir.cuda import cu, driver, handle_value
from foundry.graphir.regions import AddressRanges
from foundry.runtime.host_maps import host_ranges

ELF_MAGIC = b"\x7fELF"
FATBIN_MAGIC = 0xBA55ED50
SHT_SYMTAB = 2
STT_OBJECT = 1
# the sections user globals live in; .nv.constant0 holds kernel parameters
GLOBAL_SECTIONS = (".nv.global", ".nv.constant")
PARAM_SECTION = ".nv.constant0"


def _elf_globals(elf: bytes) -> list[tuple[str, int]] | None:
    """``(name, size)`` of the device globals in one cubin; None if it is not a well-formed ELF64."""
    try:
        if elf[:4] != ELF_MAGIC or elf[4] != 2 or elf[5] != 1:
            return None
        (shoff,) = struct.unpack_from("<Q", elf, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
        sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
        names_at = sections[shstrndx][4]

        def cstr(at: int) -> str:
            return elf[at : elf.index(b"\0", at)].decode(errors="replace")

        section_names = [cstr(names_at + s[0]) for s in sections]
        found = []
        for sh in sections:
            if sh[1] != SHT_SYMTAB:
                continue
            strtab = sections[sh[6]][4]
            for at in range(sh[4], sh[4] + sh[5], sh[9] or 24):
                st_name, st_info, _, st_shndx, _, st_size = struct.unpack_from("<IBBHQQ", elf, at)
                if st_info & 0xF != STT_OBJECT or st_size == 0 or st_shndx >= len(sections):
                    continue
                where = section_names[st_shndx]
                if where.startswith(GLOBAL_SECTIONS) and not where.startswith(PARAM_SECTION):
                    found.append((cstr(strtab + st_name), st_size))
        return sorted(set(found))
    except (struct.error, IndexError, ValueError):
        return None


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _fatbin_members(image: bytes) -> Iterator[bytes | None]:
    """The payload of every fatbin entry, zstd-compressed ones decompressed;
    None for an entry this reader cannot decode (e.g. another compression)."""
    _, _, header_size, fat_size = struct.unpack_from("<IHHQ", image)
    at, end = header_size, min(len(image), header_size + fat_size)
    while at + 64 <= end:
        entry_header, padded = struct.unpack_from("<IQ", image, at + 4)
        (size,) = struct.unpack_from("<Q", image, at + 16)
        (expanded,) = struct.unpack_from("<Q", image, at + 56)
        payload = image[at + entry_header : at + entry_header + min(size or padded, padded)]
        if payload[:4] == ZSTD_MAGIC:
            yield _unzstd(payload, expanded)
        elif payload[:4] == ELF_MAGIC or payload[:1] in (b".", b"/"):  # cubin, or PTX text
            yield payload
        else:
            yield None
        if entry_header == 0 or padded == 0:
            break
        at += entry_header + padded


def _unzstd(payload: bytes, expanded: int) -> bytes | None:
    try:
        import zstandard
    except ImportError:  # unknown globals would make every LOAD refuse a fresh copy of the image
        raise CaptureError(
            "a module image is a zstd-compressed fatbin, and listing its device globals needs the "
            "zstandard module (pip install 'foundry[gpu]')",
            field="zstandard",
        ) from None
    try:
        return zstandard.ZstdDecompressor().decompress(payload, max_output_size=max(expanded, 1))
    except zstandard.ZstdError:
        return None


def global_names(image: bytes) -> list[tuple[str, int]] | None:
    """``(name, size)`` of an image's device globals, or None when they cannot be listed
    (PTX only, a member this reader cannot decode, a malformed image)."""
    if image[:4] == ELF_MAGIC:
        return _elf_globals(image)
    if len(image) < 16 or struct.unpack_from("<I", image)[0] != FATBIN_MAGIC:
        return None
    try:
        members = list(_fatbin_members(image))
    except struct.error:
        return None
    cubins = [m for m in members if m is not None and m[:4] == ELF_MAGIC]
    if not cubins or any(m is None for m in members):
        return None
    found = [_elf_globals(m) for m in cubins]
    if any(g is None for g in found):
        return None
    return sorted({name for g in found for name in g})


def _read_global(kind: str, handle: int, name: str) -> bytes | None:
    drv = driver()
    get = "cuLibraryGetGlobal" if kind == "library" else "cuModuleGetGlobal"
    owner = drv.CUlibrary(handle) if kind == "library" else drv.CUmodule(handle)
    err, dptr, size = getattr(drv, get)(owner, name.encode())
    if err != drv.CUresult.CUDA_SUCCESS:
        return None
    buf = ctypes.create_string_buffer(size)
    cu("cuMemcpyDtoH", ctypes.addressof(buf), dptr, size)
    return buf.raw


def _write_global(handle: int, name: str, value: bytes) -> None:
    drv = driver()
    dptr, size = cu("cuLibraryGetGlobal", drv.CUlibrary(handle), name.encode())
    if size != len(value):
        raise DriftError("a device global changed size", field=name, expected=len(value), found=size)
    buf = ctypes.create_string_buffer(value, len(value))
    cu("cuMemcpyHtoD", dptr, ctypes.addressof(buf), len(value))


def record_image(sha256: str, image: bytes, kind: str, handle: int, host: AddressRanges) -> ImageRecord:
    """SAVE: the globals of one image as the application left them (``host``: the
    host-accessible address ranges of this process, read once for all its images)."""
    names = global_names(image)
    if names is None:
        return ImageRecord(sha256, globals_known=False)
    if not names:
        return ImageRecord(sha256, globals_known=True)
    data = ctypes.create_string_buffer(image, len(image))
    # two fresh copies loaded side by side: their code lies at different addresses, so the words
    # where they differ are the loader's (code addresses), not state anyone set
    fresh = [cu("cuLibraryLoadData", ctypes.addressof(data), None, None, 0, None, None, 0) for _ in range(2)]
    try:
        records = []
        for name, _ in names:
            live = _read_global(kind, handle, name)
            initial, again = (_read_global("library", handle_value(f), name) for f in fresh)
            if live is None and initial is None:
                continue  # not reachable by name (internal linkage): no cudaMemcpyToSymbol can have set it
            if live is None or initial is None or again is None:
                return ImageRecord(sha256, globals_known=False)
            records.append(_record(name, live, initial, loader_words(initial, again), host))
        return ImageRecord(sha256, globals_known=True, globals=tuple(records))
    finally:
        for f in fresh:
            cu("cuLibraryUnload", f)


def _record(name: str, live: bytes, initial: bytes, loader: tuple[int, ...],
            host: AddressRanges | None = None) -> GlobalRecord:  # fmt: skip
    host_words = tuple(o for o in _host_words(live, host or AddressRanges()) if o not in loader)
    written = without_words(live, loader) != without_words(initial, loader)
    kept = without_words(live, (*loader, *host_words))
    return GlobalRecord(name, len(live), written, hashlib.sha256(kept).hexdigest(), live if written else None,
                        loader_words=loader or msgspec.UNSET, host_words=host_words or msgspec.UNSET)  # fmt: skip


# Words below this are data even where a host range covers them: a SAVE runs without address
# randomisation, so an interpreter built without PIE has its heap at a few MiB, and NVSHMEM's
# device state held a size (0x1000000) inside it on the H200 test machine. Pinned host memory
# is mapped far higher (0x7f..., seen there).
MIN_HOST_ADDRESS = 1 << 32


def _host_words(value: bytes, host: AddressRanges) -> list[int]:
    """Offsets of the 8-byte words of ``value`` holding an address inside ``host``."""
    return [8 * i for i, word in enumerate(_words(value)) if word >= MIN_HOST_ADDRESS and word in host]


def _skipped(g: GlobalRecord) -> tuple[int, ...]:
    """The words of ``g`` compared by kind, not value: the loader's and the host process's."""
    return (*(g.loader_words or ()), *(g.host_words or ()))


def loader_words(first: bytes, second: bytes) -> tuple[int, ...]:
    """Offsets of the 8-byte words two fresh loads of one image disagree on."""
    return tuple(8 * i for i, (a, b) in enumerate(zip(_words(first), _words(second), strict=False)) if a != b)


def without_words(value: bytes, offsets: tuple[int, ...] | msgspec.UnsetType) -> bytes:
    """``value`` with the 8-byte words at ``offsets`` zeroed: words the loader fills in
    per process, and words holding a host address of SAVE's process."""
    if not offsets:
        return value
    buf = bytearray(value)
    for offset in offsets:
        buf[offset : offset + 8] = bytes(8)
    return bytes(buf)


def check_live(record: ImageRecord, kind: str, handle: int) -> None:
    """LOAD, bound to the application's own copy: its globals must hold SAVE's bytes,
    and a host address of this process where SAVE's held one of its own."""
    host: AddressRanges | None = None
    for g in record.globals:
        live = _read_global(kind, handle, g.name)
        if live is not None and len(live) != g.size:
            raise DriftError("a device global of the live module has another size than at SAVE", field=g.name,
                             path=f"image {record.sha256[:12]}", expected=g.size, found=len(live))  # fmt: skip
        if live is None or hashlib.sha256(without_words(live, _skipped(g))).hexdigest() != g.sha256:
            saved, found = _first_differences(g, live)
            raise DriftError(
                "a device global of the live module differs from SAVE's (run the same initialisation as SAVE "
                "before LOAD; a global holding a region address differs whenever the region moved)",
                field=g.name,
                path=f"image {record.sha256[:12]}",
                expected=saved,
                found=found,
            )
        if g.host_words:
            host = host_ranges(accessible=True) if host is None else host
            held = set(_host_words(live, host))
            missing = [o for o in g.host_words if o not in held]
            if missing:
                words = _words(live)
                raise DriftError("a device global word that held a host address at SAVE holds none of this "
                                 "process", field=g.name, path=f"image {record.sha256[:12]}",
                                 expected="a mapped host address",
                                 found={f"+{o:#x}": hex(words[o // 8]) for o in missing[:4]})  # fmt: skip


def _first_differences(g: GlobalRecord, live: bytes | None, limit: int = 4) -> tuple[Any, Any]:
    """SAVE's and the live words where they first differ, by byte offset (SAVE's bytes
    are kept only for a global the application wrote; a last partial word is padded)."""
    if live is None or g.value is None:
        return None, "unreadable" if live is None else f"sha256 {hashlib.sha256(live).hexdigest()[:12]}"
    if len(live) != len(g.value):
        return f"{len(g.value)} bytes", f"{len(live)} bytes"
    skip = set(_skipped(g))
    padded = [_words(v + bytes(-len(v) % 8)) for v in (g.value, live)]
    pairs = [(8 * i, a, b) for i, (a, b) in enumerate(zip(*padded, strict=True))
             if a != b and 8 * i not in skip][:limit]  # fmt: skip
    return {f"+{o:#x}": hex(a) for o, a, _ in pairs}, {f"+{o:#x}": hex(b) for o, _, b in pairs}


def restore_fresh(record: ImageRecord | None, sha256: str, library: int,
                  moved_from: tuple[int, int] | None = None) -> list[str]:  # fmt: skip
    """LOAD, bound to a freshly loaded archived copy: restore what the application
    wrote at SAVE; refuse images whose globals are unknown, and, when the region
    moved (``moved_from`` is SAVE's range), globals that hold an address in it.
    Returns the names restored."""
    if record is None or not record.globals_known:
        raise DriftError(
            "the device globals of this image are unknown, so a fresh copy could hold the wrong "
            "state; load the image in the application before LOAD",
            path=f"image {sha256[:12]}",
        )
    written = [g for g in record.globals if g.written]
    for g in written:
        if g.host_words:
            raise DriftError("a device global holds host addresses its application wrote in SAVE's process; a "
                             "fresh copy cannot be given this process's, so load the image in the application "
                             "before LOAD", field=g.name, path=f"image {sha256[:12]}")  # fmt: skip
    if moved_from is not None:
        for g in written:
            if any(moved_from[0] <= w < moved_from[1] for w in _words(g.value or b"")):
                raise DriftError("a device global holds an address in SAVE's region, which this LOAD moved",
                                 field=g.name, path=f"image {sha256[:12]}")  # fmt: skip
    for g in written:
        fresh = _read_global("library", library, g.name) if g.loader_words else None
        _write_global(library, g.name, _keep_loader_words(g, fresh))
    return [g.name for g in written]


def _keep_loader_words(g: GlobalRecord, fresh: bytes | None) -> bytes:
    """SAVE's bytes of ``g`` with the fresh copy's own code addresses in the loader's words."""
    value = bytearray(g.value or b"")
    for offset in g.loader_words or ():
        if fresh is not None and offset + 8 <= min(len(value), len(fresh)):
            value[offset : offset + 8] = fresh[offset : offset + 8]
    return bytes(value)


def _words(value: bytes) -> list[int]:
    return [int.from_bytes(value[i : i + 8], "little") for i in range(0, len(value) - 7, 8)]

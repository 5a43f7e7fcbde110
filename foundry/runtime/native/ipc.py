"""Region memory shared between processes: Foundry's IPC handles (native/src/ipc.c).

A handle is 64 bytes, the size of a ``CUipcMemHandle``: the exporter's pid and
export number, the rank slot, where the memory sits in the exporter's region,
a random token and the random key that names the exporter's abstract Unix
socket (``@foundry-ipc-<pid>-<key>``: no other process can take the name first).
The descriptor itself travels over that socket, after the importer has checked
who answers and the exporter has checked the importer's UID and the token.
An importer maps peer memory at a deterministic address (:func:`import_address`):
one import zone per process, a slot per rank, the exporter's offset inside it —
the same addresses in every SAVE and LOAD process.
"""

from __future__ import annotations

import ctypes

import msgspec

from foundry.errors import FoundryError

MAGIC = 0x43504946
VERSION = 2  # 2: the socket key
HANDLE_BYTES = 64

REFUSALS = {
    -1: "invalid argument",
    -2: "the import table is full",
    -10: "not a Foundry IPC handle",
    -11: "an IPC handle of another version",
    -12: "the exporting process no longer exists",
    -13: "the exporting process does not answer on its socket",
    -14: "the exporter refused: this importer runs as another user than the exporter",
    -15: "the exporter refused: wrong token (a reused pid, or a forged handle)",
    -16: "a malformed exchange with the exporter",
    -17: "refused: the process answering on the exporter's socket runs as another user (the token was not sent)",
    -18: "refused: the process answering on the exporter's socket is not the exporter (the token was not sent)",
}


class IpcError(FoundryError):
    """An import or export of region memory was refused."""


class _Handle(ctypes.Structure):
    _fields_ = [
        ("magic", ctypes.c_uint32),
        ("version", ctypes.c_uint16),
        ("rank_slot", ctypes.c_uint16),
        ("pid", ctypes.c_int32),
        ("export_id", ctypes.c_uint32),
        ("region_base", ctypes.c_uint64),
        ("offset", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
        ("token", ctypes.c_uint8 * 16),
        ("socket_key", ctypes.c_uint8 * 8),
    ]


class IpcHandle(msgspec.Struct, frozen=True):
    """A decoded handle (the token stays in the raw bytes)."""

    pid: int
    export_id: int
    rank_slot: int
    region_base: int
    offset: int
    size: int


def decode(raw: bytes) -> IpcHandle:
    """Read a handle's fields, refusing anything that is not a handle of this version."""
    if not isinstance(raw, bytes | bytearray) or len(raw) != HANDLE_BYTES:
        raise IpcError("an IPC handle is 64 bytes", found=len(raw) if isinstance(raw, bytes | bytearray) else type(raw))
    h = _Handle.from_buffer_copy(raw)
    if h.magic != MAGIC:
        raise IpcError(REFUSALS[-10], found=hex(h.magic))
    if h.version != VERSION:
        raise IpcError(REFUSALS[-11], expected=VERSION, found=h.version)
    return IpcHandle(h.pid, h.export_id, h.rank_slot, h.region_base, h.offset, h.size)


def import_address(zone_base: int, slot_size: int, handle: IpcHandle) -> int:
    """Where a peer's memory is mapped in an importer: its rank's slot, at the exporter's offset."""
    if handle.offset + handle.size > slot_size:
        raise IpcError("the peer memory does not fit its slot of the import zone",
                       expected=slot_size, found=handle.offset + handle.size)  # fmt: skip
    return zone_base + handle.rank_slot * slot_size + handle.offset


class Ipc:
    """The IPC calls of a loaded hook library."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib

    def export(self, fd: int, *, rank_slot: int, region_base: int, offset: int, size: int) -> bytes:
        if not 0 <= rank_slot < 1 << 16:
            raise IpcError("a rank slot is 0..65535", found=rank_slot)
        if min(region_base, offset, size) < 0 or max(region_base, offset, size) >= 1 << 64:
            raise IpcError("region base, offset and size are unsigned 64-bit values",
                           found=(region_base, offset, size))  # fmt: skip
        h = _Handle()
        status = self.lib.foundry_ipc_export(
            ctypes.c_int(fd),
            ctypes.c_uint16(rank_slot),
            ctypes.c_uint64(region_base),
            ctypes.c_uint64(offset),
            ctypes.c_uint64(size),
            ctypes.byref(h),
        )
        if status == -1:
            raise IpcError("cannot export: not an open file descriptor", found=fd)
        if status:
            raise IpcError("cannot export: the IPC server did not start or the export table is full", found=status)
        return bytes(h)

    def open(self, raw: bytes) -> int:
        """A descriptor for the peer memory; every open needs its close."""
        handle = decode(raw)
        fd = ctypes.c_int(-1)
        status = self.lib.foundry_ipc_open(ctypes.byref(_Handle.from_buffer_copy(raw)), ctypes.byref(fd))
        if status:
            raise IpcError(REFUSALS.get(status, f"import failed (status {status})"), found=handle.pid)
        return fd.value

    def close(self, raw: bytes) -> int:
        """Give one reference back; returns how many are left (0: released)."""
        handle = decode(raw)
        left = ctypes.c_uint32()
        if self.lib.foundry_ipc_close(ctypes.byref(_Handle.from_buffer_copy(raw)), ctypes.byref(left)):
            raise IpcError("closing an import that is not open", found=handle.pid)
        return left.value

"""Foundry's IPC handles on the CPU, in real processes: an exporter passes a memory
file descriptor over its abstract Unix socket (SCM_RIGHTS) after checking the
importer's UID and the token; imports are counted. (Exporting GPU memory needs a
GPU; the descriptor here is a memfd, which travels the same way.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from foundry.runtime.native.hook import Hook
from foundry.runtime.native.ipc import Ipc, IpcError, IpcHandle, decode, import_address

PAYLOAD = b"region bytes shared over foundry ipc"
EXPORTER = r"""
import ctypes, os, sys
sys.path.insert(0, sys.argv[2])
from foundry.runtime.native.ipc import Ipc
ipc = Ipc(ctypes.CDLL(sys.argv[1]))
fd = os.memfd_create("foundry-ipc-test")
os.write(fd, b"%s")
print(ipc.export(fd, rank_slot=1, region_base=0x600000000000, offset=0x200000, size=4096).hex(), flush=True)
sys.stdin.readline()
"""


@contextmanager
def exporting(hook_library, code: str) -> Iterator[tuple[subprocess.Popen, bytes]]:
    """A process running ``code`` (given the hook library and the repository root): yields
    it and the handle it printed first, and tells it to finish on the way out."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen([sys.executable, "-c", code, str(hook_library), root], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        yield proc, bytes.fromhex(proc.stdout.readline().strip())
    finally:
        proc.stdin.write("done\n")
        proc.stdin.flush()
        proc.wait(timeout=30)


@pytest.fixture
def exporter(hook_library):
    with exporting(hook_library, EXPORTER % PAYLOAD.decode()) as started:
        yield started


@pytest.fixture
def ipc(hook_library) -> Ipc:
    return Ipc(Hook.open_library(hook_library).lib)


def test_a_handle_carries_where_the_memory_sits(exporter):
    proc, raw = exporter
    handle = decode(raw)
    assert handle == IpcHandle(proc.pid, 0, 1, 0x600000000000, 0x200000, 4096)
    assert import_address(0x7F0000000000, 1 << 30, handle) == 0x7F0000000000 + (1 << 30) + 0x200000
    with pytest.raises(IpcError, match="does not fit"):
        import_address(0x7F0000000000, 0x100000, handle)
    with pytest.raises(IpcError, match="another version"):
        decode(raw[:4] + (2).to_bytes(2, "little") + raw[6:])
    with pytest.raises(IpcError, match="not a Foundry IPC handle"):
        decode(bytes(64))


def test_the_descriptor_travels_and_is_counted(exporter, ipc):
    _, raw = exporter
    fd = ipc.open(raw)
    assert os.pread(fd, len(PAYLOAD), 0) == PAYLOAD  # the exporter's memory, read through the passed fd
    assert ipc.open(raw) == fd  # a second open shares the import
    assert ipc.close(raw) == 1
    os.fstat(fd)  # still open: one reference left
    assert ipc.close(raw) == 0
    with pytest.raises(OSError):
        os.fstat(fd)  # released with the last reference
    with pytest.raises(IpcError, match="not open"):
        ipc.close(raw)


def test_a_wrong_token_is_refused_even_after_a_real_import(exporter, ipc):
    _, raw = exporter
    forged = bytearray(raw)
    forged[40] ^= 0xFF  # first token byte
    with pytest.raises(IpcError, match="wrong token"):
        ipc.open(bytes(forged))
    fd = ipc.open(raw)
    with pytest.raises(IpcError, match="wrong token"):  # the open import is the real handle's only
        ipc.open(bytes(forged))
    with pytest.raises(IpcError, match="not open"):
        ipc.close(bytes(forged))
    assert ipc.close(raw) == 0 and fd >= 0


def test_an_impostor_on_the_exporters_socket_gets_no_token(ipc, hook_library):
    """Abstract socket names carry no permissions: a process that is not the handle's
    exporter may listen on its name. The importer checks who answers first."""
    import socket

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        impostor = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        impostor.bind(f"\0foundry-ipc-{sleeper.pid}")
        impostor.listen(1)
        raw = bytearray(64)
        raw[0:4] = (0x43504946).to_bytes(4, "little")
        raw[4:6] = (1).to_bytes(2, "little")
        raw[8:12] = sleeper.pid.to_bytes(4, "little")
        with pytest.raises(IpcError, match="no longer exists"):  # the answering pid is not the exporter's
            ipc.open(bytes(raw))
        impostor.close()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_bad_arguments_are_refused_by_name(ipc):
    with pytest.raises(IpcError, match="rank slot"):
        ipc.export(0, rank_slot=70000, region_base=0, offset=0, size=1)
    with pytest.raises(IpcError, match="unsigned"):
        ipc.export(0, rank_slot=0, region_base=0, offset=-1, size=1)
    with pytest.raises(IpcError, match="not an open file descriptor"):
        ipc.export(987654, rank_slot=0, region_base=0, offset=0, size=1)
    with pytest.raises(IpcError, match="64 bytes"):
        ipc.close(b"short")


def test_a_stale_exporter_is_refused(ipc):
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(done.stdout)
    time.sleep(0.1)
    raw = bytearray(64)
    raw[0:4] = (0x43504946).to_bytes(4, "little")
    raw[4:6] = (1).to_bytes(2, "little")
    raw[8:12] = dead.to_bytes(4, "little")
    with pytest.raises(IpcError, match="no longer exists"):
        ipc.open(bytes(raw))


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
def test_another_user_is_refused(exporter, hook_library):
    _, raw = exporter
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import ctypes, os, sys\nsys.path.insert(0, sys.argv[2])\n"
            "from foundry.runtime.native.ipc import Ipc, IpcError\nipc = Ipc(ctypes.CDLL(sys.argv[1]))\n"
            "os.setgid(65534); os.setuid(65534)  # everything loaded: now become another user\n"
            "try:\n    ipc.open(bytes.fromhex(sys.argv[3]))\nexcept IpcError as e:\n    print(e)\n")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code, str(hook_library), root, raw.hex()], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert "another user" in out.stdout, out.stdout + out.stderr


def test_the_import_zone_is_where_the_configuration_puts_it(hook_library):
    import os
    import subprocess
    import sys

    code = ("import sys; from pathlib import Path; from foundry.runtime.native.hook import Hook; "
            "print(Hook.open_library(Path(sys.argv[1])).import_zone())")  # fmt: skip
    env = {**os.environ, "FOUNDRY_MODE": "save", "FOUNDRY_IMPORT_BASE": "0x710000000000",
           "FOUNDRY_REGION_SIZE": str(32 << 30)}  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code, str(hook_library)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str((0x710000000000, 32 << 30, 8))


WITHDRAWING = r"""
import ctypes, os, sys
sys.path.insert(0, sys.argv[2])
from foundry.runtime.native.ipc import Ipc
lib = ctypes.CDLL(sys.argv[1])
fd = os.memfd_create("foundry-ipc-test")
os.write(fd, b"freed soon")
print(Ipc(lib).export(fd, rank_slot=0, region_base=0x600000000000, offset=0, size=4096).hex(), flush=True)
sys.stdin.readline()
print(lib.foundry_ipc_unexport(0), lib.foundry_ipc_unexport(0), flush=True)  # the memory was freed
sys.stdin.readline()
"""


def test_a_withdrawn_export_is_refused_to_later_importers(hook_library, ipc):
    with exporting(hook_library, WITHDRAWING) as (proc, raw):
        fd = ipc.open(raw)  # before: the import works and keeps its descriptor
        proc.stdin.write("withdraw\n")
        proc.stdin.flush()
        assert proc.stdout.readline().split() == ["0", "-1"]  # withdrawn once; a second time is refused
        assert os.pread(fd, 10, 0) == b"freed soon"  # an import already made keeps what it holds
        assert ipc.close(raw) == 0
        with pytest.raises(IpcError, match="wrong token"):
            ipc.open(raw)


FORKING_EXPORTER = r"""
import ctypes, os, sys
sys.path.insert(0, sys.argv[2])
from foundry.runtime.native.ipc import Ipc
ipc = Ipc(ctypes.CDLL(sys.argv[1]))
fd = os.memfd_create("parent")
os.write(fd, b"parent bytes")
ipc.export(fd, rank_slot=0, region_base=0x600000000000, offset=0, size=4096)  # the parent's server runs
pid = os.fork()
if pid == 0:  # the child inherits the parent's socket but not its server thread
    fd = os.memfd_create("child")
    os.write(fd, b"child bytes")
    print(ipc.export(fd, rank_slot=1, region_base=0x600000000000, offset=0x1000, size=4096).hex(), flush=True)
    sys.stdin.readline()
    os._exit(0)
os.waitpid(pid, 0)
"""


def test_a_forked_child_serves_its_own_exports(hook_library, ipc):
    with exporting(hook_library, FORKING_EXPORTER) as (proc, raw):
        assert decode(raw).pid != proc.pid  # exported by the child, from its own socket
        fd = ipc.open(raw)
        assert os.pread(fd, 11, 0) == b"child bytes"
        assert ipc.close(raw) == 0


REUSING = r"""
import ctypes, os, sys
sys.path.insert(0, sys.argv[2])
from foundry.runtime.native.ipc import Ipc, decode
lib = ctypes.CDLL(sys.argv[1])
ipc = Ipc(lib)
for n in range(1100):  # more exports over the process's life than it may hold at once (1024)
    fd = os.memfd_create("churn")
    handle = decode(ipc.export(fd, rank_slot=0, region_base=0x600000000000, offset=0, size=4096))
    os.close(fd)
    assert lib.foundry_ipc_unexport(handle.export_id) == 0, n
withdrawn = ipc.export(os.memfd_create("old"), rank_slot=0, region_base=0x600000000000, offset=0, size=4096)
lib.foundry_ipc_unexport(decode(withdrawn).export_id)
fd = os.memfd_create("new")
os.write(fd, b"new bytes")
print(ipc.export(fd, rank_slot=0, region_base=0x600000000000, offset=0, size=4096).hex(), flush=True)
print(withdrawn.hex(), flush=True)
sys.stdin.readline()
"""


def test_withdrawn_export_numbers_are_reused_and_their_old_handles_refused(hook_library, ipc):
    with exporting(hook_library, REUSING) as (proc, raw):
        old = bytes.fromhex(proc.stdout.readline().strip())
        assert decode(raw).export_id == decode(old).export_id == 0  # the one number, used again
        fd = ipc.open(raw)
        assert os.pread(fd, 9, 0) == b"new bytes"
        assert ipc.close(raw) == 0
        with pytest.raises(IpcError, match="wrong token"):
            ipc.open(old)  # a handle of the export that had the number before

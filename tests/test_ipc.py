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
from foundry.runtime.native.ipc import VERSION, Ipc, IpcError, IpcHandle, decode, import_address

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


def forged_handle(pid: int, key: bytes = bytes(8)) -> bytes:
    """A well-formed handle of this version naming ``pid`` (no export behind it)."""
    raw = bytearray(64)
    raw[0:4] = (0x43504946).to_bytes(4, "little")
    raw[4:6] = VERSION.to_bytes(2, "little")
    raw[8:12] = pid.to_bytes(4, "little")
    raw[56:64] = key
    return bytes(raw)


def socket_name(raw: bytes) -> str:
    """The abstract socket a handle's exporter listens on (version 1 handles: the pid alone)."""
    pid, version = int.from_bytes(raw[8:12], "little"), int.from_bytes(raw[4:6], "little")
    return f"\0foundry-ipc-{pid}" if version == 1 else f"\0foundry-ipc-{pid}-{raw[56:64].hex()}"


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
        decode(raw[:4] + (VERSION + 1).to_bytes(2, "little") + raw[6:])
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
    exporter may listen on its name (here one that knows the handle's socket key). The
    importer checks who answers first, and says that it is not the exporter."""
    import socket

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        impostor = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        raw = forged_handle(sleeper.pid, key=bytes(range(8)))
        impostor.bind(socket_name(raw))
        impostor.listen(1)
        with pytest.raises(IpcError, match="is not the exporter"):  # the answering pid is not the exporter's
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
    with pytest.raises(IpcError, match="no longer exists"):
        ipc.open(forged_handle(dead))


REPORTING_EXPORTER = r"""
import ctypes, json, os, sys
sys.path.insert(0, sys.argv[2])
from foundry.runtime.native.hook import Hook
from foundry.runtime.native.ipc import Ipc
hook = Hook.open_library(sys.argv[1])
fd = os.memfd_create("foundry-ipc-test")
os.write(fd, b"not for another user")
print(Ipc(hook.lib).export(fd, rank_slot=0, region_base=0x600000000000, offset=0, size=4096).hex(), flush=True)
sys.stdin.readline()
print(json.dumps(hook.events()), flush=True)  # what the exporter's server did meanwhile
sys.stdin.readline()
"""
ANOTHER_USERS_IMPORTER = r"""
import ctypes, os, sys
sys.path.insert(0, sys.argv[2])
from foundry.runtime.native.ipc import Ipc, IpcError
ipc = Ipc(ctypes.CDLL(sys.argv[1]))
os.setgid(65534); os.setuid(65534)  # everything loaded: now become another user
try:
    ipc.open(bytes.fromhex(sys.argv[3]))
except IpcError as e:
    print(e)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
def test_another_user_is_refused_by_the_exporter_and_told_so(hook_library):
    """The exporter refuses an importer of another user as it accepts it; the importer
    reports that refusal (not a check of its own) and the exporter's log shows it."""
    import json

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with exporting(hook_library, REPORTING_EXPORTER) as (proc, raw):
        out = subprocess.run([sys.executable, "-c", ANOTHER_USERS_IMPORTER, str(hook_library), root, raw.hex()],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        proc.stdin.write("report\n")
        proc.stdin.flush()
        events = json.loads(proc.stdout.readline())
    assert "the exporter refused: this importer runs as another user than the exporter" in out.stdout, (
        out.stdout + out.stderr
    )
    assert any("refused a connection from uid 65534" in e for e in events), events


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


WAITING_EXPORTER = r"""
import ctypes, os, sys
sys.path.insert(0, sys.argv[2])
from foundry.runtime.native.ipc import Ipc
ipc = Ipc(ctypes.CDLL(sys.argv[1]))
print(os.getpid(), flush=True)
sys.stdin.readline()  # someone may take the socket name this pid would once have had
fd = os.memfd_create("foundry-ipc-test")
os.write(fd, b"exported anyway")
print(ipc.export(fd, rank_slot=0, region_base=0x600000000000, offset=0, size=4096).hex(), flush=True)
sys.stdin.readline()
"""


def test_a_process_holding_the_pid_socket_name_cannot_stop_an_export(hook_library, ipc):
    """The socket name carries a random key: squatting ``@foundry-ipc-<pid>`` (all another
    local user could guess) no longer makes the export fail."""
    import socket

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen([sys.executable, "-c", WAITING_EXPORTER, str(hook_library), root], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        pid = int(proc.stdout.readline())
        squatter.bind(f"\0foundry-ipc-{pid}")
        squatter.listen(1)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        line = proc.stdout.readline().strip()
        assert line, proc.stderr.read() if proc.poll() is not None else "no handle"
        raw = bytes.fromhex(line)
        assert socket_name(raw) != f"\0foundry-ipc-{pid}"
        fd = ipc.open(raw)
        assert os.pread(fd, 15, 0) == b"exported anyway"
        assert ipc.close(raw) == 0
    finally:
        squatter.close()
        proc.stdin.write("done\n")
        proc.stdin.flush()
        proc.wait(timeout=30)


def test_clients_that_connect_and_say_nothing_do_not_stall_the_server(exporter, ipc):
    import socket

    _, raw = exporter
    silent = []
    for _ in range(100):  # more than the server waits on at once
        client = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        client.connect(socket_name(raw))
        silent.append(client)
    try:
        started = time.perf_counter()
        fd = ipc.open(raw)
        took = time.perf_counter() - started
        assert os.pread(fd, len(PAYLOAD), 0) == PAYLOAD
        assert took < 1.0, f"the import waited {took:.1f} s behind clients that said nothing"
        assert ipc.close(raw) == 0
    finally:
        for client in silent:
            client.close()


IMPOSTOR_OF_ANOTHER_USER = r"""
import os, socket, sys, time
os.setgid(65534); os.setuid(65534)
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.bind("\0" + sys.argv[1])
s.listen(1)
print("listening", flush=True)
conn, _ = s.accept()
print("token sent" if conn.recv(64) else "nothing sent", flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
def test_a_peer_of_another_user_is_blamed_as_the_peer(ipc):
    """Another user's process answering on the exporter's socket is named as that, not as
    the exporter refusing this importer."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    raw = forged_handle(sleeper.pid, key=bytes(range(8, 16)))
    impostor = subprocess.Popen([sys.executable, "-c", IMPOSTOR_OF_ANOTHER_USER, socket_name(raw)[1:]],
                                stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert impostor.stdout.readline().strip() == "listening"
        with pytest.raises(IpcError) as err:
            ipc.open(raw)
        assert "answering on the exporter's socket runs as another user" in str(err.value)
        assert "the importer runs as another user" not in str(err.value)
        assert impostor.communicate(timeout=30)[0].strip() == "nothing sent"  # the token stayed here
    finally:
        for proc in (sleeper, impostor):
            proc.kill()
            proc.wait()

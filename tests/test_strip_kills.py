"""``foundry archive strip`` (foundry/archive/strip.py) is atomic: killed with SIGKILL at any point, it leaves the
archive it started from (the same catalog bytes) or the finished strip, and
``foundry archive verify`` passes on what it left; a strip run again finishes the job
and removes what killed writes left behind.

The kills are real: each strip runs in a child process (``os.fork``) that sends
itself SIGKILL. "After the Nth file operation" is counted in the child by wrapping
the calls a write or a removal makes (``tempfile.mkstemp``, ``os.fsync``,
``os.replace``, ``os.unlink``): the Nth one returns, then the child kills itself.
"At a random moment" is an interval timer whose handler kills the child, armed
at a delay drawn (from a fixed seed) over the time a strip takes.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import tempfile
import time
from pathlib import Path

import pytest

from foundry.archive import Archive
from foundry.archive.files import atomic_write
from foundry.archive.schema import CATALOG_FILE, ModuleState
from foundry.archive.strip import strip

from .hostile import saved_archive


def catalog_digest(root: Path) -> str:
    return hashlib.sha256((root / CATALOG_FILE).read_bytes()).hexdigest()


def temporaries(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.tmp"))


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def states(tmp_path_factory) -> dict[str, object]:
    """The archive before and after a whole strip: catalog digests and file sets."""
    base = tmp_path_factory.mktemp("strip")
    original = saved_archive(base / "original")
    done = base / "done"
    os.system(f"cp -a {original} {done}")  # byte-identical copy, as the kill tests start from
    strip(Archive.open(done))
    return {"original": original, "before": catalog_digest(original), "after": catalog_digest(done),
            "files_before": files(original), "files_after": files(done)}  # fmt: skip


def _in_child(run) -> int:
    """Run ``run()`` in a forked child; its wait status as an exit code (-9: killed by SIGKILL)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            run()
            os._exit(0)
        except BaseException:  # noqa: BLE001 - any failure is the child's exit status
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _killed_after(n: int | None, path: Path) -> None:
    """Strip ``path``, killing this process right after its ``n``-th file operation
    (``None``: never; then print how many there were)."""
    count = [0]

    def counting(fn):
        def wrapped(*args, **kwargs):
            result = fn(*args, **kwargs)
            count[0] += 1
            if count[0] == n:
                os.kill(os.getpid(), signal.SIGKILL)
            return result

        return wrapped

    tempfile.mkstemp = counting(tempfile.mkstemp)
    for name in ("fsync", "replace", "unlink"):
        setattr(os, name, counting(getattr(os, name)))
    strip(Archive.open(path))
    if n is None:
        (path.parent / f"{path.name}.ops").write_text(str(count[0]))


def _killed_at(delay: float, path: Path) -> None:
    signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGKILL))
    signal.setitimer(signal.ITIMER_REAL, delay)
    strip(Archive.open(path))
    signal.setitimer(signal.ITIMER_REAL, 0)


def _fresh(states, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    os.system(f"cp -a {states['original']} {path}")
    return path


def _check_left(cli, states, path: Path) -> str:
    """What a killed strip left is the original or the strip, verify passes, and a second strip finishes it."""
    digest = catalog_digest(path)
    assert digest in (states["before"], states["after"]), "the catalog is neither the original nor the strip"
    if digest == states["before"]:
        assert (
            files(path) - {p for p in files(path) if p.endswith((".tmp", "session.stripped.json"))}
            == states["files_before"]
        ), "a file of the original went missing before the commit"
    verified = cli.run("archive", "verify", path)
    assert verified.rc == 0 and "all ok" in verified.stdout, str(verified)
    strip(Archive.open(path))
    assert catalog_digest(path) == states["after"]
    assert files(path) == states["files_after"], "the second strip left files the stripped archive does not name"
    assert not temporaries(path)
    return "original" if digest == states["before"] else "stripped"


def test_the_stripped_archive_names_no_removed_file(states):
    archive = Archive.open(states["original"])
    assert archive.catalog.modules.state is ModuleState.COMPLETE
    stripped = states["files_before"] - states["files_after"]
    assert sorted(stripped) == sorted([f"modules/{b.sha256}.bin" for b in archive.catalog.modules.blobs]
                                      + ["rank0/warmup.bin", "rank0/session.json"])  # fmt: skip
    assert states["files_after"] - states["files_before"] == {"rank0/session.stripped.json"}


def test_a_strip_killed_after_each_file_operation_leaves_the_original_or_the_strip(cli, states, tmp_path):
    counted = _fresh(states, tmp_path, "counted")
    assert _in_child(lambda: _killed_after(None, counted)) == 0
    operations = int((tmp_path / "counted.ops").read_text())
    assert operations >= 10  # sessions and the catalog written (temporary, fsync, replace), files removed
    seen = set()
    for n in range(1, operations + 1):
        path = _fresh(states, tmp_path, f"killed-{n}")
        assert _in_child(lambda p=path, k=n: _killed_after(k, p)) == -signal.SIGKILL, n
        seen.add(_check_left(cli, states, path))
    assert seen == {"original", "stripped"}  # kills on both sides of the commit


def test_a_strip_killed_at_50_random_moments_leaves_the_original_or_the_strip(cli, states, tmp_path):
    timing = _fresh(states, tmp_path, "timing")
    started = time.perf_counter()
    assert _in_child(lambda: strip(Archive.open(timing))) == 0
    took = time.perf_counter() - started
    draw = random.Random(26)
    for i in range(50):
        path = _fresh(states, tmp_path, f"moment-{i}")
        delay = draw.uniform(0.0005, took * 1.2)
        status = _in_child(lambda p=path, d=delay: _killed_at(d, p))
        assert status in (0, -signal.SIGKILL), status
        _check_left(cli, states, path)


def test_a_write_removes_the_temporaries_killed_writers_left(tmp_path):
    target = tmp_path / "foundry-archive.json"

    def killed_mid_write() -> None:
        os.replace = lambda *_: os.kill(os.getpid(), signal.SIGKILL)  # the temporary is written, never renamed
        atomic_write(target, b"new")

    assert _in_child(killed_mid_write) == -signal.SIGKILL
    left = temporaries(tmp_path)
    assert len(left) == 1 and left[0].name.startswith(".foundry-archive.json.")
    other = tmp_path / ".foundry-archive.json.elsewhere.1.abc.tmp"  # another host's writer: not ours to judge
    other.write_bytes(b"")
    atomic_write(target, b"later")
    assert target.read_bytes() == b"later" and temporaries(tmp_path) == [other]

"""``foundry run`` (foundry/runtime/launch/launcher.py): the child's environment, the
layouts of a SAVE's runs and the command line, with real programs standing in for
the application."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from foundry.archive import Archive
from foundry.errors import DriftError, HookError
from foundry.runtime.launch import launcher
from foundry.runtime.sessions.validate import check_region

from .archive_tools import edit_json
from .conftest import FIXTURES, SAVE_A


def test_load_takes_the_region_saved_or_relocates_when_asked(tmp_path, with_hook):
    record = Archive.open(SAVE_A).session(0).region
    env = launcher.environment(launcher.RunConfig("load", SAVE_A), base_env={"LD_PRELOAD": "/x/other.so"})
    assert env["FOUNDRY_REGION_BASE"] == hex(record.base) and env["FOUNDRY_REGION_SIZE"] == str(record.size)
    assert env["LD_PRELOAD"].split(":")[0].endswith("libfoundry_hook.so") and "/x/other.so" in env["LD_PRELOAD"]
    assert env["FOUNDRY_MODE"] == "load" and env["FOUNDRY_RELOCATE"] == "0" and "PYTHONHASHSEED" not in env
    assert env["FOUNDRY_HOOK_ECHO"] == "1" and env["FOUNDRY_REGION_THREADS"] == "owner"
    threads = launcher.RunConfig("load", SAVE_A, region_threads="any")
    assert launcher.environment(threads, base_env={})["FOUNDRY_REGION_THREADS"] == "any"
    shifted = record.base + (16 << 30)
    moved = launcher.environment(launcher.RunConfig("load", SAVE_A, region_base=shifted), base_env={})
    assert moved["FOUNDRY_REGION_BASE"] == hex(shifted) and moved["FOUNDRY_RELOCATE"] == "1"
    with pytest.raises(DriftError, match="needs --warmup replay") as err:
        launcher.environment(launcher.RunConfig("load", SAVE_A, region_base=shifted, warmup="restore"), base_env={})
    assert err.value.field == "region.base"
    with pytest.raises(DriftError, match="no region record"):
        launcher.environment(launcher.RunConfig("load", FIXTURES / "tiny-qwen3"), base_env={})


def test_save_gets_a_fixed_layout_unless_asked_not_to(tmp_path, with_hook):
    config = launcher.RunConfig("save", tmp_path / "a")
    assert launcher.environment(config, base_env={})["PYTHONHASHSEED"] == "0"
    assert launcher.preexec(config) is not None
    assert launcher.preexec(launcher.RunConfig("save", tmp_path / "a", fixed_layout=False)) is None
    assert launcher.preexec(launcher.RunConfig("load", SAVE_A)) is None


def test_the_second_save_run_moves_the_layout(tmp_path, with_hook):
    # A real program standing in for the application: it "saves" by copying a real
    # H200 SAVE to the archive path it is given and notes the padding it saw.
    seen = tmp_path / "pads.txt"
    code = (
        "import os, shutil, sys; shutil.copytree(sys.argv[1], os.environ['FOUNDRY_ARCHIVE']); "
        "open(sys.argv[2], 'a').write(str(len(os.environ.get('FOUNDRY_LAYOUT_PAD', ''))) + ' ' "
        "+ os.environ.get('FOUNDRY_SAVE_FIRST_RUN', '-') + ' ' + os.environ.get('MALLOC_PERTURB_', '-') + ' ')"
    )
    config = launcher.RunConfig("save", tmp_path / "a")
    code_ = launcher.run(config, [sys.executable, "-c", code, str(SAVE_A), str(seen)], save_runs=3, log=lambda _: None)
    first, first_ref, first_fill, *later = seen.read_text().split()
    assert code_ == 0 and int(first) == 0 and first_ref == "-" and first_fill == "-"
    pads, refs, fills = later[0::3], later[1::3], [int(f) for f in later[2::3]]
    assert all(int(pad) > 4096 and int(pad) % 16 for pad in pads) and pads[0] != pads[1]  # moves the stack > a page
    assert refs == [str((tmp_path / "a").resolve())] * 2  # later runs see the first's archive
    # each later run's heap is filled with its own bytes (the fill and its complement), never 0 or 0xff
    filled = [{fill, fill ^ 0xFF} for fill in fills]
    assert not filled[0] & filled[1] and not {0, 0xFF} & (filled[0] | filled[1])
    assert not list(tmp_path.glob(".a.run*"))  # the second run's archive is merged and removed


_MALLOC_TWICE = """
import ctypes
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = libc.free.argtypes = [ctypes.c_void_p]
fresh = ctypes.string_at(libc.malloc(4096), 4096)
small = libc.malloc(64)
ctypes.memset(small, 0x11, 64)  # a leftover, freed and allocated again
libc.free(small)
again = libc.malloc(64)
print(fresh.hex(), ctypes.string_at(again, 64).hex())
"""


def test_a_later_runs_heap_fill_reaches_what_malloc_returns(tmp_path, with_hook):
    # fresh blocks and recycled small ones (glibc's per-thread cache would hand those back
    # unfilled) come with the complement of the run's fill, not with what was left in them
    later = launcher._later_run(launcher.RunConfig("save", tmp_path / "a"), 2)
    env = launcher.environment(later, base_env={"PATH": os.environ.get("PATH", ""), "GLIBC_TUNABLES": "a.b=1"})
    assert env["GLIBC_TUNABLES"] == "a.b=1:glibc.malloc.tcache_count=0"  # the user's tunables kept
    out = subprocess.run([sys.executable, "-c", _MALLOC_TWICE], env=env, capture_output=True, text=True, check=True)
    fresh, again = (bytes.fromhex(h) for h in out.stdout.split())
    fill = bytes([later.heap_fill ^ 0xFF])
    assert fresh == fill * 4096 and again == fill * 64
    first = launcher.environment(launcher.RunConfig("save", tmp_path / "a"), base_env={})
    assert "MALLOC_PERTURB_" not in first and "GLIBC_TUNABLES" not in first  # the kept run is left alone


def test_the_launcher_refuses_without_a_built_hook(monkeypatch, tmp_path):
    monkeypatch.setattr(launcher, "library_path", lambda: None)
    with pytest.raises(HookError, match="not built"):
        launcher.environment(launcher.RunConfig("save", tmp_path / "a"), base_env={})


def test_foundry_run_on_the_command_line(tmp_path, with_hook):
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "foundry", "run", *args], capture_output=True, text=True)

    code = "import os; print(os.environ['FOUNDRY_MODE'], open('/proc/self/personality').read().strip())"
    wrote_nothing = run("--mode", "save", "--no-jit-caches", "--archive", str(tmp_path / "a"), "--", sys.executable,
                        "-c", code)  # fmt: skip
    assert wrote_nothing.stdout.split() == ["save", "00040000"], wrote_nothing.stderr  # no randomisation
    assert wrote_nothing.returncode == 2 and "wrote no archive" in wrote_nothing.stderr
    failing = run("--mode", "save", "--archive", str(tmp_path / "a"), "--", sys.executable, "-c", "raise SystemExit(5)")
    assert failing.returncode == 5  # the program's own exit code
    missing = run("--mode", "load", "--archive", str(tmp_path / "nothing"), "--", "true")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "no such archive" in missing.stderr
    absent = run("--mode", "save", "--archive", str(tmp_path / "a"), "--", "no-such-program-here")
    assert absent.returncode == 2 and "command not found" in absent.stderr
    existing = tmp_path / "existing"
    shutil.copytree(SAVE_A, existing)
    kept = run("--mode", "save", "--archive", str(existing), "--", sys.executable, "-c", "print('ran')")
    assert kept.returncode == 2 and "already holds an archive" in kept.stderr and "ran" not in kept.stdout
    assert Archive.open(existing).entries(0) == Archive.open(SAVE_A).entries(0)  # nothing already saved is lost
    bad = run("--mode", "save", "--archive", str(tmp_path / "a"), "--region-base", "nowhere", "--", "true")
    assert bad.returncode == 2 and "not an address" in bad.stderr
    size = "import os; print(os.environ['FOUNDRY_REGION_SIZE'])"
    for text in ("0x1a00000000", "104GiB", "111669149696"):  # one size, as the recipes' docs write it
        sized = run("--mode", "save", "--no-jit-caches", "--region-size", text, "--archive", str(tmp_path / "a"),
                    "--", sys.executable, "-c", size)  # fmt: skip
        assert int(sized.stdout, 0) == 104 << 30, (text, sized.stderr)
    for text, why in (
        ("0.5GiB", "not a size"),
        ("100MiB", "below 1 GiB"),
        ("1" + "0" * 40, "128 TiB or more"),
        ("128TiB", "128 TiB or more"),
    ):
        refused = run("--mode", "save", "--region-size", text, "--archive", str(tmp_path / "a"), "--", "true")
        assert refused.returncode == 2 and why in refused.stderr and "Traceback" not in refused.stderr, text


def test_edits_that_break_the_region_record_are_caught(tmp_path, with_hook):
    root = tmp_path / "a"
    shutil.copytree(SAVE_A, root)
    edit_json(root / "rank0" / "session.json", lambda s: s["region"].update(base=0x500000000000), root=root)
    record = Archive.open(root).session(0).region
    with pytest.raises(DriftError) as err:
        check_region(record, 0x600000000000, 64 << 30)
    assert err.value.expected == "0x500000000000"
    env_before = dict(os.environ)
    assert launcher.environment(launcher.RunConfig("load", root))["FOUNDRY_REGION_BASE"] == "0x500000000000"
    assert dict(os.environ) == env_before  # the launcher never changes its own environment


def test_a_save_stopped_after_writing_says_the_second_run_was_not_made(tmp_path, with_hook):
    code = "import os, shutil, sys; shutil.copytree(sys.argv[1], os.environ['FOUNDRY_ARCHIVE']); sys.exit(143)"
    lines: list[str] = []
    config = launcher.RunConfig("save", tmp_path / "a")
    assert launcher.run(config, [sys.executable, "-c", code, str(SAVE_A)], log=lines.append) == 143
    assert len(lines) == 1 and "exited with 143 after writing" in lines[0] and "--save-runs 1" in lines[0]

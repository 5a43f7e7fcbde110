"""``foundry run`` checks before the program starts, and a LOAD must have opened a session.

Real archives, the real hook built for this run, the real ``foundry`` command in a child
process and real programs under it. Each program would leave a file if it ran, so a
refusal made before it started is told apart from one it made itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from foundry.archive import Archive
from foundry.archive.schema import CATALOG_FILE
from foundry.archive.strip import strip

from .archive_tools import edit_json
from .hostile import saved_archive

RAN = "import pathlib, sys; pathlib.Path(sys.argv[1]).write_text('ran')"
OPENS = ("import pathlib, sys; pathlib.Path(sys.argv[1]).write_text('ran')\n"
         "from foundry.runtime import open_session\nsession = open_session()\nsession.start()\n")  # fmt: skip


def _run(
    archive: Path, program: str, witness: Path, *extra: str, env: dict | None = None
) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "foundry", "run", "--mode", "load", "--archive", str(archive), *extra, "--",
            sys.executable, "-c", program, str(witness)]  # fmt: skip
    return subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)


def _refused_before_start(proc: subprocess.CompletedProcess, witness: Path, match: str) -> str:
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("foundry: error: "), proc.stderr
    assert match in lines[0], lines[0]
    assert not witness.exists(), "the program started"
    return lines[0]


def _torch_here() -> str | None:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


@pytest.fixture
def complete(tmp_path) -> Path:
    """A complete SAVE (graphs and region of a real H200 SAVE, module images, warm-up bytes),
    recorded with the torch installed here, if any (the launcher compares it)."""
    root = saved_archive(tmp_path / "a")
    if _torch_here() is not None:
        edit_json(root / CATALOG_FILE, lambda c: c["environment"].update(torch_version=_torch_here()))
    return root


def test_a_complete_archive_passes_and_the_program_starts(complete, tmp_path, with_hook):
    witness = tmp_path / "ran"
    proc = _run(complete, RAN, witness)
    assert witness.read_text() == "ran"  # the checks passed: the program ran (and opened no session)
    assert proc.returncode == 2 and "never opened a LOAD session: nothing was restored" in proc.stderr


HOOK_LINE = re.compile(r"^foundry: hook: ([0-9.]+) ms of its own before CUDA started "
                       r"\((\d+) symbol lookups, (\d+) constructors(; CUDA never started)?\)$", re.M)  # fmt: skip


def test_the_hook_says_its_own_time_before_cuda_started(complete, tmp_path, with_hook):
    # each extension module Python imports is a dlsym through the hook: counted, none of them the driver's
    imports = "import _ctypes, _decimal, _sqlite3, _ssl, _bz2, _lzma"
    found = HOOK_LINE.search(_run(complete, imports, tmp_path / "ran").stderr)
    assert found and found[4] == "; CUDA never started" and int(found[3]) == 2
    assert 0 < float(found[1]) < 1000 and int(found[2]) >= 6
    fewer = HOOK_LINE.search(_run(complete, "pass", tmp_path / "ran").stderr)
    assert fewer and int(fewer[2]) < int(found[2])  # the lookups are the program's own, counted
    # a driver entry point asked for (there is no driver here: ctypes finds none) ends the count
    starts = "import ctypes\ntry:\n    ctypes.CDLL(None).cuMemAlloc_v2\nexcept AttributeError:\n    pass\n" + imports
    started = HOOK_LINE.search(_run(complete, starts, tmp_path / "ran").stderr)
    assert started and started[4] is None and int(started[2]) < int(found[2])


def _scratch_env(tmp_path: Path) -> tuple[dict, Path]:
    """The environment of a run whose temporary files go to a directory of its own."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    return {**os.environ, "TMPDIR": str(scratch)}, scratch


def test_a_load_becomes_the_program_and_its_hook_fails_an_exit_0_without_a_session(complete, tmp_path, with_hook):
    env, scratch = _scratch_env(tmp_path)
    proc = _run(complete, "import os, sys; open(sys.argv[1], 'w').write(str(os.getpid()))", tmp_path / "pid", env=env)
    assert proc.returncode == 2 and proc.stderr.strip().endswith("foundry.runtime.open_session()?)"), proc.stderr
    assert proc.stderr.count("never opened a LOAD session") == 1
    assert list(scratch.iterdir()) == []  # the marker's directory removed by the hook


def test_a_load_keeps_the_programs_own_failure(complete, tmp_path, with_hook):
    env, scratch = _scratch_env(tmp_path)
    proc = _run(complete, "import sys; sys.exit(3)", tmp_path / "ran", env=env)
    assert proc.returncode == 3 and "never opened" not in proc.stderr, proc.stderr
    assert list(scratch.iterdir()) == []


def test_a_session_opened_in_a_child_process_counts(complete, tmp_path, with_hook):
    # the session's own marker call, made in a child as a server's scheduler process would
    # (opening a real session needs a GPU)
    child = "from foundry.runtime.sessions.marker import note_session; note_session('load')"
    program = f"import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', {child!r}]))"
    env, scratch = _scratch_env(tmp_path)
    proc = _run(complete, program, tmp_path / "ran", env=env)
    assert proc.returncode == 0 and "never opened" not in proc.stderr, proc.stderr
    assert list(scratch.iterdir()) == []


def test_a_child_forked_by_the_program_is_not_checked_in_its_place(complete, tmp_path, with_hook):
    # the program opens its session, then forks a child that exits as Python does (exit handlers run):
    # the child inherits the hook's exit handler, and must neither take the marker nor fail
    program = ("import os, sys\nfrom foundry.runtime.sessions.marker import note_session\nnote_session('load')\n"
               "pid = os.fork()\nif pid == 0:\n    sys.exit(0)\nos.waitpid(pid, 0)\n")  # fmt: skip
    env, scratch = _scratch_env(tmp_path)
    proc = _run(complete, program, tmp_path / "ran", env=env)
    assert proc.returncode == 0 and "never opened" not in proc.stderr, proc.stderr
    assert list(scratch.iterdir()) == []


def test_a_program_that_cannot_start_is_one_line_and_leaves_no_marker(complete, tmp_path, with_hook):
    env, scratch = _scratch_env(tmp_path)
    args = [sys.executable, "-m", "foundry", "run", "--mode", "load", "--archive", str(complete), "--",
            str(tmp_path / "no-such-program")]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("foundry: error")]
    assert proc.returncode == 2 and len(errors) == 1 and "command not found" in errors[0], proc.stderr
    assert list(scratch.iterdir()) == []


def test_a_stripped_archive_is_refused_before_the_program_starts(complete, tmp_path, with_hook):
    strip(Archive.open(complete))
    _refused_before_start(_run(complete, RAN, tmp_path / "ran"), tmp_path / "ran",
                          "module images were stripped (foundry archive strip)")  # fmt: skip


def test_a_missing_or_shortened_file_is_refused(complete, tmp_path, with_hook):
    entry = Archive.open(complete).entries(0)[0]
    graph = complete / "rank0" / entry.file
    graph.write_bytes(graph.read_bytes()[:-10])
    _refused_before_start(_run(complete, RAN, tmp_path / "ran"), tmp_path / "ran", "has another size than recorded")
    graph.unlink()
    line = _refused_before_start(_run(complete, RAN, tmp_path / "ran"), tmp_path / "ran", "incomplete")
    assert f"graph {entry.name!r} is missing" in line


def test_a_missing_module_image_is_refused(complete, tmp_path, with_hook):
    next((complete / "modules").iterdir()).unlink()
    _refused_before_start(_run(complete, RAN, tmp_path / "ran"), tmp_path / "ran", "module image")


def test_a_backend_the_archive_needs_and_this_machine_lacks_is_refused(complete, tmp_path, with_hook):
    """Backends are discovered only for archives that record one: such an archive is still checked."""
    state = {"backend": "nccl-ipc-from-elsewhere", "version": 1, "record": {}}
    edit_json(complete / "rank0" / "session.json", lambda s: s.update(backends=[state]), root=complete)
    _refused_before_start(_run(complete, RAN, tmp_path / "ran"), tmp_path / "ran",
                          "archive needs backend 'nccl-ipc-from-elsewhere', which is not installed")  # fmt: skip


def test_a_newer_format_another_rank_or_no_archive_is_refused(complete, tmp_path, with_hook):
    witness = tmp_path / "ran"
    _refused_before_start(_run(complete, RAN, witness, "--rank", "3"), witness, "archive has no rank 3")
    _refused_before_start(_run(tmp_path / "nothing", RAN, witness), witness, "no such archive")
    edit_json(complete / CATALOG_FILE, lambda c: c.update(format_version=99))
    _refused_before_start(_run(complete, RAN, witness), witness, "written by a newer Foundry")


def test_torch_of_another_version_is_refused_when_the_program_runs_here(complete, tmp_path, with_hook):
    here = _torch_here()
    if here is None:
        pytest.skip("torch is not installed here: the LOAD compares it on the GPU")
    edit_json(complete / CATALOG_FILE, lambda c: c["environment"].update(torch_version="1.0.0+old"))
    line = _refused_before_start(_run(complete, RAN, tmp_path / "ran"), tmp_path / "ran", "another torch")
    assert "1.0.0+old" in line and here in line


def _fake_torch(site: Path, version: str, metadata_version: str) -> dict:
    """An environment whose first torch is a package at ``site`` saying ``version`` of itself, its
    distribution's metadata ``metadata_version`` (a CUDA build's may leave out the local part)."""
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("")
    (site / "torch" / "version.py").write_text(f"__version__ = '{version}'\ncuda = None\n")
    info = site / f"torch-{metadata_version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {metadata_version}\n")
    return {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def test_torch_is_compared_as_it_names_itself_not_as_its_metadata_does(complete, tmp_path, with_hook):
    env = _fake_torch(tmp_path / "site", "2.11.0+cu130", "2.11.0")
    edit_json(complete / CATALOG_FILE, lambda c: c["environment"].update(torch_version="2.11.0+cu130"))
    witness = tmp_path / "ran"
    proc = _run(complete, RAN, witness, env=env)
    assert witness.exists() and "another torch" not in proc.stderr, proc.stderr  # the checks passed
    edit_json(complete / CATALOG_FILE, lambda c: c["environment"].update(torch_version="2.11.0+cu126"))
    witness.unlink()
    line = _refused_before_start(_run(complete, RAN, witness, env=env), witness, "another torch")
    assert "'2.11.0+cu126'" in line and "'2.11.0+cu130'" in line


def test_a_session_opened_without_a_cuda_gpu_says_so_in_one_line(complete, tmp_path, with_hook):
    witness = tmp_path / "ran"
    proc = _run(complete, OPENS, witness)
    assert witness.exists()  # the program ran and opened its session
    # one error line of Foundry's (torch may warn on import, about numpy, on its own lines; the
    # launcher times itself on one, the hook on another)
    timings = ("foundry: launcher: ", "foundry: hook: ")
    lines = [line for line in proc.stderr.splitlines() if line.startswith("foundry") and not line.startswith(timings)]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("foundry: error: SAVE/LOAD needs a CUDA GPU"), lines[0]
    try:
        import torch
    except ImportError:
        assert "torch is not installed here" in lines[0]
    else:
        assert torch.__version__ in lines[0]


def test_a_save_that_opens_no_session_says_which(tmp_path, with_hook):
    args = [sys.executable, "-m", "foundry", "run", "--mode", "save", "--save-runs", "1", "--archive",
            str(tmp_path / "out"), "--", sys.executable, "-c", "pass"]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "never opened a SAVE session: it wrote no archive" in proc.stderr
    opens = "from foundry.runtime import open_session\nopen_session()\n"
    again = subprocess.run([*args[:-2], "-c", opens], capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "opened a SAVE session but wrote no archive" in again.stderr, again.stderr


def test_a_load_restoring_warmups_the_archive_did_not_keep_is_refused_quoting_why(complete, tmp_path, with_hook):
    # as SGLang's SAVE leaves an archive whose graphs read what its warm-ups kept: no warm-up bytes, a verdict
    witness = tmp_path / "ran"
    verdict = "unsafe: prefill.t8192 node 9 points at 0x600697200200, in a block of torch's that a warm-up kept"

    def unsafe(session: dict) -> None:
        session["region"]["warmup_bytes"] = None

    edit_json(complete / CATALOG_FILE, lambda c: c["model"].update({"sglang.warmup_skip": verdict}))
    edit_json(complete / "rank0" / "session.json", unsafe, root=complete)
    refused = "the archive kept no warm-up bytes to restore (LOAD with --warmup replay)"
    line = _refused_before_start(_run(complete, RAN, witness, "--warmup", "restore"), witness, refused)
    assert "region.warmup_bytes" in line and verdict in line
    _run(complete, RAN, witness)  # repeating the warm-ups needs no bytes of theirs: the program starts
    assert witness.read_text() == "ran"
    witness.unlink()
    strip(Archive.open(complete))  # an incomplete archive is refused as such first, in either warm-up mode
    _refused_before_start(_run(complete, RAN, witness, "--warmup", "restore"), witness, "module images were stripped")

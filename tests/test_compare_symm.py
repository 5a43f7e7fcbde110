"""recipes/torch/compare_symm.py, the check the symmetric-memory runs on the GPU end
with, on reports written here: it must tell identical outputs from different ones,
a moved buffer from one that stayed, and refuse a report it cannot read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "recipes" / "torch" / "compare_symm.py"


def report(path: Path, *, one_shot: str = "a" * 64, buffer: str = "b" * 64, address: str = "0x7f0000000000",
           relocations: dict | None = None) -> Path:  # fmt: skip
    session = {"mode": "load", "relocations": relocations} if relocations else {"mode": "save"}
    path.write_text(json.dumps({"one_shot_sha256": one_shot, "buffer_sha256": buffer, "buffer_address": address,
                                "session": session, "spare": False}))  # fmt: skip
    return path


def compare(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def test_a_relocated_load_with_the_same_outputs_passes(tmp_path):
    base, save = report(tmp_path / "b.json"), report(tmp_path / "s.json")
    load = report(tmp_path / "l.json", address="0x7f1000000000",
                  relocations={"symm.buffer": {"operands": 1, "moved": 1}})  # fmt: skip
    proc = compare(base, save, "--moved", load)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("identical") == 3 and "relocated: symm.buffer 1 (1 moved)" in proc.stdout


def test_a_different_output_or_an_unmoved_buffer_fails(tmp_path):
    base, save = report(tmp_path / "b.json"), report(tmp_path / "s.json")
    proc = compare(base, save, report(tmp_path / "x.json", buffer="c" * 64))
    assert proc.returncode == 1 and "DIFFERENT" in proc.stdout and "buffer_sha256" in proc.stdout
    proc = compare(base, save, "--moved", report(tmp_path / "l.json"))
    assert proc.returncode == 1 and "NOT MOVED" in proc.stdout


def test_an_unreadable_report_is_refused_in_one_line(tmp_path):
    base = report(tmp_path / "b.json")
    (tmp_path / "bad.json").write_text('{"one_shot_sha256": 3}')
    proc = compare(base, tmp_path / "bad.json")
    assert proc.returncode == 1 and "not a report of symm_allreduce.py" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert compare(base, tmp_path / "missing.json").returncode == 2

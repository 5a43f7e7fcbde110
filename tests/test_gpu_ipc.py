"""Region memory shared between two processes on one GPU through the hook's IPC path:
cuIpcGetMemHandle / cuIpcOpenMemHandle / cuIpcCloseMemHandle with Foundry handles,
peer memory mapped at a deterministic address, counted opens, and refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
ZONE = 0x700000000000
SLOT = 64 << 30  # the default region size


def _env(hook_library, rank: int, **extra: str) -> dict[str, str]:
    return {**os.environ, "LD_PRELOAD": str(hook_library), "FOUNDRY_MODE": "save", "FOUNDRY_RANK": str(rank),
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **extra}  # fmt: skip


def _pair(tmp_path, hook_library, role: str, **importer_env: str) -> tuple[dict, dict]:
    probe = [sys.executable, str(ROOT / "tests" / "ipc_probe.py")]
    exporter = subprocess.Popen([*probe, "export", str(tmp_path)], env=_env(hook_library, 0),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.time() + 120
        while not (tmp_path / "export.json").exists() and time.time() < deadline:
            assert exporter.poll() is None, exporter.communicate()[1][-2000:]
            time.sleep(0.2)
        exported = json.loads((tmp_path / "export.json").read_text())
        proc = subprocess.run([*probe, role, str(tmp_path)], env=_env(hook_library, 1, **importer_env),
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        assert lines, proc.stderr[-3000:]
        return exported, json.loads(lines[-1])
    finally:
        (tmp_path / "done").write_text("")
        try:
            exporter.communicate(timeout=60)  # drains its pipes
        except subprocess.TimeoutExpired:
            exporter.kill()
            exporter.communicate()


def test_a_peer_tensor_maps_at_its_deterministic_address_and_is_counted(tmp_path, hook_library):
    exported, imported = _pair(tmp_path, hook_library, "import")
    assert exported["status"] == 0 and exported["same_handle_again"]
    assert imported["open_status"] == 0 and imported["second_status"] == 0, imported
    offset = exported["allocation"] - exported["region"]  # the open returns the allocation's start
    assert imported["first"] == imported["second"] == ZONE + 0 * SLOT + offset  # rank 0's slot, its offset
    assert exported["address"] == exported["allocation"]  # the probe's tensor starts its allocation
    assert imported["sum"] == exported["sum"] == imported["sum_after_one_close"]
    assert imported["close1"] == imported["close2"] == 0 and imported["close3"] != 0
    assert imported["counters"]["ipc_imports"] == 1  # two opens, one mapping


def test_a_peer_whose_region_sits_elsewhere_is_refused(tmp_path, hook_library):
    _, imported = _pair(tmp_path, hook_library, "import", FOUNDRY_REGION_BASE=hex(0x600000000000 + (1 << 40)))
    assert imported["open_status"] != 0
    assert any("the peer's region is at 0x600000000000" in line for line in imported["events"]), imported


def test_a_taken_import_zone_is_refused(tmp_path, hook_library):
    _, imported = _pair(tmp_path, hook_library, "take-zone")
    assert imported["open_status"] != 0
    assert any("the import zone at 0x700000000000 is taken" in line for line in imported["events"]), imported


def _ranks(tmp_path, phase: str, mode: str, archive: Path, **env: str) -> list[dict]:
    """Both ranks of the peer all-reduce recipe at once, under `foundry run`; their reports."""
    procs = []
    for rank in (0, 1):
        run = [sys.executable, "-m", "foundry", "run", "--mode", mode, "--rank", str(rank), "--archive", str(archive)]
        if mode == "save":
            run += ["--world-size", "2", "--save-runs", "1"]
        out = tmp_path / f"{phase}{rank}.json"
        cmd = [*run, "--", sys.executable, str(ROOT / "recipes" / "ipc" / "peer_allreduce.py"), "--rank", str(rank),
               "--exchange", str(tmp_path / f"exchange-{phase}"), "--out", str(out)]  # fmt: skip
        full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **env}
        procs.append((subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
                      out))  # fmt: skip
    reports = []
    for proc, out in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        reports.append(json.loads(out.read_text()))
    return reports


def test_two_processes_save_and_load_a_peer_allreduce_identically(tmp_path):
    from foundry.archive import Archive

    saved = _ranks(tmp_path, "save", "save", tmp_path / "a", FOUNDRY_SAVE_ID="save-a")
    saved2 = _ranks(tmp_path, "save2", "save", tmp_path / "b", FOUNDRY_SAVE_ID="save-b")
    loaded = _ranks(tmp_path, "load", "load", tmp_path / "a")
    assert Archive.open(tmp_path / "a").ranks == [0, 1]
    for rank in (0, 1):
        first, second, load = saved[rank], saved2[rank], loaded[rank]
        assert first["correct"] and second["correct"] and load["correct"], (first, load)
        assert first["out_sha256"] == second["out_sha256"] == load["out_sha256"]
        assert first["peer_address"] == second["peer_address"] == load["peer_address"]  # the same peer address
        assert load["session"]["counters"]["stream_captures"] == 0 and load["counters"]["ipc_imports"] == 1

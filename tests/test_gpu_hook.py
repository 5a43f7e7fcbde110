"""On a GPU: the native hook's deterministic region, in real processes under LD_PRELOAD."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from foundry.runtime.hook import library_path

pytestmark = pytest.mark.gpu

PROBE = Path(__file__).resolve().parent / "hook_probe.py"
BASE = 0x600000000000


def probe(**env: str) -> dict:
    lib = library_path()
    if lib is None:
        pytest.skip("libfoundry_hook.so is not built (make -C native)")
    full = {**os.environ, "LD_PRELOAD": str(lib), **env}
    proc = subprocess.run([sys.executable, str(PROBE)], env=full, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def inside(report: dict, address: int) -> bool:
    region = report["region"]
    return region["base"] <= address < region["base"] + region["size"]


def test_save_mode_gives_identical_addresses_in_two_processes():
    first, second = (probe(FOUNDRY_MODE="save", FOUNDRY_REGION_BASE=hex(BASE)) for _ in range(2))
    assert "error" not in first, first
    assert first["active"] and first["region"]["reserved"] and first["region"]["base"] == BASE
    assert all(inside(first, p) for p in first["ptrs"]), [hex(p) for p in first["ptrs"]]
    assert first["ptrs"] == second["ptrs"]
    assert first["trace"] == second["trace"] and len(first["trace"]) >= 3
    assert first["value"] == second["value"] and first["out_ok"]
    assert first["counters"]["stream_captures"] == 1
    assert first["counters"]["graph_instantiates"] >= 1
    print("region trace:", [(a["order"], hex(a["offset"]), a["size"]) for a in first["trace"]])


def test_off_mode_leaves_allocations_alone_but_still_counts():
    report = probe(FOUNDRY_MODE="off", FOUNDRY_REGION_BASE=hex(BASE))
    assert "error" not in report and report["out_ok"]
    assert not report["region"]["reserved"] and not any(BASE <= p < BASE + (64 << 30) for p in report["ptrs"])
    assert report["counters"]["stream_captures"] == 1


def test_a_base_the_driver_will_not_give_is_refused_by_name():
    report = probe(FOUNDRY_MODE="save", FOUNDRY_REGION_BASE=hex(0x10000000000))
    assert "error" in report  # torch sees the allocation fail
    assert any("region reserve" in e and "landed at" in e for e in report["events"]), report["events"]


REGISTRY_PROBE = Path(__file__).resolve().parent / "registry_probe.py"


def test_registry_names_the_image_of_every_kernel(tmp_path):
    """Under the hook, lowering finds the module image of every kernel of the fixture
    programs (cudart's libraries, cuBLAS, Triton's cubins); the archive stores each
    used image once, and its bytes hash to the recorded sha256."""
    lib = library_path()
    if lib is None:
        pytest.skip("libfoundry_hook.so is not built (make -C native)")
    env = {**os.environ, "LD_PRELOAD": str(lib), "FOUNDRY_MODE": "save", "FOUNDRY_REGION_BASE": hex(BASE)}
    proc = subprocess.run([sys.executable, str(REGISTRY_PROBE), str(tmp_path), "qwen3,compiled"], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    print(json.dumps(report, indent=1))
    assert not report["errors"], report["errors"]
    for key, program in report["programs"].items():
        assert program["with_image"] == program["kernels"], (key, program["without_image"])
        assert program["images"] and all(i["bytes_match"] for i in program["images"])
        assert program["module_state"] == "complete" and program["blobs"] == len(program["images"])
    assert any(i["copied"] for i in report["programs"]["compiled"]["images"])  # Triton's cubin is heap memory

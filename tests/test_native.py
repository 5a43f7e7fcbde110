"""The native hook on the CPU: it builds from its own sources with only the CUDA
headers, and its control API answers in a process without a GPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

NATIVE = Path(__file__).resolve().parent.parent / "native"
CUDA_HOME = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    if not (CUDA_HOME / "include" / "cuda.h").is_file() or shutil.which("cc") is None:
        pytest.skip(f"no CUDA headers under {CUDA_HOME} or no C compiler: the hook is not built here")
    build = tmp_path_factory.mktemp("native-build")
    proc = subprocess.run(["make", "-C", str(NATIVE), f"BUILD={build}", f"CUDA_HOME={CUDA_HOME}"],
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return build / "libfoundry_hook.so"


def exported(lib: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if " T " in line}


def test_builds_with_warnings_as_errors_and_exports_only_its_api(built):
    assert exported(built) == {
        "dlsym", "cuMemAlloc_v2", "cuMemFree_v2", "cuGetProcAddress_v2", "foundry_hook_abi", "foundry_hook_active",
        "foundry_region_info", "foundry_region_trace", "foundry_counter", "foundry_events", "foundry_registry_count",
        "foundry_registry_entry", "foundry_registry_find", "foundry_registry_copy", "foundry_region_map_to",
    }  # fmt: skip


def _query(lib: Path, **env: str) -> dict:
    code = (
        "import dataclasses, json\n"
        "from foundry.runtime.hook import Hook\n"
        "h = Hook.attach()\n"
        "print(json.dumps({'active': h.active(), 'region': dataclasses.asdict(h.region()),"
        " 'trace': h.trace(), 'counters': h.counters(), 'events': h.events(), 'images': h.image_count(),"
        " 'missing': h.find_image(0x1234, 'module')}))\n"
    )
    full = {**os.environ, "LD_PRELOAD": str(lib), **env}
    proc = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_control_api_without_a_gpu(built):
    report = _query(built, FOUNDRY_MODE="save", FOUNDRY_REGION_BASE="0x500000000000")
    assert report["active"] is False  # nothing resolved a driver entry point: the hook stays inert
    assert report["region"]["mode"] == "save" and report["region"]["reserved"] is False
    assert report["region"]["size"] == 64 << 30 and report["trace"] == []
    assert set(report["counters"].values()) == {0}
    assert report["events"] == ["region: mode save, base 0x500000000000, size 68719476736"]
    assert report["images"] == 0 and report["missing"] is None


def test_bad_settings_are_reported_not_fatal(built):
    report = _query(built, FOUNDRY_MODE="load", FOUNDRY_REGION_BASE="not-a-number")
    assert report["region"]["mode"] == "load"
    assert report["events"][0] == "error: FOUNDRY_REGION_BASE=not-a-number is not a number; using 0x600000000000"

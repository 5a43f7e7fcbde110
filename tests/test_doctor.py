"""Setting up: ``pip install`` says whether it built the native hook (on the terminal,
without -v), and ``foundry doctor`` says whether SAVE/LOAD can run, each missing part
with its fix. Everything here is real on this CPU machine: pip builds the package twice
(without and with CUDA headers) into directories of its own, and the doctor runs from
there. Only a GPU cannot exist here: one test stands one in, and says so."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest
from click.testing import CliRunner

from foundry.cli import main
from foundry.runtime.launch import doctor

from .conftest import CUDA_HOME

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("setup.py", "pyproject.toml", "README.md", "foundry", "tui", "native")
IGNORED = shutil.ignore_patterns("__pycache__", "build", "*.egg-info", "*.so")


def _install(tmp: Path, cuda_home: Path) -> tuple[Path, str]:
    """``pip install --target`` of a copy of this checkout, in a pseudo-terminal as a person
    runs it; the directory it installed into and what the terminal showed."""
    source, target = tmp / "src", tmp / "site"
    source.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=IGNORED)
        else:
            shutil.copy2(path, source / name)
    env = {**os.environ, "CUDA_HOME": str(cuda_home), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    args = ["-m", "pip", "install", "--no-deps", "--no-cache-dir", "--target", str(target), str(source)]
    child = pexpect.spawn(sys.executable, args, env=env, cwd=str(tmp), encoding="utf-8", timeout=600,
                          dimensions=(40, 200))  # fmt: skip
    shown = child.read()
    child.close()
    assert child.exitstatus == 0, shown
    return target, shown.replace("\r", "")


def _foundry(target: Path, *argv: str) -> subprocess.CompletedProcess:
    """The installed copy's ``foundry`` command (its directory first on the path, run elsewhere)."""
    env = {**os.environ, "PYTHONPATH": str(target)}
    env.pop("FOUNDRY_HOOK_LIB", None)
    return subprocess.run([sys.executable, "-m", "foundry", *argv], capture_output=True, text=True, env=env,
                          cwd=target.parent, timeout=600)  # fmt: skip


def _checks(proc: subprocess.CompletedProcess) -> dict[str, dict]:
    return {c["name"]: c for c in json.loads(proc.stdout)["checks"]}


def test_an_install_without_cuda_headers_says_so_and_the_doctor_names_the_fix(tmp_path):
    target, shown = _install(tmp_path, tmp_path / "no-cuda")
    assert f"foundry: native hook NOT built: no cuda.h under {tmp_path / 'no-cuda'}/include" in shown
    assert not (target / "foundry" / "_native").exists()
    version = _foundry(target, "--version")
    assert version.returncode == 0 and "native hook: not built; reinstall Foundry where cuda.h" in version.stdout
    found = _foundry(target, "doctor", "--json")
    assert found.returncode == 1 and json.loads(found.stdout)["ok"] is False
    hook = _checks(found)["native hook"]
    assert hook["status"] == "missing" and "reinstall Foundry where cuda.h" in hook["fix"]
    assert str(target) not in found.stderr and found.stderr == ""
    text = _foundry(target, "doctor")
    assert text.returncode == 1 and "missing  native hook: libfoundry_hook.so is not built" in text.stdout
    assert text.stdout.strip().splitlines()[-1].startswith("SAVE/LOAD cannot run here:")


def test_an_install_with_cuda_headers_builds_the_hook_and_the_doctor_loads_it(tmp_path):
    if not (CUDA_HOME / "include" / "cuda.h").is_file() or shutil.which("cc") is None:
        pytest.skip(f"no CUDA headers under {CUDA_HOME} or no C compiler: the hook cannot be built here")
    target, shown = _install(tmp_path, CUDA_HOME)
    assert "foundry: native hook built (libfoundry_hook.so in the package" in shown
    library = target / "foundry" / "_native" / "libfoundry_hook.so"
    assert library.is_file()
    assert f"native hook: {library}" in _foundry(target, "--version").stdout
    found = _foundry(target, "doctor", "--json")
    checks = _checks(found)
    assert checks["native hook"]["status"] == "ok" and str(library) in checks["native hook"]["detail"]
    assert checks["CUDA headers"]["status"] == "ok"
    # no GPU on this machine: the doctor says so, names the fix, and SAVE/LOAD cannot run
    assert checks["GPU"]["status"] == "missing" and checks["GPU"]["fix"]
    assert found.returncode == 1 and json.loads(found.stdout)["ok"] is False


def test_the_doctor_on_this_machine_names_every_part(cli, with_hook):
    found = cli.run("doctor", "--json")
    data = json.loads(found.stdout)
    names = [c["name"] for c in data["checks"]]
    assert names == ["native hook", "CUDA headers", "cuda-bindings", "zstandard", "NVIDIA driver", "GPU", "torch",
                     "SGLang", "backends"]  # fmt: skip
    for check in data["checks"]:
        assert check["status"] in ("ok", "missing", "warning", "info")
        if check["status"] == "missing":
            assert check["fix"], check  # every missing part comes with what to do
    assert found.rc == (0 if data["ok"] else 1)
    assert data["ok"] is False  # this machine has no GPU
    backends = next(c for c in data["checks"] if c["name"] == "backends")
    assert backends["status"] == "ok" and "torch-symm-mem" in backends["detail"]
    sglang = next(c for c in data["checks"] if c["name"] == "SGLang")
    assert "plugin registered" in sglang["detail"]  # pyproject.toml registers it in sglang.srt.plugins


def test_torch_is_asked_in_a_child_and_judged_by_what_it_can_reach():
    facts = doctor.probe_torch()
    check = doctor._torch(facts)
    try:
        import torch
    except ImportError:
        assert facts == {"installed": False} and check.status == "missing" and "not installed" in check.detail
        return
    assert facts["version"] == torch.__version__ and facts["cuda"] == torch.version.cuda
    if torch.version.cuda is None:
        assert check.status == "missing" and "CPU-only build" in check.detail
    elif not torch.cuda.is_available():
        assert check.status == "missing" and "sees no GPU" in check.detail


def test_with_a_gpu_standing_in_the_doctor_says_save_load_can_run(with_hook, monkeypatch):
    """MOCK: this machine has no GPU, so the driver's answer and torch's (which needs a GPU to
    see one) are stood in for; every other fact (the hook built for this run, the packages,
    the backends) is this machine's own."""
    monkeypatch.setattr(
        doctor,
        "probe_driver",
        lambda: {"version": "580.95.05", "error": None, "gpus": [{"name": "NVIDIA H200", "capability": "9.0"}]},
    )
    monkeypatch.setattr(doctor, "probe_torch", lambda: {"installed": True, "version": "2.11.0+cu130", "cuda": "13.0",
                                                        "available": True, "devices": 1})  # fmt: skip
    facts = doctor.gather()
    if facts.packages["cuda-bindings"] is None or facts.packages["zstandard"] is None:
        pytest.skip("the test extras (cuda-bindings, zstandard) are not installed")
    result = CliRunner().invoke(main, ["doctor"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1] == "SAVE/LOAD can run here"
    assert "ok       GPU: 0: NVIDIA H200 (compute 9.0)" in result.stdout


def test_a_broken_backend_is_a_warning_naming_its_reason():
    rows = [{"name": "vmm", "status": "ok"}, {"name": "acme", "status": "broken", "reason": "ImportError: no acme"}]
    check = doctor._backends(rows)
    assert check.status == "warning" and "acme: ImportError: no acme" in check.detail and check.fix
    assert doctor.ready([check])  # a broken backend refuses only the archives that need it


def test_a_driver_without_a_gpu_is_told_apart_from_no_driver():
    none = doctor._driver({"version": "unknown", "gpus": [], "error": "DynamicLibNotFoundError: no libcuda"})
    assert [c.status for c in none] == ["missing", "missing"] and "install the NVIDIA driver" in none[0].fix
    empty = doctor._driver(
        {
            "version": "580.95.05",
            "gpus": [],
            "error": "cuInit failed: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)",
        }
    )
    assert [c.status for c in empty] == ["ok", "missing"] and "sees none" in empty[1].detail

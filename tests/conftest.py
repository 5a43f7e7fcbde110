"""Shared fixtures: the real archives under tests/fixtures, copied per test."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from foundry.archive import Archive
from foundry.backends import BackendRegistry

FIXTURES = Path(__file__).resolve().parent / "fixtures"
ARCHIVES = ("tiny-qwen3", "compiled-triton", "symm-mem-ws1")
# the SAVE/SAVE2 pair captured with the hook on the H200
SAVE_A, SAVE_B = FIXTURES / "saveload-a", FIXTURES / "saveload-b"


def load_script(path: Path, name: str) -> ModuleType:
    """A script of the checkout (a recipe, a benchmark) as a module, under ``name``: they are
    files, not packages, and import their engine only when they run."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def nvcc_cubin(source: str, work: Path, name: str) -> Path:
    """``source`` built with nvcc for this GPU into ``work/NAME.cubin`` (the test is skipped
    without nvcc)."""
    import torch

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is needed to build the test module")
    major, minor = torch.cuda.get_device_capability()
    (work / f"{name}.cu").write_text(source)
    out = work / f"{name}.cubin"
    subprocess.run(["nvcc", "-cubin", f"-arch=sm_{major}{minor}", "-o", str(out), str(work / f"{name}.cu")], check=True)
    return out


def _gpu_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_configure(config: pytest.Config) -> None:
    # tests run in parallel (pytest-xdist) each start NCCL groups: one rendezvous port per worker
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit() and "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(29600 + int(worker[2:]))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU with torch (run with -m gpu on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords or "gpus" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _jit_root(tmp_path_factory, monkeypatch) -> Path:
    """Every test's JIT caches (SAVEs' priming runs, LOADs' installs) go to a directory of its
    own, never the user's ``~/.cache/foundry/jit``."""
    root = tmp_path_factory.mktemp("jit-root")
    monkeypatch.setenv("FOUNDRY_JIT_ROOT", str(root))
    return root


@pytest.fixture
def archive_copy(tmp_path: Path):
    """Copy a committed fixture archive into the test's own directory."""

    def copy(name: str, dest: str | None = None) -> Path:
        target = tmp_path / (dest or name)
        shutil.copytree(FIXTURES / name, target)
        return target

    return copy


@pytest.fixture(scope="module")
def pair() -> tuple[Archive, Archive]:
    """The SAVE/SAVE2 pair, opened once per test module."""
    return Archive.open(SAVE_A), Archive.open(SAVE_B)


@pytest.fixture(scope="session")
def registry() -> BackendRegistry:
    return BackendRegistry.discover()


NATIVE = Path(__file__).resolve().parent.parent / "native"
CUDA_HOME = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))


@pytest.fixture(scope="session")
def hook_library(tmp_path_factory) -> Path:
    """The native hook built from this checkout's sources (CUDA headers and a C compiler needed)."""
    if not (CUDA_HOME / "include" / "cuda.h").is_file() or shutil.which("cc") is None:
        pytest.skip(f"no CUDA headers under {CUDA_HOME} or no C compiler: the hook is not built here")
    build = tmp_path_factory.mktemp("native-build")
    proc = subprocess.run(["make", "-C", str(NATIVE), f"BUILD={build}", f"CUDA_HOME={CUDA_HOME}"],
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return build / "libfoundry_hook.so"


@pytest.fixture
def with_hook(hook_library, monkeypatch) -> Path:
    """Point the launcher at the hook built for this test run."""
    monkeypatch.setenv("FOUNDRY_HOOK_LIB", str(hook_library))
    return hook_library


@pytest.fixture(scope="session")
def cli():
    """The real ``foundry`` command, run in a fresh child process per call (:mod:`tests.hostile`)."""
    from .hostile import CommandServer

    server = CommandServer()
    yield server
    server.close()

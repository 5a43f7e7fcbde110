"""Shared fixtures: the real archives under tests/fixtures, copied per test."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from foundry.backends import BackendRegistry

FIXTURES = Path(__file__).resolve().parent / "fixtures"
ARCHIVES = ("tiny-qwen3", "compiled-triton", "symm-mem-ws1")


def _gpu_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU with torch (run with -m gpu on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords or "gpus" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def archive_copy(tmp_path: Path):
    """Copy a committed fixture archive into the test's own directory."""

    def copy(name: str, dest: str | None = None) -> Path:
        target = tmp_path / (dest or name)
        shutil.copytree(FIXTURES / name, target)
        return target

    return copy


@pytest.fixture(scope="session")
def registry() -> BackendRegistry:
    return BackendRegistry.discover()

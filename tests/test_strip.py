"""``foundry archive strip`` (foundry/archive/strip.py): module images and warm-up bytes
removed and counted; the archive still inspects and a LOAD refuses it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from foundry.archive import Archive
from foundry.archive.schema import ModuleState
from foundry.archive.strip import strip
from foundry.errors import DriftError
from foundry.runtime.sessions.validate import start_module_check

from .archive_tools import write_archive
from .conftest import SAVE_A


def _archive_with_module(root: Path, blob: bytes) -> Archive:
    return write_archive(root, [Archive.open(SAVE_A).graph(0, "sample.bs8")], like=SAVE_A, modules=(blob,))


def test_strip_removes_images_and_warmup_bytes_and_says_so(tmp_path):
    root = tmp_path / "a"
    archive = _archive_with_module(root, b"\x7fELF" + bytes(200))
    removed = strip(archive)
    assert removed == {"files": 1, "bytes": 204}
    reopened = Archive.open(root)
    assert reopened.catalog.modules.state is ModuleState.STRIPPED and reopened.catalog.modules.blobs
    assert reopened.graph(0, "sample.bs8") is not None  # still inspects
    with pytest.raises(DriftError):
        start_module_check(reopened).result()
    out = subprocess.run([sys.executable, "-m", "foundry", "archive", "strip", str(root), "--json"],
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0 and json.loads(out.stdout)["files"] == 0

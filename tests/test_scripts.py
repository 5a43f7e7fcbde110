"""The shell scripts that drive GPU runs parse, and refuse a call without arguments
(they run only on the GPU machine, so a syntax error would show there first)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted([*ROOT.glob("scripts/*.sh"), *ROOT.glob("recipes/*/*.sh"), ROOT / ".ci" / "run"])


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_script_parses(script):
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("script", ["scripts/validate_on_gpu.sh", "recipes/deepep/build_deep_ep.sh"])
def test_script_without_arguments_says_its_usage(script):
    proc = subprocess.run(["bash", str(ROOT / script)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode != 0 and "usage:" in proc.stderr

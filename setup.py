"""Builds the native hook into the package (``foundry/_native/libfoundry_hook.so``).

The hook needs only the CUDA driver header (``cuda.h``) and a C compiler. Where
either is missing the package still installs — inspection, lint, diff and the
TUI need no GPU — and the build says once why SAVE/LOAD will not be available.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
LIBRARY = "libfoundry_hook.so"


def _skip(reason: str) -> None:
    print(f"foundry: native hook not built: {reason}; `foundry run` (SAVE/LOAD) needs it", file=sys.stderr)


class BuildWithHook(build_py):
    def run(self) -> None:
        super().run()
        cuda_home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
        if not (cuda_home / "include" / "cuda.h").is_file():
            return _skip(f"no cuda.h under {cuda_home}/include (set CUDA_HOME)")
        if shutil.which("make") is None or shutil.which(os.environ.get("CC", "cc")) is None:
            return _skip("no make or C compiler")
        with tempfile.TemporaryDirectory() as build:
            proc = subprocess.run(["make", "-C", str(ROOT / "native"), f"BUILD={build}", f"CUDA_HOME={cuda_home}"],
                                  capture_output=True, text=True)  # fmt: skip
            if proc.returncode != 0:
                return _skip(f"make failed: {proc.stderr.strip().splitlines()[-1:]}")
            target = Path(self.build_lib) / "foundry" / "_native"
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path(build) / LIBRARY, target / LIBRARY)
        return None


class PlatformWheel(bdist_wheel):
    """The hook is native code for this platform, but independent of the Python version."""

    def finalize_options(self) -> None:
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self) -> tuple[str, str, str]:
        return ("py3", "none", super().get_tag()[2])


setup(cmdclass={"build_py": BuildWithHook, "bdist_wheel": PlatformWheel})

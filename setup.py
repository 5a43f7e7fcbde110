"""Builds the native hook into the package (``foundry/_native/libfoundry_hook.so``), or, for an
editable install, into the source tree's ``native/build`` (where the hook lookup finds it).

The hook needs only the CUDA driver header (``cuda.h``) and a C compiler. Where
either is missing the package still installs — inspection, lint, diff and the
TUI need no GPU — and the build says why SAVE/LOAD will not be available. Either
way the build says what it did on the terminal: pip keeps a build's own output
to itself unless run with ``-v``, so the line goes to the controlling terminal
when there is one (and to stderr otherwise). ``foundry --version`` and
``foundry doctor`` say it again later.
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


def _say(line: str) -> None:
    """One line the person installing sees: on the terminal when there is one (pip shows a
    build's output only with -v), else on stderr."""
    try:
        with open("/dev/tty", "w") as tty:
            tty.write(f"\n{line}\n")
            return
    except OSError:
        pass
    print(line, file=sys.stderr)


def _skip(reason: str) -> None:
    _say(f"foundry: native hook NOT built: {reason}. Inspect, lint, diff and the TUI work; `foundry run` "
         "(SAVE/LOAD) needs the hook: install again where cuda.h and a C compiler are (`foundry doctor` says what "
         "is missing)")  # fmt: skip


class BuildWithHook(build_py):
    def run(self) -> None:
        super().run()
        cuda_home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
        if not (cuda_home / "include" / "cuda.h").is_file():
            return _skip(f"no cuda.h under {cuda_home}/include (set CUDA_HOME to the CUDA toolkit)")
        if shutil.which("make") is None or shutil.which(os.environ.get("CC", "cc")) is None:
            return _skip("no make or C compiler")
        editable = getattr(self, "editable_mode", False)
        with tempfile.TemporaryDirectory() as build:
            proc = subprocess.run(["make", "-C", str(ROOT / "native"), f"BUILD={build}", f"CUDA_HOME={cuda_home}"],
                                  capture_output=True, text=True)  # fmt: skip
            if proc.returncode != 0:
                return _skip(f"make failed: {proc.stderr.strip().splitlines()[-1:]}")
            # an editable install runs from the source tree: the hook goes where its lookup searches there
            target = ROOT / "native" / "build" if editable else Path(self.build_lib) / "foundry" / "_native"
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path(build) / LIBRARY, target / LIBRARY)
        where = target / LIBRARY if editable else f"{LIBRARY} in the package"
        _say(f"foundry: native hook built ({where}, CUDA headers from {cuda_home}): `foundry run` (SAVE/LOAD) can "
             "use it")  # fmt: skip
        return None


class PlatformWheel(bdist_wheel):
    """The hook is native code for this platform, but independent of the Python version."""

    def finalize_options(self) -> None:
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self) -> tuple[str, str, str]:
        return ("py3", "none", super().get_tag()[2])


setup(cmdclass={"build_py": BuildWithHook, "bdist_wheel": PlatformWheel})

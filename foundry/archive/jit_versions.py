"""The versions that key what a JIT cache holds, read cheaply from the installed
environment: the distributions' ``.dist-info`` directory names on ``sys.path`` (one
directory listing each, nothing imported), the CUDA toolkit's ``version.json``, and
the Python ABI. A launcher reads them before the program starts, so they must cost
milliseconds, not an import of torch."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import sysconfig
from collections.abc import Iterable, Mapping
from pathlib import Path

# the distributions whose versions key the caches, by the manifest field that records each
DISTRIBUTIONS = {
    "torch": ("torch",),
    "triton": ("triton",),
    "flashinfer": ("flashinfer-python", "flashinfer"),
    "sglang_kernel": ("sglang-kernel", "sgl-kernel"),
    "tvm_ffi": ("apache-tvm-ffi",),
    "vllm": ("vllm",),
}
_DIST_INFO = re.compile(r"^(?P<name>[A-Za-z0-9_.]+?)-(?P<version>[^-]+?)\.(dist|egg)-info$")


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def distribution_versions(paths: Iterable[str] | None = None) -> dict[str, str]:
    """Every distribution found on ``paths`` (default ``sys.path``) by its metadata
    directory's name, the first one found for each name (as imports find them)."""
    found: dict[str, str] = {}
    for entry in sys.path if paths is None else paths:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            match = _DIST_INFO.match(name)
            if match:
                found.setdefault(_normalized(match["name"]), match["version"])
    return found


def cuda_home(environ: Mapping[str, str]) -> Path | None:
    """The CUDA toolkit JIT builds use, found as FlashInfer and tvm-ffi find it:
    ``CUDA_HOME``, ``CUDA_PATH``, the directory above ``nvcc`` on ``PATH``, ``/usr/local/cuda``."""
    for name in ("CUDA_HOME", "CUDA_PATH"):
        if environ.get(name):
            return Path(environ[name])
    nvcc = shutil.which("nvcc", path=environ.get("PATH"))
    if nvcc:
        return Path(nvcc).resolve().parent.parent
    default = Path("/usr/local/cuda")
    return default if default.is_dir() else None


def toolkit_version(home: Path | None) -> str | None:
    """The toolkit's version from its ``version.json`` (CUDA 11.1 and later), or None."""
    if home is None:
        return None
    try:
        data = json.loads((home / "version.json").read_text())
    except (OSError, ValueError):
        return None
    version = data.get("cuda", {}).get("version") if isinstance(data, dict) else None
    return version if isinstance(version, str) else None


def live_versions(environ: Mapping[str, str] | None = None,
                  paths: Iterable[str] | None = None) -> dict[str, str | None]:  # fmt: skip
    """The versions of this environment, by manifest field (``gpu_arch`` is not read
    here: it comes from the archive's environment record, which the LOAD session
    compares with the live GPU before anything runs)."""
    env = os.environ if environ is None else environ
    dists = distribution_versions(paths)
    out: dict[str, str | None] = {"python_abi": sysconfig.get_config_var("SOABI") or sys.implementation.cache_tag}
    for field, names in DISTRIBUTIONS.items():
        out[field] = next((dists[_normalized(n)] for n in names if _normalized(n) in dists), None)
    out["cuda"] = toolkit_version(cuda_home(env))
    return out

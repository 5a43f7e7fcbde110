"""``foundry doctor``: whether SAVE/LOAD (``foundry run``) can run on this machine, and
what to do about each part that is missing.

The facts are gathered first (:func:`gather`: each probe looks at one part and never
raises), then judged (:func:`assess`, a pure function of the facts), so a test can
hold every fact real except the ones this machine cannot have. torch is asked in a
child process: importing it can take seconds, or fail in ways that must not take
the doctor down with it.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from foundry.runtime.native.hook import ABI, LIBRARY, build_hint, library_path

GPU_EXTRA = "pip install 'foundry[gpu]'"
SGLANG_GROUP = "sglang.srt.plugins"  # SGLang's plugin entry-point group, where Foundry registers
TORCH_TIMEOUT_S = 180

_TORCH_PROBE = """
import json, torch
facts = {"version": torch.__version__, "cuda": torch.version.cuda}
facts["available"] = bool(torch.version.cuda) and torch.cuda.is_available()
facts["devices"] = torch.cuda.device_count() if facts["available"] else 0
print(json.dumps(facts))
"""


@dataclass(frozen=True)
class Check:
    """One part: what was found, what to do when it is missing, and whether SAVE/LOAD need it."""

    name: str
    status: str  # ok, missing, warning (works, but something is off) or info
    detail: str
    fix: str | None = None
    needed: bool = False  # missing and needed: SAVE/LOAD cannot run here


@dataclass
class Facts:
    """What the probes found (see :func:`gather`); each entry is plain data."""

    hook: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, Any] = field(default_factory=dict)
    driver: dict[str, Any] = field(default_factory=dict)
    torch: dict[str, Any] = field(default_factory=dict)
    packages: dict[str, str | None] = field(default_factory=dict)
    sglang_plugin: bool = False
    backends: list[dict[str, Any]] = field(default_factory=list)


def probe_hook() -> dict[str, Any]:
    """Where the built hook is, and whether it loads and speaks this Foundry's ABI."""
    path = library_path()
    if path is None:
        return {"path": None}
    try:
        abi = ctypes.CDLL(str(path)).foundry_hook_abi()
    except (OSError, AttributeError) as err:
        return {"path": str(path), "error": str(err)}
    return {"path": str(path), "abi": abi}


def probe_headers() -> dict[str, Any]:
    """The CUDA driver header the hook is built from, and the tools to build it."""
    home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    header = home / "include" / "cuda.h"
    compiler = shutil.which(os.environ.get("CC", "cc")) is not None and shutil.which("make") is not None
    return {"cuda_home": str(home), "cuda_h": header.is_file(), "compiler": compiler}


def probe_driver() -> dict[str, Any]:
    """The NVIDIA driver through cuda-bindings (Foundry's one door to it): its version and the GPUs it sees."""
    from foundry.runtime.sessions.environment import driver_version

    facts: dict[str, Any] = {"version": driver_version(), "gpus": [], "error": None}
    try:
        from foundry.graphir.cuda import driver, error_text

        drv = driver()
        err, _ = _call(drv.cuInit, 0)
        if err != drv.CUresult.CUDA_SUCCESS:
            facts["error"] = f"cuInit failed: {error_text(err)}"
            return facts
        _, count = _call(drv.cuDeviceGetCount)
        for index in range(count or 0):
            _, device = _call(drv.cuDeviceGet, index)
            _, name = _call(drv.cuDeviceGetName, 256, device)
            attr = drv.CUdevice_attribute
            _, major = _call(drv.cuDeviceGetAttribute, attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device)
            _, minor = _call(drv.cuDeviceGetAttribute, attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device)
            text = name.split(b"\0", 1)[0].decode(errors="replace") if isinstance(name, bytes) else str(name)
            facts["gpus"].append({"name": text, "capability": f"{major}.{minor}"})
    except Exception as err:  # noqa: BLE001 - no driver library, no bindings: each is an answer, not a crash
        facts["error"] = f"{type(err).__name__}: {' '.join(str(err).split())}"
    return facts


def _call(fn: Any, *args: Any) -> tuple[Any, Any]:
    result = fn(*args)
    return (result[0], result[1] if len(result) > 1 else None) if isinstance(result, tuple) else (result, None)


def probe_torch() -> dict[str, Any]:
    """torch's version, the CUDA it was built for and whether it sees a GPU, asked in a child."""
    try:
        proc = subprocess.run([sys.executable, "-c", _TORCH_PROBE], capture_output=True, text=True,
                              timeout=TORCH_TIMEOUT_S)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"error": f"importing torch took over {TORCH_TIMEOUT_S} s"}
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        missing = any("No module named 'torch'" in line for line in lines)
        return {"installed": False} if missing else {"error": lines[-1] if lines else f"exit {proc.returncode}"}
    try:
        return {"installed": True, **json.loads(proc.stdout.strip().splitlines()[-1])}
    except (ValueError, IndexError):
        return {"error": f"unreadable answer: {proc.stdout[-200:]!r}"}


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def probe_sglang_plugin() -> bool:
    """Whether Foundry's SGLang plugin is registered where SGLang looks for plugins."""
    return any(ep.name == "foundry" for ep in metadata.entry_points(group=SGLANG_GROUP))


def gather() -> Facts:
    """Every fact the doctor judges, from this machine."""
    from foundry.backends.registry import BackendRegistry

    return Facts(
        hook=probe_hook(),
        headers=probe_headers(),
        driver=probe_driver(),
        torch=probe_torch(),
        packages={dist: _version(dist) for dist in ("cuda-bindings", "zstandard", "sglang")},
        sglang_plugin=probe_sglang_plugin(),
        backends=BackendRegistry.discover().describe(),
    )


# -- judging ------------------------------------------------------------------------------------


def assess(facts: Facts) -> list[Check]:
    """Each part's check, in the order a person fixes them."""
    return [
        _hook(facts.hook),
        _headers(facts.headers, built=facts.hook.get("abi") == ABI),
        _package("cuda-bindings", facts.packages.get("cuda-bindings"), "LOAD calls the driver through it"),
        _package("zstandard", facts.packages.get("zstandard"), "SAVE reads the compressed fatbins torch ships"),
        *_driver(facts.driver),
        _torch(facts.torch),
        *_sglang(facts.packages.get("sglang"), facts.sglang_plugin),
        _backends(facts.backends),
    ]


def ready(checks: list[Check]) -> bool:
    """Whether SAVE/LOAD can run here: nothing they need is missing."""
    return not any(c.needed and c.status == "missing" for c in checks)


def _hook(hook: dict[str, Any]) -> Check:
    name = "native hook"
    if hook.get("path") is None:
        return Check(name, "missing", f"{LIBRARY} is not built", build_hint(), needed=True)
    if "error" in hook:
        return Check(name, "missing", f"{hook['path']} does not load: {hook['error']}",
                     f"build it again: {build_hint()}", needed=True)  # fmt: skip
    if hook.get("abi") != ABI:
        return Check(name, "missing", f"{hook['path']} speaks ABI {hook.get('abi')}, this Foundry {ABI} (an old build)",
                     f"build it again: {build_hint()}", needed=True)  # fmt: skip
    return Check(name, "ok", f"{hook['path']} (loads, ABI {ABI})", needed=True)


def _headers(headers: dict[str, Any], *, built: bool) -> Check:
    name = "CUDA headers"
    where = f"{headers['cuda_home']}/include/cuda.h"
    if headers.get("cuda_h") and headers.get("compiler"):
        return Check(name, "ok", f"{where} and a C compiler (the hook can be built here)")
    if built:
        return Check(name, "info", f"no {where} or no C compiler, and none needed: the hook is built")
    missing = "cuda.h" if not headers.get("cuda_h") else "a C compiler and make"
    fix = "install the CUDA toolkit's headers (or set CUDA_HOME to it) and a C compiler"
    return Check(name, "missing", f"{missing} not found ({where}); the hook is built from it", fix, needed=True)


def _package(dist: str, version: str | None, why: str) -> Check:
    if version is None:
        return Check(dist, "missing", f"not installed ({why})", GPU_EXTRA, needed=True)
    return Check(dist, "ok", version, needed=True)


def _driver(driver: dict[str, Any]) -> list[Check]:
    version = driver.get("version") or "unknown"
    error = driver.get("error")
    if error and "cuda-bindings is not installed" in error:
        status = Check("NVIDIA driver", "missing", f"not checked: cuda-bindings is missing (driver {version})",
                       GPU_EXTRA, needed=True)  # fmt: skip
        return [status, Check("GPU", "missing", "not checked (no driver check)", GPU_EXTRA, needed=True)]
    if error and "NO_DEVICE" not in error:
        fix = "install the NVIDIA driver (libcuda.so.1), or run where it is"
        return [Check("NVIDIA driver", "missing", f"not usable: {error}", fix, needed=True),
                Check("GPU", "missing", "none visible (no usable driver)", "run on a machine with an NVIDIA GPU",
                      needed=True)]  # fmt: skip
    gpus = driver.get("gpus") or []
    checks = [Check("NVIDIA driver", "ok", f"version {version}", needed=True)]
    if not gpus:
        fix = "run on a machine with an NVIDIA GPU (check CUDA_VISIBLE_DEVICES and the container's devices)"
        return [*checks, Check("GPU", "missing", "the driver sees none", fix, needed=True)]
    shown = ", ".join(f"{i}: {g['name']} (compute {g['capability']})" for i, g in enumerate(gpus))
    return [*checks, Check("GPU", "ok", shown, needed=True)]


def _torch(torch: dict[str, Any]) -> Check:
    name = "torch"
    fix = "install a CUDA build of torch (pip install torch), one built for this driver's CUDA"
    if "error" in torch:
        return Check(name, "missing", f"cannot be imported: {torch['error']}", fix, needed=True)
    if not torch.get("installed"):
        return Check(name, "missing", "not installed (the programs SAVE/LOAD run are torch programs)", fix, needed=True)
    if not torch.get("cuda"):
        return Check(name, "missing", f"{torch['version']} is a CPU-only build", fix, needed=True)
    if not torch.get("available"):
        return Check(name, "missing", f"{torch['version']} (CUDA {torch['cuda']}) sees no GPU",
                     "run on a machine with an NVIDIA GPU, with a driver recent enough for torch's CUDA",
                     needed=True)  # fmt: skip
    return Check(name, "ok", f"{torch['version']} (CUDA {torch['cuda']}, {torch['devices']} GPU(s))", needed=True)


def _sglang(version: str | None, registered: bool) -> list[Check]:
    plugin = ("Foundry's plugin registered" if registered else
              "Foundry's plugin not registered (reinstall Foundry in SGLang's environment)")  # fmt: skip
    if version is None:
        return [Check("SGLang", "info", f"not installed (only the SGLang plugin needs it); {plugin}")]
    if not registered:
        return [Check("SGLang", "warning", f"{version}; {plugin}", "pip install foundry (or -e .) where SGLang is")]
    return [Check("SGLang", "ok", f"{version}; {plugin}")]


def _backends(rows: list[dict[str, Any]]) -> Check:
    ok = [r["name"] for r in rows if r["status"] == "ok"]
    broken = [r for r in rows if r["status"] != "ok"]
    detail = f"{len(ok)} registered ({', '.join(ok) or 'none'})"
    if not broken:
        return Check("backends", "ok", detail)
    named = "; ".join(f"{r['name']}: {r['reason']}" for r in broken)
    return Check("backends", "warning", f"{detail}; broken: {named}",
                 "fix or uninstall the broken backend's package (an archive that needs it is refused)")  # fmt: skip


def report(checks: list[Check]) -> dict[str, Any]:
    """The checks as ``--json`` prints them."""
    return {"ok": ready(checks), "checks": [asdict(c) for c in checks]}

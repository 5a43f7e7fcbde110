"""The live environment an archive records at SAVE and a LOAD compares against."""

from __future__ import annotations

import platform
from importlib import metadata
from pathlib import Path

from foundry.archive.schema import Environment


def driver_version() -> str:
    """The kernel driver's version (e.g. 580.159.04), from NVML or /proc."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # noqa: BLE001 - NVML is optional; /proc is the fallback
        pass
    proc = Path("/proc/driver/nvidia/version")
    if proc.is_file():
        for word in proc.read_text().split():
            if word.count(".") >= 1 and word.replace(".", "").isdigit():
                return word
    return "unknown"


def _version_of(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def current_environment(device: int | None = None) -> Environment:
    """Describe the GPU, driver, CUDA and torch of this process (needs torch with CUDA)."""
    import torch

    index = torch.cuda.current_device() if device is None else device
    major, minor = torch.cuda.get_device_capability(index)
    return Environment(
        gpu_name=torch.cuda.get_device_name(index),
        compute_capability=f"{major}.{minor}",
        driver_version=driver_version(),
        cuda_version=str(torch.version.cuda),
        torch_version=str(torch.__version__),
        cuda_bindings_version=_version_of("cuda-bindings"),
        python_version=platform.python_version(),
    )

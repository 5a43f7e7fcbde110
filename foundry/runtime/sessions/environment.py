"""The live environment an archive records at SAVE and a LOAD compares against."""

from __future__ import annotations

import platform
from pathlib import Path

from foundry.archive.schema import Environment

PROC_DRIVER_VERSION = Path("/proc/driver/nvidia/version")


def version_in_proc(text: str) -> str | None:
    """The driver version in the text of /proc/driver/nvidia/version: the first word of
    dotted digits ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04 ...")."""
    return next((w for w in text.split() if "." in w and w.replace(".", "").isdigit()), None)


def driver_version() -> str:
    """The kernel driver's version (e.g. 580.159.04), from /proc, or from NVML where /proc
    does not say (a launcher reads this before every LOAD: a file read costs less than
    initialising NVML)."""
    try:
        found = version_in_proc(PROC_DRIVER_VERSION.read_text())
    except OSError:  # no NVIDIA kernel module here, or /proc not mounted
        found = None
    if found:
        return found
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # noqa: BLE001 - NVML is optional
        return "unknown"


def _version_of(dist: str) -> str | None:
    from importlib import metadata  # only here: a launcher reads the driver's version from this module

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

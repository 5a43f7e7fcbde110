"""The DeepEP buffer policy against the real ``sgl-deep-ep`` wheel (its sources parsed
with ``ast``: importing it needs a GPU build of torch and its CUDA extension), and
the refusals that need no DeepEP at all.

The wheel is downloaded from PyPI once into ``$XDG_CACHE_HOME/foundry-tests`` (or
taken from ``FOUNDRY_DEEPEP_WHEEL``); without it the contract test fails."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from foundry.errors import FoundryError
from foundry.integrations.deepep import FABRIC_PARAMETERS, check_buffer_parameters

VERSION = "0.1.2.post1"


def _wheel() -> Path:
    given = os.environ.get("FOUNDRY_DEEPEP_WHEEL")
    if given:
        return Path(given)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "foundry-tests"
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(f"sgl_deep_ep-{VERSION}-*.whl"))
    if not found:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                               "--python-version", "3.11", "--platform", "manylinux_2_28_x86_64", "-d", str(cache),
                               f"sgl-deep-ep=={VERSION}"], capture_output=True, text=True)  # fmt: skip
        found = sorted(cache.glob(f"sgl_deep_ep-{VERSION}-*.whl"))
        if not found:
            pytest.fail(f"could not fetch the sgl-deep-ep {VERSION} wheel (set FOUNDRY_DEEPEP_WHEEL): "
                        f"{proc.stderr[-500:]}")  # fmt: skip
    return found[0]


def _method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef:
    klass = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls)
    return next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == name)


def test_the_wheels_buffer_can_be_told_to_avoid_fabric_and_shows_its_buffers():
    with zipfile.ZipFile(_wheel()) as wheel:
        legacy = ast.parse(wheel.read("deep_ep/buffers/legacy.py"))
        exported = wheel.read("deep_ep/__init__.py").decode()
    assert "from .buffers.legacy import Buffer" in exported
    init = _method(legacy, "Buffer", "__init__")
    parameters = [a.arg for a in (*init.args.args, *init.args.kwonlyargs)]
    check_buffer_parameters(parameters)
    assert parameters[1:4] == ["group", "num_nvl_bytes", "num_rdma_bytes"]  # the positional order nvl_buffer uses
    getter = _method(legacy, "Buffer", "get_local_buffer_tensor")
    assert [a.arg for a in getter.args.args] == ["self", "dtype", "size", "offset", "use_rdma_buffer"]
    assigned = {t.attr for n in ast.walk(init) if isinstance(n, ast.Assign) for t in n.targets
                if isinstance(t, ast.Attribute)}  # fmt: skip
    assert {"rank", "group_size", "num_nvl_bytes", "num_rdma_bytes", "runtime"} <= assigned


def test_a_buffer_without_a_fabric_switch_is_refused():
    check_buffer_parameters(["self", "group", "num_nvl_bytes", "use_fabric"])
    with pytest.raises(FoundryError, match="cannot be told to avoid fabric handles") as err:
        check_buffer_parameters(["self", "group", "num_nvl_bytes", "num_rdma_bytes"])
    assert err.value.field == "deep_ep.Buffer" and err.value.expected == list(FABRIC_PARAMETERS)


def test_asking_for_fabric_handles_is_refused_before_deepep_is_touched():
    from foundry.integrations.deepep import nvl_buffer

    for name in FABRIC_PARAMETERS:
        with pytest.raises(FoundryError, match=f"{name}=True would share") as err:
            nvl_buffer(None, 1 << 20, experts_per_rank=8, **{name: True})
        assert err.value.field == f"deep_ep.{name}"


def test_every_nvshmem_setting_the_buffer_makes_is_recorded():
    """deep_ep.Buffer sets NVSHMEM variables before NVSHMEM starts; the backend's record
    must hold each of them (a LOAD with another one is refused)."""
    from foundry.backends.deepep_nvl import NVSHMEM_SETTINGS

    with zipfile.ZipFile(_wheel()) as wheel:
        legacy = ast.parse(wheel.read("deep_ep/buffers/legacy.py"))
    set_there = {
        target.slice.value
        for node in ast.walk(legacy)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant)
        and str(target.slice.value).startswith("NVSHMEM_")
    }  # fmt: skip
    assert len(set_there) >= 6 and set_there <= set(NVSHMEM_SETTINGS), set_there - set(NVSHMEM_SETTINGS)


def _parameters(tree: ast.Module, cls: str, name: str) -> list[str]:
    method = _method(tree, cls, name)
    return [a.arg for a in (*method.args.args, *method.args.kwonlyargs)]


def test_the_wheel_has_the_calls_the_two_gpu_recipe_makes():
    """recipes/deepep/ep2.py builds a low-latency Buffer and captures low_latency_dispatch
    and low_latency_combine; each call's parameters as the recipe passes them."""
    with zipfile.ZipFile(_wheel()) as wheel:
        legacy = ast.parse(wheel.read("deep_ep/buffers/legacy.py"))
        exported = wheel.read("deep_ep/__init__.py").decode()
    init = _parameters(legacy, "Buffer", "__init__")
    assert {"low_latency_mode", "num_qps_per_rank", "allow_nvlink_for_low_latency_mode", "explicitly_destroy"} <= set(
        init
    )
    assert _parameters(legacy, "Buffer", "get_low_latency_rdma_size_hint") == [
        "num_max_dispatch_tokens_per_rank", "hidden", "num_ranks", "num_experts"]  # fmt: skip
    dispatch = _parameters(legacy, "Buffer", "low_latency_dispatch")
    assert dispatch[:5] == ["self", "x", "topk_idx", "num_max_dispatch_tokens_per_rank", "num_experts"]
    assert "use_fp8" in dispatch
    combine = _parameters(legacy, "Buffer", "low_latency_combine")
    assert combine[:5] == ["self", "x", "topk_idx", "topk_weights", "handle"]
    assert "topk_idx_t" in exported

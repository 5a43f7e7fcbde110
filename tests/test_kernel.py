"""Kernel identities (foundry/graphir/kernel.py): parameter types read from real demangled names;
function attributes checked when decoded."""

from __future__ import annotations

import msgspec
import pytest

from foundry.graphir.kernel import parameter_types

from .conftest import FIXTURES


def test_parameter_types_read_from_a_real_torch_name():
    names = (FIXTURES / "kernel_names" / "torch.txt").read_text().split()
    from foundry.graphir.kernel import KernelIdentity

    mangled = next(n for n in names if "distribution_elementwise_grid_stride_kernel" in n)
    types = parameter_types(KernelIdentity(mangled).demangled)
    assert types is not None and "at::PhiloxCudaState" in types
    assert parameter_types('extern "C" kernel') is None and parameter_types("void f()") == []


@pytest.mark.parametrize("struct", ["func_attr", "plan_kernel"])
def test_a_cache_preference_outside_the_drivers_values_is_refused_at_decode(struct):
    from foundry.archive.schema import PlanKernel
    from foundry.graphir.kernel import FuncAttribute

    def decode(value: int):
        if struct == "func_attr":
            return msgspec.json.decode(f'["cache_config", {value}]'.encode(), type=FuncAttribute)
        return msgspec.json.decode(f'["{"a" * 64}", "k", [["cache_config", {value}]]]'.encode(), type=PlanKernel)

    assert decode(1) is not None  # CU_FUNC_CACHE_PREFER_SHARED, as Triton sets above 48 KiB
    with pytest.raises(msgspec.ValidationError, match="cache_config 7 is no CUfunc_cache value"):
        decode(7)

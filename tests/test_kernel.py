"""Kernel identities (foundry/graphir/kernel.py): parameter types read from real demangled names."""

from __future__ import annotations

from foundry.graphir.kernel import parameter_types

from .conftest import FIXTURES


def test_parameter_types_read_from_a_real_torch_name():
    names = (FIXTURES / "kernel_names" / "torch.txt").read_text().split()
    from foundry.graphir.kernel import KernelIdentity

    mangled = next(n for n in names if "distribution_elementwise_grid_stride_kernel" in n)
    types = parameter_types(KernelIdentity(mangled).demangled)
    assert types is not None and "at::PhiloxCudaState" in types
    assert parameter_types('extern "C" kernel') is None and parameter_types("void f()") == []

"""Backend registry and recognisers, on kernel names read with cuobjdump from published binaries."""

from __future__ import annotations

from collections import Counter
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from foundry.backends import Backend, BackendRegistry
from foundry.errors import BackendError
from foundry.graphir.kernel import KernelIdentity

NAMES = Path(__file__).resolve().parent / "fixtures" / "kernel_names"


def kernel_names(source: str) -> list[tuple[str, str]]:
    rows = []
    for line in (NAMES / f"{source}.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, params = line.split("\t")
            rows.append((name, params))
    return rows


def kinds(registry, source) -> Counter:
    return Counter(
        (m.backend, m.kind, m.requires) if (m := registry.recognise(KernelIdentity(name))) else None
        for name, _ in kernel_names(source)
    )


def test_builtins_register_through_the_entry_point_group(registry):
    assert set(registry.backends) == {"vmm", "torch-symm-mem", "nccl-ipc", "custom-allreduce", "deepep-nvl"}
    assert not registry.broken
    assert {
        "symm-allreduce",
        "nccl-allreduce",
        "custom-allreduce",
        "deepep-dispatch",
        "deepep-combine",
    } <= registry.kinds()


def test_every_nccl_kernel_is_claimed(registry):
    counts = kinds(registry, "nccl")
    assert None not in counts
    assert sum(counts.values()) == 242
    assert counts[("nccl-ipc", "nccl-allreduce", None)] == 48
    assert counts[("nccl-ipc", "nccl-allreduce", "multimem")] == 20
    assert counts[("nccl-ipc", "nccl-onerank", None)] == 12
    match = registry.recognise(
        KernelIdentity("_Z33ncclDevKernel_AllReduce_bf16_RING24ncclDevKernelArgsStorageILm4096EE")
    )
    assert (match.kind, [r.role for r in match.abi]) == ("nccl-allreduce", ["args"])


def test_deepep_kernels(registry):
    counts = kinds(registry, "deepep")
    assert None not in counts and sum(counts.values()) == 178
    # 45 low-latency + 36 internode dispatch kernels take the RDMA buffer (NVSHMEM); 3 intranode ones do not
    assert counts[("deepep-nvl", "deepep-dispatch", "nvshmem")] == 81
    assert counts[("deepep-nvl", "deepep-dispatch", None)] == 3
    assert counts[("deepep-nvl", "deepep-combine", "nvshmem")] == 54  # incl. combine_overlappable
    assert counts[("deepep-nvl", "deepep-combine", None)] == 3
    ll = next(n for n, _ in kernel_names("deepep") if "12internode_ll8dispatch" in n)
    assert registry.recognise(KernelIdentity(ll)).kind == "deepep-dispatch"


def test_deepep_abi_fits_every_real_kernels_parameter_layout(registry):
    """One named parameter per parameter of each real kernel, pointers 8 bytes wide,
    and the buffers where DeepEP's host code puts them."""
    from foundry.backends.deepep_abi import memory_of

    for name, params in kernel_names("deepep"):
        abi = registry.recognise(KernelIdentity(name)).abi
        sizes = [int(p.split(":")[1]) for p in params.split(",")] if params != "none" else []
        assert len(abi) == len(sizes), name
        assert all(size == 8 for role, size in zip(abi, sizes, strict=True) if role.pointer), name
        assert all(role.index == i for i, role in enumerate(abi))
    ll = next(n for n, _ in kernel_names("deepep") if "12internode_ll8dispatch" in n)
    memory = {role.role: memory_of(role) for role in registry.recognise(KernelIdentity(ll)).abi}
    assert memory["rdma_recv_x"] == "nvshmem" and memory["atomic_counter_per_expert"] == "workspace"
    assert memory["packed_recv_x"] == "tensor" and memory["num_tokens"] is None
    barrier = next(n for n, _ in kernel_names("deepep") if "9intranode7barrier" in n)
    assert [(r.role, memory_of(r)) for r in registry.recognise(KernelIdentity(barrier)).abi] == [
        ("barrier_signal_ptrs", "nvl-peers"), ("rank", None)]  # fmt: skip


def test_custom_allreduce_and_its_negatives(registry):
    counts = kinds(registry, "sglang_kernel")
    assert counts == Counter({None: 200, ("custom-allreduce", "custom-allreduce", None): 24})
    name, params = next(r for r in kernel_names("sglang_kernel") if "cross_device_reduce_1stage" in r[0])
    abi = registry.recognise(KernelIdentity(name)).abi
    assert len(abi) == len(params.split(",")) == 6 and abi[1].role == "peer_signals"


def test_torch_symmetric_memory_kernels(registry):
    counts = kinds(registry, "torch")
    assert counts[None] == 307  # 300 sampled negatives + checkForNaN x6 + kernel_barrier
    assert counts[("torch-symm-mem", "symm-allreduce", None)] == 66
    assert counts[("torch-symm-mem", "symm-reducescatter", None)] == 36  # two_shot_all_reduce_kernel<..., true, ...>
    assert counts[("torch-symm-mem", "symm-allgather", "multimem")] == 3
    for name, params in kernel_names("torch"):
        match = registry.recognise(KernelIdentity(name))
        if match and match.abi:  # every ABI table matches the real parameter count
            assert len(match.abi) == len(params.split(",")), name


def test_fixture_graph_kernels_are_classified(registry):
    from foundry.archive import Archive

    from .conftest import FIXTURES

    ir = Archive.open(FIXTURES / "symm-mem-ws1").graph(0, "symm.allreduce")
    found = [registry.recognise(k.kernel) for k in ir.kernels()]
    assert [m.kind if m else None for m in found] == [None, "symm-allreduce", "symm-allreduce"]
    for node, match in zip(ir.kernels(), found, strict=True):
        if match:
            pointer_params = {r.index for r in match.abi if r.pointer}
            assert {o.param for o in ir.operands.of(node.id)} <= pointer_params


class _Example(Backend):
    name = "example"
    kinds = frozenset({"example-op"})

    def recognise(self, kernel):
        return self.match("example-op") if "example" in kernel.name else None


class _WrongName(_Example):
    name = "other"


class _OldContract(_Example):
    contract = 0


class _VagueState(_Example):
    needs_state = "sometimes"


def _entry(name: str, target: str) -> EntryPoint:
    return EntryPoint(name, target, "foundry.backends")


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("tests.test_backends:_Nothing", "import failed: AttributeError"),
        ("no_such_module_xyz:Backend", "import failed: ModuleNotFoundError"),
        ("tests.test_backends:kinds", "does not name a subclass"),
        ("tests.test_backends:_WrongName", "declares name 'other' but is registered as 'example'"),
        ("tests.test_backends:_OldContract", "written for contract 0"),
        ("tests.test_backends:_VagueState", "needs_state must be True or False"),
    ],
)
def test_broken_backends_are_listed_with_their_reason(target, reason):
    registry = BackendRegistry()
    registry._load(_entry("example", target))
    assert "example" not in registry.backends
    assert reason in registry.broken["example"].reason
    (row,) = registry.describe()
    assert row["status"] == "broken" and reason in row["reason"]
    with pytest.raises(BackendError, match="archive needs backend 'example', which is broken"):
        registry.require("example")


def test_working_third_party_backend_and_missing_backend():
    registry = BackendRegistry()
    registry._load(_entry("example", "tests.test_backends:_Example"))
    assert registry.recognise(KernelIdentity("my_example_kernel")).kind == "example-op"
    assert registry.require("example").name == "example"
    with pytest.raises(BackendError, match="archive needs backend 'deepep-nvl', which is not installed"):
        registry.require("deepep-nvl")
    with pytest.raises(BackendError, match="cannot relocate operands yet"):
        registry.require("example").relocate(None, None)


def test_backends_say_whether_their_kernels_need_recorded_state(registry):
    """Communicator backends need their state at LOAD; the vmm region claims no kernels;
    a backend that does not say is taken to need it (see test_third_party_backend)."""
    needs = {name: backend.needs_state for name, backend in registry.backends.items()}
    assert needs == {"vmm": False, "torch-symm-mem": True, "nccl-ipc": True, "custom-allreduce": True,
                     "deepep-nvl": True}  # fmt: skip
    assert _Example.needs_state is True

"""The kernels of SGLang's JIT custom all-reduce (``CustomAllReduceV2``) and their one parameter.

SGLang 0.5.17 builds ``sglang/kernels/jit/csrc/distributed/custom_all_reduce.cuh`` on
the serving machine (through tvm-ffi) and uses it by default on CUDA
(``SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2``). Every all-reduce launch is
``all_reduce_kernel<Impl, kWorldSize, kShot>(const __grid_constant__ AllReduceParams<kWorldSize>)``
with ``Impl`` = ``AllReducePushImpl<T, kWorldSize, kUsePDL>`` (1-shot push) or
``AllReducePullImpl<T, kWorldSize, PullMode, kUsePDL>`` (1- or 2-shot pull; ``PullMode``
0 reads peers' inputs through a row of the graph pointer table, 1 the symmetric pull
workspaces, 2 a multicast address). :func:`fields` is ``AllReduceParams`` byte by byte;
``tests/fixtures/kernel_names/sglang_jit.txt`` (the source compiled with nvcc) and a
contract test against the wheel's source hold it to the real struct.

Each rank's workspace is one torch symmetric-memory slab laid out
``[2 x world_size push buffers | pull buffer | pull semaphores]``
(``CustomAllReduceV2._init_workspace``); :func:`workspace_offsets` says where each
workspace word of the parameter points inside the slab of its rank.
"""

from __future__ import annotations

from typing import NamedTuple

from foundry.graphir.kernel import KernelIdentity, template_args

PULL_MODES = ("graph", "eager", "multicast")  # PullMode's enumerators, in order


class Field(NamedTuple):
    """One member of ``AllReduceParams``: name (``pull_workspaces[1]``), byte offset, size."""

    name: str
    offset: int
    size: int
    pointer: bool


class JitKernel(NamedTuple):
    """What a V2 kernel's template arguments say about it."""

    dtype: str
    world_size: int
    mode: str  # push, or a pull mode: graph, eager, multicast
    shot: int
    pdl: bool


def fields(world_size: int) -> tuple[Field, ...]:
    """``AllReduceParams<world_size>`` as laid out on a 64-bit device."""
    w = world_size
    arrays = [(f"{name}[{i}]", 32 + 8 * (k * w + i)) for k, name in
              enumerate(("pull_workspaces", "push_workspaces", "pull_semaphores")) for i in range(w)]  # fmt: skip
    return (
        Field("input", 0, 8, True),
        Field("output", 8, 8, True),
        Field("num_elements", 16, 4, False),
        Field("rank", 20, 4, False),
        Field("graph_params", 24, 8, True),
        *(Field(name, offset, 8, True) for name, offset in arrays),
        Field("push_counter", 32 + 24 * w, 8, True),
        Field("pull_mc_workspace", 40 + 24 * w, 8, True),
        Field("push_buffer_stride", 48 + 24 * w, 8, False),
    )


def params_size(world_size: int) -> int:
    last = fields(world_size)[-1]
    return last.offset + last.size


def jit_kernel(kernel: KernelIdentity) -> JitKernel | None:
    """The V2 all-reduce kernel ``kernel`` is, or None (``memcpy_kernel`` and the rest)."""
    if "all_reduce_kernel" not in kernel.name or "AllReduceP" not in kernel.name:
        return None
    if not kernel.short_name.removesuffix("<...>").endswith("::all_reduce_kernel"):
        return None
    outer = template_args(kernel.demangled)
    if len(outer) != 3 or not outer[0].rsplit("<", 1)[0].endswith(("AllReducePushImpl", "AllReducePullImpl")):
        return None
    impl = template_args(outer[0])
    push = "AllReducePushImpl<" in outer[0]
    try:
        world, shot = _unsigned(outer[1]), int(outer[2])
        mode = "push" if push else PULL_MODES[int(impl[2].rsplit(")", 1)[-1])]
    except (ValueError, IndexError):
        return None
    if _unsigned(impl[1]) != world or len(impl) != (3 if push else 4):
        return None
    return JitKernel(impl[0], world, mode, shot, impl[-1] == "true")


def workspace_offsets(world_size: int, push_bytes: int, pull_bytes: int) -> dict[str, tuple[int, int]]:
    """Field name -> (rank whose slab it points into, offset in that slab)."""
    pull, semaphores = 2 * world_size * push_bytes, 2 * world_size * push_bytes + pull_bytes
    out = {}
    for rank in range(world_size):
        out[f"push_workspaces[{rank}]"] = (rank, 0)
        out[f"pull_workspaces[{rank}]"] = (rank, pull)
        out[f"pull_semaphores[{rank}]"] = (rank, semaphores)
    return out


def word(params: bytes, field: Field) -> int:
    return int.from_bytes(params[field.offset : field.offset + field.size], "little")


def _unsigned(text: str) -> int:
    return int(text.removesuffix("u"))

"""Capture helpers shared by recipes, fixtures and GPU tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from foundry.archive.outputs import OutputValue, TensorSpec, describe
from foundry.graphir.lower import AddressResolver


def warm_up_on_side_stream(fn: Callable[[], Any], times: int) -> Any:
    """Run ``fn`` ``times`` on a new stream, ordered after and before the current one's work;
    return that stream."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(times):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    return stream


def capture(fn: Callable[[], Any], *, warmup: int = 2, pool: Any = None) -> tuple[Any, Any]:
    """Warm ``fn`` up on a side stream, then capture it into a
    ``torch.cuda.CUDAGraph(keep_graph=True)``; return ``(graph, outputs)``."""
    import torch

    warm_up_on_side_stream(fn, warmup)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph, pool=pool):
        outputs = fn()
    torch.cuda.synchronize()
    return graph, outputs


def instantiate_flags(graph: Any) -> int:
    """The flags a ``torch.cuda.CUDAGraph(keep_graph=True)`` is instantiated with: torch
    instantiates it at its first replay (with auto-free on launch), so this does now what that
    replay would and asks the driver. A LOAD gives its graph the same, so that it is
    scheduled as the program's was."""
    from foundry.archive.schema import INSTANTIATE_FLAGS
    from foundry.errors import FoundryError
    from foundry.graphir.cuda import cu, driver

    graph.instantiate()
    flags = int(cu("cuGraphExecGetFlags", driver().CUgraphExec(graph.raw_cuda_graph_exec())))
    if flags & ~INSTANTIATE_FLAGS:
        raise FoundryError("the program's graph was instantiated with flags a LOAD cannot give it",
                           field="instantiate_flags", expected=f"within {INSTANTIATE_FLAGS:#x}",
                           found=hex(flags))  # fmt: skip
    return flags


def describe_outputs(outputs: Any, resolver: AddressResolver) -> OutputValue:
    """An allowlisted description of ``outputs``; tensor storage is located through ``resolver``."""
    import torch

    def tensor(value: Any) -> TensorSpec | None:
        if not isinstance(value, torch.Tensor):
            return None
        # the storage's start: the spec's storage_offset places the tensor in it again at LOAD
        hit = resolver.resolve(value.untyped_storage().data_ptr())
        return TensorSpec(
            dtype=str(value.dtype).removeprefix("torch."),
            shape=tuple(value.shape),
            stride=tuple(value.stride()),
            storage_offset=value.storage_offset(),
            region=hit[0].name if hit else None,
            region_offset=hit[1] if hit else None,
        )

    return describe(outputs, tensor)

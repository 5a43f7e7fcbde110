"""Classify kernel nodes through the backends: node id -> the backend's claim."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from foundry.backends.base import KernelMatch
from foundry.backends.registry import BackendRegistry
from foundry.graphir.graph import GraphIR
from foundry.graphir.kernel import KernelIdentity
from foundry.graphir.nodes import KernelNode


def classify(ir: GraphIR, registry: BackendRegistry, kernels: list[KernelNode] | None = None) -> dict[int, KernelMatch]:
    """Every kernel node some backend claims, with its claim (``kernels``: the graph's kernel
    nodes, if the caller has them). The backends are asked once per distinct kernel name, as
    :meth:`BackendRegistry.recognise` caches them; most graphs have no claimed kernel at all."""
    kernels = ir.kernels() if kernels is None else kernels
    first = {node.kernel.name: node.kernel for node in reversed(kernels)}  # the first of each name
    matches = {name: match for name, kernel in first.items() if (match := registry.recognise(kernel)) is not None}
    if not matches:
        return {}
    return {node.id: matches[node.kernel.name] for node in kernels if node.kernel.name in matches}


def collective_counts(kernels: Iterable[tuple[KernelIdentity, int]], registry: BackendRegistry) -> Counter[str]:
    """Launches by the kind a backend recognises, asking once per distinct kernel (``kernels``:
    each distinct kernel with its launch count, as :meth:`GraphIR.kernel_table` gives them)."""
    out: Counter[str] = Counter()
    for kernel, count in kernels:
        match = registry.recognise(kernel)
        if match is not None:
            out[match.kind] += count
    return out

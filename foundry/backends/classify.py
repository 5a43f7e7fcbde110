"""Classify kernel nodes through the backends: node id -> the backend's claim."""

from __future__ import annotations

from collections import Counter

from foundry.backends.base import KernelMatch
from foundry.backends.registry import BackendRegistry
from foundry.graphir.graph import GraphIR
from foundry.graphir.nodes import KernelNode


def classify(ir: GraphIR, registry: BackendRegistry) -> dict[int, KernelMatch]:
    """Every kernel node some backend claims, with its claim."""
    claims: dict[int, KernelMatch] = {}
    for node in ir.nodes():
        if isinstance(node, KernelNode):
            match = registry.recognise(node.kernel)
            if match is not None:
                claims[node.id] = match
    return claims


def collective_counts(ir: GraphIR, registry: BackendRegistry) -> Counter[str]:
    """Counts by classified kind, asking the backends once per distinct kernel."""
    out: Counter[str] = Counter()
    for kernel, count in ir.kernel_table().values():
        match = registry.recognise(kernel)
        if match is not None:
            out[match.kind] += count
    return out

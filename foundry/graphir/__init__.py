"""The typed graph IR. Nothing here imports torch or CUDA except ``lower``."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# where each public name lives; imported on first use, so that importing a module of this
# package (`foundry run` does) does not import all of it
_WHERE = {
    "Edge": "foundry.graphir.graph",
    "EdgeData": "foundry.graphir.graph",
    "GraphIR": "foundry.graphir.graph",
    "KernelIdentity": "foundry.graphir.kernel",
    "LaunchConfig": "foundry.graphir.kernel",
    "ParamLayout": "foundry.graphir.kernel",
    "ParamSlot": "foundry.graphir.kernel",
    "NodeKind": "foundry.graphir.kinds",
    "KernelNode": "foundry.graphir.nodes",
    "MemcpyNode": "foundry.graphir.nodes",
    "MemsetNode": "foundry.graphir.nodes",
    "Node": "foundry.graphir.nodes",
    "Operand": "foundry.graphir.operands",
    "OperandSite": "foundry.graphir.operands",
    "Region": "foundry.graphir.regions",
    "RegionKind": "foundry.graphir.regions",
}

if TYPE_CHECKING:
    from foundry.graphir.graph import Edge, EdgeData, GraphIR
    from foundry.graphir.kernel import KernelIdentity, LaunchConfig, ParamLayout, ParamSlot
    from foundry.graphir.kinds import NodeKind
    from foundry.graphir.nodes import KernelNode, MemcpyNode, MemsetNode, Node
    from foundry.graphir.operands import Operand, OperandSite
    from foundry.graphir.regions import Region, RegionKind

__all__ = [
    "Edge",
    "EdgeData",
    "GraphIR",
    "KernelIdentity",
    "KernelNode",
    "LaunchConfig",
    "MemcpyNode",
    "MemsetNode",
    "Node",
    "NodeKind",
    "Operand",
    "OperandSite",
    "ParamLayout",
    "ParamSlot",
    "Region",
    "RegionKind",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value

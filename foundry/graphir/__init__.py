"""The typed graph IR. Nothing here imports torch or CUDA except ``lower``."""

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

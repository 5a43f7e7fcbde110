"""Node kinds of a captured CUDA graph, named after ``CUgraphNodeType``."""

from __future__ import annotations

from enum import StrEnum


class NodeKind(StrEnum):
    """What a graph node does. Values are stable: they appear in archives."""

    KERNEL = "kernel"
    MEMCPY = "memcpy"
    MEMSET = "memset"
    HOST = "host"
    CHILD_GRAPH = "child_graph"
    EMPTY = "empty"
    EVENT_WAIT = "event_wait"
    EVENT_RECORD = "event_record"
    EXT_SEMAS_SIGNAL = "ext_semas_signal"
    EXT_SEMAS_WAIT = "ext_semas_wait"
    MEM_ALLOC = "mem_alloc"
    MEM_FREE = "mem_free"
    BATCH_MEM_OP = "batch_mem_op"
    CONDITIONAL = "conditional"


#: Kinds a LOAD can rebuild. Every other kind is lowered and kept, so lint can
#: name it, but LOAD refuses a graph that holds one.
RESTORABLE_KINDS = frozenset(
    {
        NodeKind.KERNEL,
        NodeKind.MEMCPY,
        NodeKind.MEMSET,
        NodeKind.EMPTY,
        NodeKind.EVENT_RECORD,
        NodeKind.EVENT_WAIT,
    }
)

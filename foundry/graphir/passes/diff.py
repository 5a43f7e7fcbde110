"""What differs between two graphs, aligned for people.

A changed graph's nodes are aligned by (kind, kernel) with a longest-matching-block
alignment, so one inserted node shows as one node only in B rather than as every
later node changed. Matched nodes are compared field by field on their semantic
views: kernel, launch config, scalar parameter bytes, and operand targets
``(region, offset)``. A parameter byte either SAVE marked undefined is left out on
both sides: which unused bytes a SAVE's runs happen to disagree on varies from SAVE
to SAVE, so two SAVEs of the same program can differ in fingerprint and still be
the same graph (:mod:`foundry.inspect.archive_diff` says so: ``undefined_only``).
A kernel whose mangled name differs only in nvcc's per-compilation anonymous-namespace
id is the same source built twice (a JIT build per machine): it is aligned as the
same kernel and its name change is marked ``kernel.rebuilt``. Edges are compared
through the alignment: one both graphs have with another kind (the producer's port, the
dependency type: a programmatic edge lets its consumer start before the producer ends)
is listed as changed, not as one edge only in each graph.
The diff is a pure function; the CLI and the TUI only render it.

A diff stays bounded however much differs: it lists differences up to a budget
(``listed``, :data:`LISTED` by default: a node and each of its changes cost one,
at most :data:`LISTED_CHANGES` changes per node, values cut at
:data:`VALUE_CHARS` characters) and counts the rest; nodes are aligned by
sequence matching only within :data:`ALIGN_CELLS` (the common head and tail of
the two graphs are paired first), past that by position.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import msgspec

from foundry.graphir.fingerprint import operand_target, scalar_bytes
from foundry.graphir.graph import EdgeData, GraphIR
from foundry.graphir.nodes import KernelNode, Node, ranges_minus
from foundry.graphir.operands import Operand

REBUILT = "kernel.rebuilt"  # the subject of a kernel name that another build of its source gives
LISTED = 20_000  # nodes, changes, edges and marks a diff lists (of one graph; the archive's diff shares it)
LISTED_CHANGES = 256  # changes listed for one node
VALUE_CHARS = 4_096  # characters of a value listed (the longest kernel name seen: about 2,200)
ALIGN_CELLS = 1 << 24  # nodes of A times nodes of B that sequence matching may align


class Status(StrEnum):
    SAME = "same"
    CHANGED = "changed"
    ONLY_A = "only_a"
    ONLY_B = "only_b"


@dataclass(frozen=True)
class FieldChange:
    """One difference: ``field`` as people read it (``param[3] bytes 12..15``),
    the two values, and ``subject``, the item it belongs to, for tools that
    group changes: ``param[i]`` for a parameter's bytes or pointer words, the
    operand site (``memcpy.dst``, ...) for other pointers, else the field name."""

    field: str
    a: str
    b: str
    subject: str = ""

    def __post_init__(self) -> None:
        if not self.subject:
            object.__setattr__(self, "subject", self.field)
        for side in ("a", "b"):
            value = getattr(self, side)
            if len(value) > VALUE_CHARS:
                object.__setattr__(self, side, f"{value[:VALUE_CHARS]}... ({len(value)} characters)")


@dataclass
class NodeDiff:
    status: Status
    a: int | None
    b: int | None
    label: str
    changes: list[FieldChange] = field(default_factory=list)
    changes_not_listed: int = 0


@dataclass
class MarkDiff:
    """A kernel node whose undefined bytes one SAVE marked and the other did not."""

    node: int
    label: str
    only_a: int  # bytes marked undefined in A only
    only_b: int


@dataclass
class GraphDiff:
    rank: int
    name: str
    status: Status
    fingerprint_a: str | None = None
    fingerprint_b: str | None = None
    nodes: list[NodeDiff] = field(default_factory=list)
    edges_changed: list[EdgeChange] = field(default_factory=list)  # in both, of another kind
    edges_only_a: list[tuple[int, int]] = field(default_factory=list)
    edges_only_b: list[tuple[int, int]] = field(default_factory=list)
    undefined_only: bool = False  # SAME though the fingerprints differ: only in bytes one side marked undefined
    marks_differ: list[MarkDiff] = field(default_factory=list)  # where the two SAVEs' undefined bytes differ
    nodes_not_listed: int = 0  # differing nodes past the diff's budget
    edges_not_listed: int = 0
    marks_not_listed: int = 0

    @property
    def listed(self) -> int:
        """What this graph's diff lists, in the units of the budget."""
        nodes = sum(1 + len(n.changes) for n in self.nodes)
        edges = len(self.edges_changed) + len(self.edges_only_a) + len(self.edges_only_b)
        return nodes + edges + len(self.marks_differ)

    @property
    def edge_count(self) -> int:
        """Differing edges (another kind, or in one graph only), listed or not."""
        return len(self.edges_changed) + len(self.edges_only_a) + len(self.edges_only_b) + self.edges_not_listed

    @property
    def node_count(self) -> int:
        """Differing nodes, listed or not."""
        return len(self.nodes) + self.nodes_not_listed


@dataclass(frozen=True)
class EdgeChange:
    """An edge both graphs have (between aligned nodes) with another kind: ``a`` and ``b`` are
    its ``(src, dst)`` in each graph, ``data_a`` and ``data_b`` its ports and type there."""

    a: tuple[int, int]
    b: tuple[int, int]
    data_a: EdgeData
    data_b: EdgeData

    @property
    def kind_a(self) -> str:
        return self.data_a.kind

    @property
    def kind_b(self) -> str:
        return self.data_b.kind


class _Budget:
    """How much more a diff may list."""

    def __init__(self, listed: int) -> None:
        self.left = listed

    def node(self, result: GraphDiff, node: NodeDiff) -> None:
        if self.left <= 0:
            result.nodes_not_listed += 1
            return
        keep = min(len(node.changes), LISTED_CHANGES, self.left - 1)
        node.changes_not_listed = len(node.changes) - keep
        del node.changes[keep:]
        self.left -= 1 + keep
        result.nodes.append(node)

    def take(self, items: list) -> tuple[list, int]:
        """The items it may list, and how many it may not."""
        keep = max(0, min(len(items), self.left))
        self.left -= keep
        return items[:keep], len(items) - keep


# -- nodes ------------------------------------------------------------------------


def node_label(node: Node) -> str:
    return node.kernel.short_name if isinstance(node, KernelNode) else str(node.kind)


def _align_key(node: Node) -> tuple[str, str]:
    return (str(node.kind), node.kernel.across_builds if isinstance(node, KernelNode) else "")


def _targets(operands: tuple[Operand, ...]) -> dict[str, tuple[str, str]]:
    """``where -> (subject, target)`` for every pointer word of a node."""
    out = {}
    for o in operands:
        subject = f"param[{o.param}]" if o.param >= 0 else str(o.site)
        where = f"{subject}+{o.offset}" if o.param >= 0 else subject
        region, offset = operand_target(o)
        out[where] = (subject, f"{region}+0x{offset:x}")
    return out


def _byte_runs(a: bytes, b: bytes) -> list[tuple[int, int]]:
    """Half-open ranges of byte offsets where ``a`` and ``b`` differ."""
    runs: list[tuple[int, int]] = []
    for i in range(max(len(a), len(b))):
        differs = i >= len(a) or i >= len(b) or a[i] != b[i]
        if differs and runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        elif differs:
            runs.append((i, i + 1))
    return runs


def _param_changes(na: KernelNode, oa: tuple[Operand, ...], nb: KernelNode, ob: tuple[Operand, ...]) -> list:
    changes = []
    sa, sb = scalar_bytes(na, oa, nb.undefined), scalar_bytes(nb, ob, na.undefined)
    if sa == sb:
        return changes
    for start, end in _byte_runs(sa, sb):
        index = na.layout.slot_at(start)
        param = f"param[{index}]" if index is not None else "params"
        a, b = sa[start:end].hex(), sb[start:end].hex()
        changes.append(FieldChange(f"{param} bytes {start}..{end - 1}", a, b, param))
    return changes


def compare_nodes(na: Node, oa: tuple[Operand, ...], nb: Node, ob: tuple[Operand, ...]) -> list[FieldChange]:
    """Field-level differences between two aligned nodes (semantic, not raw addresses)."""
    changes: list[FieldChange] = []

    def check(name: str, a: Any, b: Any) -> None:
        if a != b:
            changes.append(FieldChange(name, str(a), str(b)))

    if type(na) is not type(nb):
        check("kind", na.kind, nb.kind)
        return changes
    if isinstance(na, KernelNode) and isinstance(nb, KernelNode):
        if na.kernel.name != nb.kernel.name:
            rebuilt = na.kernel.across_builds == nb.kernel.across_builds
            changes.append(FieldChange("kernel", na.kernel.name, nb.kernel.name, REBUILT if rebuilt else "kernel"))
        check("image", na.kernel.image, nb.kernel.image)
        check("grid", na.launch.grid, nb.launch.grid)
        check("block", na.launch.block, nb.launch.block)
        check("shared_mem", na.launch.shared_mem, nb.launch.shared_mem)
        check("attributes", _attributes(na), _attributes(nb))
        check("func_attrs", na.func_attrs, nb.func_attrs)
        check("arg_mode", na.arg_mode, nb.arg_mode)
        check("packed_size", na.launch_bytes(), nb.launch_bytes())
        check("layout", na.layout.slots, nb.layout.slots)
        changes.extend(_param_changes(na, oa, nb, ob))
    else:
        fa, fb = msgspec.structs.asdict(na), msgspec.structs.asdict(nb)
        for key in fa:
            if key not in ("id", "src", "dst"):
                check(key, fa[key], fb[key])
    ta, tb = _targets(oa), _targets(ob)
    for where in sorted(ta.keys() | tb.keys()):
        subject = (ta.get(where) or tb[where])[0]
        a, b = ta.get(where, (subject, "(scalar)"))[1], tb.get(where, (subject, "(scalar)"))[1]
        if a != b:
            changes.append(FieldChange(f"operand {where}", a, b, subject))
    return changes


def _attributes(node: KernelNode) -> list[tuple[str, Any]]:
    out = []
    for attr in node.launch.attributes:
        value = attr.value
        if isinstance(value, dict):
            value = {k: v for k, v in value.items() if k != "base_ptr"}
        out.append((attr.name, value))
    return out


# -- graphs -----------------------------------------------------------------------


def _opcodes(keys_a: list, keys_b: list) -> list[tuple[str, int, int, int, int]]:
    """Alignment of two key sequences: the common head and tail paired as they are, the rest
    by sequence matching where it fits :data:`ALIGN_CELLS` (its cost grows with the product
    of the lengths), by position beyond."""
    n, m = len(keys_a), len(keys_b)
    head = 0
    while head < min(n, m) and keys_a[head] == keys_b[head]:
        head += 1
    tail = 0
    while tail < min(n, m) - head and keys_a[n - 1 - tail] == keys_b[m - 1 - tail]:
        tail += 1
    out = [("equal", 0, head, 0, head)] if head else []
    middle_a, middle_b = keys_a[head : n - tail], keys_b[head : m - tail]
    if middle_a or middle_b:
        if len(middle_a) * len(middle_b) <= ALIGN_CELLS:
            matcher = difflib.SequenceMatcher(None, middle_a, middle_b, autojunk=False)
            out += [(t, i1 + head, i2 + head, j1 + head, j2 + head) for t, i1, i2, j1, j2 in matcher.get_opcodes()]
        else:
            out.append(("replace", head, n - tail, head, m - tail))
    if tail:
        out.append(("equal", n - tail, n, m - tail, m))
    return out


def diff_graphs(a: GraphIR, b: GraphIR, *, rank: int = 0, listed: int = LISTED) -> GraphDiff:
    """Align and compare two graphs node by node, then compare edges through the alignment;
    list differences up to ``listed`` (see the module docstring) and count the rest."""
    nodes_a, nodes_b = a.nodes(), b.nodes()
    result = GraphDiff(rank, a.name, Status.SAME)
    budget = _Budget(listed)
    mapping: dict[int, int] = {}
    for tag, i1, i2, j1, j2 in _opcodes([_align_key(n) for n in nodes_a], [_align_key(n) for n in nodes_b]):
        paired = min(i2 - i1, j2 - j1) if tag in ("equal", "replace") else 0
        for k in range(paired):
            na, nb = nodes_a[i1 + k], nodes_b[j1 + k]
            mapping[na.id] = nb.id
            changes = compare_nodes(na, a.operands.of(na.id), nb, b.operands.of(nb.id))
            if changes:
                budget.node(result, NodeDiff(Status.CHANGED, na.id, nb.id, node_label(na), changes))
        for na in nodes_a[i1 + paired : i2]:
            budget.node(result, NodeDiff(Status.ONLY_A, na.id, None, node_label(na)))
        for nb in nodes_b[j1 + paired : j2]:
            budget.node(result, NodeDiff(Status.ONLY_B, None, nb.id, node_label(nb)))
    changed, only_a, only_b = _edge_differences(a, b, mapping)
    result.edges_changed, not_changed = budget.take(changed)
    result.edges_only_a, not_a = budget.take(only_a)
    result.edges_only_b, not_b = budget.take(only_b)
    result.edges_not_listed = not_changed + not_a + not_b
    if result.node_count or result.edge_count:
        result.status = Status.CHANGED
    return result


def _edge_differences(
    a: GraphIR, b: GraphIR, mapping: dict[int, int]
) -> tuple[list[EdgeChange], list[tuple[int, int]], list[tuple[int, int]]]:
    """Through the node alignment: edges both graphs have with another kind, then those only
    in A, then those only in B."""
    data_b = {(e.src, e.dst): e.data for e in b.edges()}
    matched: set[tuple[int, int]] = set()
    changed, only_a = [], []
    for e in a.edges():
        there = (mapping.get(e.src), mapping.get(e.dst))
        theirs = data_b.get(there)  # an unaligned end (None) matches nothing
        if theirs is None:
            only_a.append((e.src, e.dst))
            continue
        matched.add(there)
        if theirs != e.data:
            changed.append(EdgeChange((e.src, e.dst), there, e.data, theirs))
    return changed, sorted(only_a), sorted(k for k in data_b if k not in matched)


def mark_differences(a: GraphIR, b: GraphIR, *, listed: int = LISTED) -> tuple[list[MarkDiff], int]:
    """Kernel nodes (paired by id: the graphs have the same nodes) whose undefined bytes
    differ between the two SAVEs, with how many bytes each marked alone: the first
    ``listed`` of them, and how many more there are."""
    out, more = [], 0
    for node in a.kernels():
        other = b.node(node.id)
        if not isinstance(other, KernelNode):
            continue
        mine, theirs = node.undefined_ranges(), other.undefined_ranges()
        if mine == theirs:
            continue
        if len(out) < listed:
            out.append(MarkDiff(node.id, node_label(node), ranges_minus(mine, theirs), ranges_minus(theirs, mine)))
        else:
            more += 1
    return out, more

"""Relocation, checked: two SAVEs at different region bases.

Only words proven to be pointers may be relocated. A word is proven when it is
an operand (it lay in a known allocation at SAVE) *and* it moves by exactly the
base delta between two SAVEs made at different bases. :func:`check_relocations`
compares such a pair graph by graph: every parameter byte that changed must lie
in an operand word of both graphs that moved by its region's delta, every
operand of a region that moved must have moved, and nothing else may change.
Anything else is a finding — a pointer the manifest missed (a TMA descriptor,
a packed address) or an operand that is really scalar data.

:func:`rebase` makes the other half of such a pair from one graph, for tests.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import msgspec

from foundry.archive.reader import Archive
from foundry.graphir.fingerprint import topology_key
from foundry.graphir.graph import GraphIR
from foundry.graphir.nodes import KernelNode, MemcpyNode, MemsetNode, merged_ranges
from foundry.graphir.operands import WORD, Operand, OperandSite
from foundry.graphir.regions import UNRESOLVED


@dataclass(frozen=True)
class RelocationFinding:
    rank: int | None  # None: about the pair as a whole
    graph: str
    node: int | None
    what: str
    a: str = ""
    b: str = ""


LISTED_FINDINGS = 10_000  # findings a report lists; the rest are counted


@dataclass
class RelocationReport:
    deltas: dict[str, int] = field(default_factory=dict)
    graphs: int = 0
    operands_moved: int = 0
    operands_fixed: int = 0  # in regions that did not move
    findings: list[RelocationFinding] = field(default_factory=list)  # the first LISTED_FINDINGS
    findings_not_listed: int = 0

    def add(self, finding: RelocationFinding) -> None:
        """List ``finding``, or count it once the report lists as many as it may."""
        if len(self.findings) < LISTED_FINDINGS:
            self.findings.append(finding)
        else:
            self.findings_not_listed += 1

    @property
    def finding_count(self) -> int:
        return len(self.findings) + self.findings_not_listed

    def to_dict(self) -> dict:
        return {
            "deltas": {k: hex(v) for k, v in self.deltas.items()},
            "graphs": self.graphs,
            "operands_moved": self.operands_moved,
            "operands_fixed": self.operands_fixed,
            "findings": [vars(f) for f in self.findings],
            "findings_not_listed": self.findings_not_listed,
        }


def rebase(ir: GraphIR, deltas: dict[str, int]) -> GraphIR:
    """A copy of ``ir`` as a SAVE with each named region moved by its delta would have captured it."""
    out = GraphIR(ir.name, regions=[msgspec.structs.replace(r, base=r.base + deltas.get(r.name, 0))
                                    for r in ir.regions.values()], meta=ir.meta)  # fmt: skip
    by_node: dict[int, list[Operand]] = {}
    operands = []
    for o in ir.operands:
        value = o.value + deltas.get(o.region, 0) if o.region != UNRESOLVED else o.value
        operands.append(msgspec.structs.replace(o, value=value))
        by_node.setdefault(o.node, []).append(operands[-1])
    nodes = []
    for node in ir.nodes():
        for o in by_node.get(node.id, ()):
            node = _with_address(node, o)
        nodes.append(node)
    out.add_nodes(nodes)
    out.add_edges(ir.edges())
    out.set_operands(operands)
    return out


def _with_address(node, operand: Operand):
    if operand.site is OperandSite.PARAM and isinstance(node, KernelNode):
        params = bytearray(node.params)
        params[operand.offset : operand.offset + WORD] = operand.value.to_bytes(WORD, "little")
        return msgspec.structs.replace(node, params=bytes(params))
    if operand.site is OperandSite.MEMCPY_SRC:
        return msgspec.structs.replace(node, src=operand.value)
    if operand.site in (OperandSite.MEMCPY_DST, OperandSite.MEMSET_DST):
        return msgspec.structs.replace(node, dst=operand.value)
    return node


def _deltas(a: GraphIR, b: GraphIR) -> dict[str, int] | None:
    if a.regions.keys() != b.regions.keys():
        return None
    return {name: b.regions[name].base - a.regions[name].base for name in a.regions}


def check_graph_pair(a: GraphIR, b: GraphIR, report: RelocationReport, rank: int = 0) -> None:
    """Add the findings of one graph pair to ``report``."""

    def find(node: int | None, what: str, va: str = "", vb: str = "") -> None:
        report.add(RelocationFinding(rank, a.name, node, what, va, vb))

    deltas = _deltas(a, b)
    if deltas is None or topology_key(a) != topology_key(b):
        find(None, "the graphs differ in regions or structure; they are not the same step")
        return
    report.deltas.update({k: v for k, v in deltas.items() if v})
    report.graphs += 1
    for na in a.nodes():
        nb = b.node(na.id)
        ops_a = {o.key: o for o in a.operands.of(na.id)}
        ops_b = {o.key: o for o in b.operands.of(na.id)}
        for key in ops_a.keys() | ops_b.keys():
            oa, ob = ops_a.get(key), ops_b.get(key)
            if oa is None or ob is None:
                find(na.id, f"{key[1]} word at byte {key[2]} is an operand in only one SAVE",
                     hex(oa.value) if oa else "-", hex(ob.value) if ob else "-")  # fmt: skip
                continue
            delta = deltas.get(oa.region, 0)
            if (oa.region, oa.region_offset) != (ob.region, ob.region_offset) or ob.value - oa.value != delta:
                find(na.id, f"{key[1]} operand at byte {key[2]} moved by {ob.value - oa.value:#x}, "
                     f"not its region's {delta:#x}", oa.location(), ob.location())  # fmt: skip
            elif delta:
                report.operands_moved += 1
            else:
                report.operands_fixed += 1
        if isinstance(na, KernelNode) and isinstance(nb, KernelNode):
            covered = merged_ranges([(k[2], k[2] + WORD) for k in ops_a if k[1] == OperandSite.PARAM]
                                    + na.undefined_ranges() + nb.undefined_ranges())  # fmt: skip
            for i, (x, y) in enumerate(zip(na.params, nb.params, strict=False)):
                if x != y and not _inside(covered, i):
                    word = i // WORD * WORD
                    find(na.id, f"parameter byte {i} changed but is no operand (a pointer the manifest missed?)",
                         na.params[word : word + WORD].hex(), nb.params[word : word + WORD].hex())  # fmt: skip
                    break  # one finding per node is enough to name it
        elif isinstance(na, MemcpyNode | MemsetNode):
            if _without_addresses(na) != _without_addresses(nb):
                find(na.id, "a copy or set changed in more than its addresses")
            sites = {k[1] for k in ops_a}
            fields = (
                [("src", OperandSite.MEMCPY_SRC), ("dst", OperandSite.MEMCPY_DST)]
                if isinstance(na, MemcpyNode)
                else [("dst", OperandSite.MEMSET_DST)]
            )
            for field_name, site in fields:
                va, vb = getattr(na, field_name), getattr(nb, field_name)
                if va != vb and site not in sites:
                    find(na.id, f"{site.value} address changed but is no operand", hex(va), hex(vb))


def _inside(ranges: list[tuple[int, int]], offset: int) -> bool:
    """Whether ``offset`` lies in one of the merged ``[start, end)`` ranges."""
    at = bisect.bisect_right(ranges, (offset, 1 << 64)) - 1
    return at >= 0 and offset < ranges[at][1]


def _without_addresses(node) -> dict:
    fields = msgspec.structs.asdict(node)
    for key in ("src", "dst"):
        fields.pop(key, None)
    return fields


def check_relocations(a: Archive, b: Archive) -> RelocationReport:
    """Compare two SAVEs of the same program made at different region bases."""
    report = RelocationReport()
    for rank in a.ranks:
        names_b = {e.name for e in b.entries(rank)} if rank in b.ranks else set()
        for entry in a.entries(rank):
            if entry.name not in names_b:
                report.add(RelocationFinding(rank, entry.name, None, "graph missing from the second SAVE"))
                continue
            check_graph_pair(a.graph(rank, entry), b.graph(rank, entry.name), report, rank)
    for rank in b.ranks:
        names_a = {e.name for e in a.entries(rank)} if rank in a.ranks else set()
        for entry in b.entries(rank):
            if entry.name not in names_a:
                report.add(RelocationFinding(rank, entry.name, None, "graph missing from the first SAVE"))
    if not report.deltas:
        report.add(RelocationFinding(None, "", None, "no region moved between the two SAVEs: nothing proven"))
    return report

"""``foundry graph lint``: built-in rules and ``--expect KIND=N`` counts over an archive
(``kernel:GLOB=N``: the kernels whose name matches GLOB).

An expectation holds for every selected graph on every selected rank; with
``total`` it holds for the sum over the selection instead. Rules report
findings with a severity: errors (and failed expectations) make lint fail,
warnings are shown and fail only under ``strict``. At most :data:`LISTED_FINDINGS`
findings are listed, however large the archive; the rest are counted by severity.
"""

from __future__ import annotations

import fnmatch
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum

import msgspec

from foundry.archive.reader import Archive
from foundry.archive.schema import GraphEntry, ModuleState
from foundry.backends.base import KernelMatch
from foundry.backends.classify import classify
from foundry.backends.registry import BackendRegistry
from foundry.errors import LintError
from foundry.graphir.graph import GraphIR
from foundry.graphir.kinds import NodeKind
from foundry.graphir.nodes import KernelNode, Node, UnsupportedNode
from foundry.graphir.regions import RegionKind
from foundry.inspect.choose import selection, suggestion, unknown
from foundry.inspect.fanout import map_graphs

LISTED_FINDINGS = 10_000  # findings a report lists; the rest are counted


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


class Finding(msgspec.Struct, frozen=True):
    rule: str
    severity: Severity
    message: str
    rank: int | None = None
    graph: str | None = None
    node: int | None = None
    kernel: str | None = None


KERNEL_NAMED = "kernel:"  # ``kernel:GLOB``: the kernels whose name matches GLOB


class Expectation(msgspec.Struct, frozen=True):
    kind: str  # a node or backend kind, or kernel:GLOB
    count: int

    @classmethod
    def parse(cls, text: str) -> Expectation:
        found = re.fullmatch(r"\s*([A-Za-z0-9_-]+|kernel:[!-<>-~]+)\s*=\s*(\d+)\s*", text)
        if found is None:
            raise LintError("an expectation is KIND=N or kernel:GLOB=N, e.g. symm-allreduce=73 or "
                            "kernel:fused_moe_kernel=96", found=text)  # fmt: skip
        return cls(found.group(1), int(found.group(2)))  # GLOB: printable ASCII, no space or '=' (use ?)

    @property
    def kernel_glob(self) -> str | None:
        """GLOB of a ``kernel:GLOB`` expectation; None for a kind."""
        return self.kind.removeprefix(KERNEL_NAMED) if self.kind.startswith(KERNEL_NAMED) else None


class ExpectationResult(msgspec.Struct, frozen=True):
    kind: str
    expected: int
    found: int
    ok: bool
    rank: int | None = None  # None with --total
    graph: str | None = None


@dataclass
class GraphContext:
    """What a rule sees: one graph of one rank, and the backends."""

    archive: Archive
    rank: int
    entry: GraphEntry
    ir: GraphIR
    registry: BackendRegistry

    _claims: dict[int, KernelMatch] | None = None
    _nodes: list[Node] | None = None

    def nodes(self) -> list[Node]:
        """The graph's nodes in id order (listed once for every rule)."""
        if self._nodes is None:
            self._nodes = self.ir.nodes()
        return self._nodes

    def kernels(self) -> list[KernelNode]:
        return [node for node in self.nodes() if isinstance(node, KernelNode)]

    def claims(self) -> dict[int, KernelMatch]:
        """Backend claims by node id (computed when a rule first asks)."""
        if self._claims is None:
            self._claims = classify(self.ir, self.registry, self.kernels())
        return self._claims


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    check: Callable[[GraphContext], Iterator[Finding]]


def _unresolved_pointer(ctx: GraphContext) -> Iterator[Finding]:
    if not ctx.ir.operands.count_unresolved():  # the usual case, at C speed
        return
    for operand in ctx.ir.operands.unresolved():
        where = f"param {operand.param} offset {operand.offset}" if operand.param >= 0 else operand.site.value
        yield Finding(
            "unresolved-pointer",
            Severity.ERROR,
            f"pointer 0x{operand.value:x} at {where} lies in no known allocation",
            ctx.rank,
            ctx.entry.name,
            operand.node,
        )


def _unsupported_node(ctx: GraphContext) -> Iterator[Finding]:
    if not any(issubclass(kind, UnsupportedNode) for kind in set(map(type, ctx.nodes()))):
        return  # the usual case, at C speed
    for node in ctx.nodes():
        if isinstance(node, UnsupportedNode):
            detail = f" ({node.detail})" if node.detail else ""
            yield Finding(
                "unsupported-node",
                Severity.ERROR,
                f"{node.node_type} node{detail} cannot be restored by LOAD",
                ctx.rank,
                ctx.entry.name,
                node.id,
            )


def _missing_module_image(ctx: GraphContext) -> Iterator[Finding]:
    modules = ctx.archive.catalog.modules
    if modules.state is ModuleState.ABSENT:
        yield Finding(
            "missing-module-image",
            Severity.WARNING,
            "archive records no module images: it can be inspected and diffed, not loaded",
            ctx.rank,
            ctx.entry.name,
        )
        return
    if modules.state is ModuleState.STRIPPED:
        yield Finding(
            "missing-module-image",
            Severity.WARNING,
            "module images were stripped from this archive: LOAD will refuse it",
            ctx.rank,
            ctx.entry.name,
        )
        return
    listed = {blob.sha256 for blob in modules.blobs}
    for node in ctx.kernels():
        image = node.kernel.image
        if image is None:
            message = "kernel has no module image identity"
        elif image not in listed or not ctx.archive.module_present(image):
            message = f"module image {image[:12]} is not in the archive"
        else:
            continue
        yield Finding(
            "missing-module-image", Severity.ERROR, message, ctx.rank, ctx.entry.name, node.id, node.kernel.name
        )


def _unrelocatable_collective(ctx: GraphContext) -> Iterator[Finding]:
    """A claimed kernel with pointers outside the deterministic region that its backend cannot relocate."""
    for node_id, match in sorted(ctx.claims().items()):
        outside = [o for o in ctx.ir.operands.of(node_id) if o.region != RegionKind.VMM]
        if match.relocatable or not outside:
            continue
        node = ctx.ir.node(node_id)
        cannot = f"{match.kind}: backend {match.backend!r} cannot relocate its pointers outside the region"
        if match.requires:  # the backend decides at LOAD, from the live process, or refuses by name
            message = (f"{cannot} (it needs {match.requires}); LOAD restores this graph only where the backend "
                       f"accepts the live process's {match.requires}")  # fmt: skip
        else:
            message = f"{cannot}; LOAD will refuse this graph"
        yield Finding(
            "unrelocatable-collective",
            Severity.WARNING,
            message,
            ctx.rank,
            ctx.entry.name,
            node_id,
            getattr(getattr(node, "kernel", None), "name", None),
        )


RULES: dict[str, Rule] = {
    rule.name: rule
    for rule in (
        Rule("unresolved-pointer", "a pointer word lies in no known allocation (error)", _unresolved_pointer),
        Rule("unsupported-node", "a node kind LOAD cannot rebuild: host, child graph, ... (error)", _unsupported_node),
        Rule(
            "missing-module-image",
            "a kernel's module image is not in the archive (error; a warning when the "
            "archive records no images or they were stripped)",
            _missing_module_image,
        ),
        Rule(
            "unrelocatable-collective",
            "a collective kernel with pointers outside the region that its backend "
            "cannot relocate, so LOAD refuses the graph (warning)",
            _unrelocatable_collective,
        ),
    )
}


@dataclass
class GraphCounts:
    rank: int
    graph: str
    counts: Counter[str]


@dataclass
class LintReport:
    graphs: list[GraphCounts] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)  # the first LISTED_FINDINGS
    expectations: list[ExpectationResult] = field(default_factory=list)
    not_listed: Counter[Severity] = field(default_factory=Counter)  # findings past the listed ones

    def add(self, finding: Finding) -> None:
        """List ``finding``, or count it once the report lists as many as it may."""
        if len(self.findings) < LISTED_FINDINGS:
            self.findings.append(finding)
        else:
            self.not_listed[finding.severity] += 1

    def count(self, severity: Severity) -> int:
        """Findings of ``severity``, listed or not."""
        return sum(f.severity is severity for f in self.findings) + self.not_listed[severity]

    def failed(self, *, strict: bool = False) -> bool:
        severities = {Severity.ERROR, Severity.WARNING} if strict else {Severity.ERROR}
        return any(self.count(s) for s in severities) or any(not e.ok for e in self.expectations)

    def to_dict(self, *, strict: bool = False) -> dict:
        return {
            "ok": not self.failed(strict=strict),
            "graphs": [
                {"rank": g.rank, "graph": g.graph, "counts": dict(sorted(g.counts.items()))} for g in self.graphs
            ],
            "expectations": [msgspec.structs.asdict(e) for e in self.expectations],
            "findings": [msgspec.structs.asdict(f) for f in self.findings],
            "findings_not_listed": {str(k): v for k, v in sorted(self.not_listed.items())},
        }


def known_kinds(registry: BackendRegistry) -> set[str]:
    """Every kind ``--expect`` counts: node kinds and the kinds the backends recognise."""
    return {str(k) for k in NodeKind} | registry.kinds()


def unknown_kind(kind: str, registry: BackendRegistry) -> LintError:
    """An unknown ``--expect`` kind refused with the closest known one and where the rest are listed."""
    near = suggestion(kind, known_kinds(registry))
    hint = f"did you mean {near!r}? " if near else ""
    nodes = ", ".join(str(k) for k in (NodeKind.KERNEL, NodeKind.MEMCPY, NodeKind.MEMSET))
    return LintError(f"unknown kind {kind!r}; {hint}a kind is a node kind ({nodes}, ...) or a kind a backend "
                     "recognises (`foundry backends list` shows them)", field="--expect")  # fmt: skip


def lint(
    archive: Archive,
    registry: BackendRegistry,
    *,
    rank: int | None = None,
    pattern: str | None = None,
    expectations: Iterable[Expectation] = (),
    total: bool = False,
    disabled: Iterable[str] = (),
    workers: int | None = 1,
    meanwhile: Callable[[], object] | None = None,
) -> LintReport:
    """Run the enabled rules and check the expectations over the selected graphs; ``workers``:
    processes that read the graphs (None: one per core on a large archive), ``meanwhile``: what
    this process does while they read (:func:`foundry.inspect.fanout.map_graphs`)."""
    expectations = list(expectations)
    disabled = set(disabled)
    unknown_rules = sorted(disabled - RULES.keys())
    if unknown_rules:
        raise unknown(unknown_rules[0], RULES, what="rule", option="--disable")
    kinds = known_kinds(registry)
    for exp in expectations:
        if exp.kernel_glob is None and exp.kind not in kinds:
            raise unknown_kind(exp.kind, registry)
    globs = tuple(sorted({e.kernel_glob for e in expectations if e.kernel_glob}))
    selected = selection(archive, rank=rank, pattern=pattern)
    rules = [r for name, r in RULES.items() if name not in disabled]
    report = LintReport()
    for r, entry, counts, findings in map_graphs(
        archive, selected, lint_graph, (registry, rules, globs), workers=workers, meanwhile=meanwhile
    ):
        report.graphs.append(GraphCounts(r, entry.name, counts))
        for finding in findings:
            report.add(finding)
        if not total:
            report.expectations.extend(
                ExpectationResult(e.kind, e.count, counts[e.kind], counts[e.kind] == e.count, r, entry.name)
                for e in expectations
            )
    if total:
        summed = sum((g.counts for g in report.graphs), Counter())
        report.expectations = [
            ExpectationResult(e.kind, e.count, summed[e.kind], summed[e.kind] == e.count) for e in expectations
        ]
    return report


def lint_graph(archive: Archive, context: tuple[BackendRegistry, list[Rule], tuple[str, ...]], rank: int,
               entry: GraphEntry) -> tuple[int, GraphEntry, Counter[str], list[Finding]]:  # fmt: skip
    """Read one graph (its checks included), count its kinds and the kernels each of
    ``context``'s globs names, and run its rules on it."""
    registry, rules, globs = context
    ir = archive.graph(rank, entry, deep=False)
    ctx = GraphContext(archive, rank, entry, ir, registry)
    counts = ir.counts_by_kind() + Counter(match.kind for match in ctx.claims().values())
    if globs:
        counts.update(_kernels_named(ctx.kernels(), globs))
    return rank, entry, counts, [finding for rule in rules for finding in rule.check(ctx)]


def _kernels_named(kernels: list[KernelNode], globs: tuple[str, ...]) -> Counter[str]:
    """``kernel:GLOB`` counts: a kernel counts where GLOB matches its name as ``graph show``
    lists it (``at::native::reduce_kernel<...>``) or its mangled name."""
    counts: Counter[str] = Counter()  # as for kinds, a glob that matched nothing has no entry
    for node in kernels:
        names = (node.kernel.short_name, node.kernel.name)
        counts.update(KERNEL_NAMED + g for g in globs if any(fnmatch.fnmatchcase(n, g) for n in names))
    return counts

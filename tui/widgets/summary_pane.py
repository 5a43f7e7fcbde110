"""The summary pane: kernel histogram, collectives by kind, regions with sizes,
unresolved pointers and lint findings of the whole archive.

It renders :class:`~foundry.inspect.summary.ArchiveSummary` and
:class:`~foundry.inspect.lint.LintReport` as the passes return them;
the screen computes both in a worker and hands them over.
"""

from __future__ import annotations

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from foundry.graphir.regions import RegionKind
from foundry.inspect.lint import LintReport, Severity
from foundry.inspect.render import human_bytes
from foundry.inspect.summary import ArchiveSummary
from foundry.text import plain, printable

MAX_ROWS = 500  # rows of each table (kernels, regions, unresolved pointers, findings); the rest is counted


def _table(title: str, *columns: tuple[str, str]) -> Table:
    table = Table(
        title=title, title_justify="left", title_style="bold", header_style="bold", box=box.SIMPLE_HEAD, show_edge=False
    )
    for name, justify in columns:
        table.add_column(name, justify=justify, overflow="fold")
    return table


def summary_renderables(summary: ArchiveSummary) -> list[RenderableType]:
    """The summary's tables, in the order the pane shows them."""
    nodes = sum(g.nodes for g in summary.graphs)
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(summary.kinds.items())) or "-"
    parts: list[RenderableType] = [
        Text.assemble((f"{len(summary.graphs)} graphs, {nodes} nodes", "bold"), f" ({kinds})"),
    ]
    by_short: dict[str, list[int]] = {}
    for name, count in summary.kernels.items():
        by_short.setdefault(summary.kernel_names[name], []).append(count)
    ranked = sorted(by_short.items(), key=lambda kv: (-sum(kv[1]), kv[0]))
    launches = sum(summary.kernels.values())
    kernels = _table(
        f"Kernel histogram: {launches} launches of {len(summary.kernels)} kernels",
        ("launches", "right"),
        ("variants", "right"),
        ("kernel", "left"),
    )
    for short, counts in ranked[:MAX_ROWS]:
        kernels.add_row(str(sum(counts)), str(len(counts)), plain(short))
    parts.append(kernels)
    if len(ranked) > MAX_ROWS or summary.kernels_not_listed:
        more = f"... {max(0, len(ranked) - MAX_ROWS)} more kernel names"
        unlisted = f", and {summary.kernels_not_listed} launches past the names a summary lists"
        parts.append(Text(more + (unlisted if summary.kernels_not_listed else ""), style="dim"))

    collectives = summary.collectives
    if collectives:
        table = _table("Collectives by kind", ("kind", "left"), ("count", "right"))
        for kind, count in sorted(collectives.items()):
            table.add_row(plain(kind, style="cyan"), str(count))
        parts.append(table)
    else:
        parts.append(Text.assemble(("Collectives by kind", "bold"), ": none"))

    regions = _table(
        f"Regions ({len(summary.regions)})",
        ("region", "left"),
        ("kind", "left"),
        ("size", "right"),
        ("graphs", "right"),
        ("operands", "right"),
    )
    ordered = sorted(summary.regions.items(), key=lambda kv: (kv[1]["kind"] == RegionKind.TENSOR, kv[0]))
    for name, row in ordered[:MAX_ROWS]:
        regions.add_row(plain(name), row["kind"], human_bytes(row["size"]), str(row["graphs"]), str(row["operands"]))
    parts.append(regions)
    if len(ordered) > MAX_ROWS or summary.regions_not_listed:
        more = f"... {max(0, len(ordered) - MAX_ROWS)} more regions"
        unlisted = f", and {summary.regions_not_listed} uses of regions past the names a summary lists"
        parts.append(Text(more + (unlisted if summary.regions_not_listed else ""), style="dim"))

    unresolved = summary.unresolved
    if unresolved:
        count = len(unresolved) + summary.unresolved_not_listed
        table = _table(f"Unresolved pointers ({count})", *[(c, "left") for c in ("graph", "node", "where")])
        for u in unresolved[:MAX_ROWS]:
            where = f"param {u['param']}+{u['offset']}" if u["param"] >= 0 else u["site"]
            table.add_row(
                plain(f"rank {u['rank']} {u['graph']}"), str(u["node"]), Text(f"{where} = {u['value']}", "red")
            )
        parts.append(table)
    else:
        parts.append(Text.assemble(("Unresolved pointers", "bold"), ": none"))
    return parts


def lint_renderables(report: LintReport) -> list[RenderableType]:
    errors, warnings = report.count(Severity.ERROR), report.count(Severity.WARNING)
    head = Text.assemble(
        ("Lint", "bold"),
        f": {len(report.graphs)} graphs checked, ",
        (f"{errors} error(s)", "red" if errors else ""),
        ", ",
        (f"{warnings} warning(s)", "yellow" if warnings else ""),
    )
    if not report.findings:
        return [head]
    table = Table(show_header=True, header_style="bold", box=None, padding=(0, 1))
    for name in ("severity", "rule", "where", "message"):
        table.add_column(name, overflow="fold")
    for f in report.findings[:MAX_ROWS]:
        style = "red" if f.severity is Severity.ERROR else "yellow"
        where = f"rank {f.rank} {f.graph}" + (f" node {f.node}" if f.node is not None else "")
        table.add_row(Text(f.severity.value, style=style), plain(f.rule), plain(where), plain(f.message))
    parts: list[RenderableType] = [head, table]
    more = errors + warnings - min(len(report.findings), MAX_ROWS)
    if more:
        parts.append(Text(f"... {more} more findings", style="dim"))
    return parts


class SummaryPane(VerticalScroll, can_focus=True):
    """Renders the archive summary and the lint report once the worker has them."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.summary: ArchiveSummary | None = None
        self.lint: LintReport | None = None
        self.errors: dict[str, str] = {}
        self.shown: RenderableType = ""

    def compose(self):
        yield Static(Text("Computing summary and lint...", style="dim"), id="summary-body")

    def _refresh_body(self) -> None:
        parts: list[RenderableType] = []
        if self.summary is not None:
            parts += summary_renderables(self.summary)
        elif "summary" not in self.errors:
            parts.append(Text("Summary: running...", style="dim"))
        if self.lint is not None:
            parts += lint_renderables(self.lint)
        elif "lint" not in self.errors:
            parts.append(Text("Lint: running...", style="dim"))
        for what, error in self.errors.items():
            parts.append(Text.assemble((f"{what.capitalize()} unavailable: ", "bold red"), (printable(error), "red")))
        self.shown = Group(*parts)
        self.query_one("#summary-body", Static).update(self.shown)

    def show_summary(self, summary: ArchiveSummary) -> None:
        self.summary = summary
        self._refresh_body()

    def show_lint(self, report: LintReport) -> None:
        self.lint = report
        self._refresh_body()

    def show_error(self, what: str, message: str) -> None:
        """``what`` (``summary`` or ``lint``) failed with ``message``."""
        self.errors[what] = message
        self._refresh_body()

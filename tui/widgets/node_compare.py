"""Two aligned nodes side by side, field by field, the differing fields highlighted.

The diff pass says which fields differ (:class:`~foundry.graphir.passes.diff.FieldChange`);
this widget lays out every field of both nodes (from the decoded graphs) and
marks the rows those changes belong to, then lists the changes verbatim.
"""

from __future__ import annotations

from dataclasses import dataclass

from foundry.tui.describe import change_key, compare_fields
from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from foundry.graphir.graph import GraphIR
from foundry.graphir.passes.diff import NodeDiff, Status
from foundry.text import plain, printable

A_STYLE = "bold red"
B_STYLE = "bold green"
DIFF_ROW = "on #3a2a00"


@dataclass(frozen=True)
class CompareRow:
    """One field of the side-by-side view."""

    key: str
    label: str
    a: str
    b: str
    differs: bool


def compare_rows(node: NodeDiff, ir_a: GraphIR | None, ir_b: GraphIR | None) -> list[CompareRow]:
    """Every field of both nodes, aligned by field, marked where the diff says they differ."""
    changed = {change_key(c) for c in node.changes}
    fields_a = compare_fields(ir_a, ir_a.node(node.a)) if ir_a is not None and node.a is not None else []
    fields_b = compare_fields(ir_b, ir_b.node(node.b)) if ir_b is not None and node.b is not None else []
    order: list[tuple[str, str]] = []
    values_a = {}
    values_b = {}
    for key, label, value in fields_a:
        order.append((key, label))
        values_a[(key, label)] = value
    for key, label, value in fields_b:
        if (key, label) not in values_a:
            order.append((key, label))
        values_b[(key, label)] = value
    one_sided = node.status is not Status.CHANGED
    return [
        CompareRow(
            key,
            label,
            values_a.get((key, label), ""),
            values_b.get((key, label), ""),
            one_sided or key in changed,
        )
        for key, label in order
    ]


class NodeCompare(VerticalScroll, can_focus=True):
    """The side-by-side view of the node diff under the cursor; ``rows`` holds what is shown."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.rows: list[CompareRow] = []
        self.node: NodeDiff | None = None
        self.shown: RenderableType = ""

    def compose(self):
        yield Static(id="compare-body")

    def _set(self, renderable: RenderableType) -> None:
        self.shown = renderable
        self.query_one("#compare-body", Static).update(renderable)
        self.scroll_home(animate=False)

    def show_message(self, text: str, *, style: str = "dim") -> None:
        self.rows, self.node = [], None
        self._set(Text(text, style=style))

    def show(self, node: NodeDiff, ir_a: GraphIR | None, ir_b: GraphIR | None) -> None:
        self.node = node
        self.rows = compare_rows(node, ir_a, ir_b)
        a_id = "-" if node.a is None else str(node.a)
        b_id = "-" if node.b is None else str(node.b)
        table = Table(expand=True, header_style="bold", box=box.SIMPLE_HEAD, padding=(0, 1), show_edge=False)
        table.add_column("", width=1, no_wrap=True)
        table.add_column("field", no_wrap=True)
        table.add_column(f"A node {a_id}", overflow="fold", ratio=1)
        table.add_column(f"B node {b_id}", overflow="fold", ratio=1)
        # differing fields first, so they are in view without scrolling; then the rest in field order
        for row in sorted(self.rows, key=lambda r: not r.differs):
            if row.differs:
                table.add_row(
                    Text("≠", style="bold yellow"),
                    plain(row.label, style="bold yellow"),
                    plain(row.a, style=A_STYLE),
                    plain(row.b, style=B_STYLE),
                    style=DIFF_ROW,
                )
            else:  # equal fields take one line each
                table.add_row("", plain(row.label), _one_line(row.a), _one_line(row.b))
        parts: list[RenderableType] = [Text.assemble((printable(node.label), "bold"), f"  A:{a_id}  B:{b_id}")]
        if node.changes:
            changes = Table.grid(padding=(0, 1))
            changes.add_column(style="bold yellow", no_wrap=True)
            changes.add_column(overflow="fold")
            for c in node.changes:
                changes.add_row(
                    plain(c.field), Text.assemble((printable(c.a), A_STYLE), " -> ", (printable(c.b), B_STYLE))
                )
            parts.append(changes)
        elif node.status is not Status.CHANGED:
            parts.append(Text(f"only in {'A' if node.status is Status.ONLY_A else 'B'}", style="bold"))
        parts.append(table if self.rows else Text("decoding both graphs...", style="dim"))
        self._set(Group(*parts))


def _one_line(value: str) -> Text:
    return Text(printable(value), no_wrap=True, overflow="ellipsis", style="dim")

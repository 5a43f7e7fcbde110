"""Rendering reports for people (rich tables). ``--json`` output skips this module.

Every string from an archive is printed as text (the CLI's console parses no markup)
with its control characters escaped (:func:`foundry.text.printable`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from foundry.graphir.graph import GraphIR
from foundry.graphir.nodes import KernelNode, MemcpyNode, MemsetNode
from foundry.graphir.regions import RegionKind
from foundry.inspect.text_table import Cell, Column, print_table
from foundry.text import printable as p

if TYPE_CHECKING:  # the reports' types: each command imports only its own
    from foundry.graphir.passes.diff import GraphDiff
    from foundry.inspect.archive_diff import ArchiveDiff
    from foundry.inspect.lint import LintReport
    from foundry.inspect.summary import ArchiveSummary, GraphSummary


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def render_jit(console: Console, jit: dict | None) -> None:
    """The JIT caches line, and a table of them, saying whether the archive carries host code."""
    if jit is None:
        console.print("  JIT caches: none")
        return
    host = "yes: a LOAD installs it only with --trust-cached-code" if jit["host_code"] else "no"
    console.print(f"  JIT caches: {jit['state']}, {jit['files']} files, {jit['bytes'] / 2**20:.1f} MiB; "
                  f"host code: {host}")  # fmt: skip
    built_for = ", ".join(f"{name} {p(version)}" for name, version in jit.get("versions", {}).items())
    if built_for:
        console.print(f"  built for (a LOAD refuses another): {built_for}")
    table = Table(title="JIT caches", title_justify="left")
    for col in ("cache", "files", "MiB", "host code files"):
        table.add_column(col, justify="left" if col == "cache" else "right")
    for row in jit["caches"]:
        table.add_row(row["cache"], str(row["files"]), f"{row['bytes'] / 2**20:.1f}", str(row["host_files"]))
    console.print(table)


def render_summary(console: Console, s: ArchiveSummary, *, top: int = 15) -> None:
    cat = s.catalog
    env = cat["environment"]
    console.print(Text.assemble(("Archive", "bold"), f" {p(s.path)}"))
    console.print(p(f"  format {cat['format_version']}, written by Foundry {cat['tool_version']} at {cat['created']}"))
    console.print(p(
        f"  {env['gpu_name']} (compute {env['compute_capability']}), driver {env['driver_version']}, "
        f"CUDA {env['cuda_version']}, torch {env.get('torch_version') or '-'}"
    ))  # fmt: skip
    modules = cat["modules"]
    console.print(f"  world size {cat['world_size']}; module images: {modules['state']} ({modules['images']})")
    if cat["model"]:
        console.print(p("  model: " + ", ".join(f"{k}={v}" for k, v in sorted(cat["model"].items()))))
    render_jit(console, cat.get("jit"))

    _render_graph_table(console, s)

    by_short: dict[str, list[int]] = {}
    for name, count in s.kernels.items():
        by_short.setdefault(s.kernel_names[name], []).append(count)
    ranked = sorted(by_short.items(), key=lambda kv: (-sum(kv[1]), kv[0]))
    title = (f"Kernel histogram: {sum(s.kernels.values())} launches of {len(s.kernels)} kernels "
             f"(top {min(top, len(ranked))} names; --json has every mangled name)")  # fmt: skip
    rows = [(str(sum(counts)), str(len(counts)), p(name)) for name, counts in ranked[:top]]
    if s.kernels_not_listed:
        rows.append((str(s.kernels_not_listed), "", "(kernels past the names a summary lists)"))
    _print_rows(console, title, KERNEL_COLUMNS, rows)

    collectives = s.collectives
    if collectives:
        table = Table(title="Collectives by kind", title_justify="left")
        table.add_column("kind")
        table.add_column("count", justify="right")
        for kind, count in sorted(collectives.items()):
            table.add_row(p(kind), str(count))
        console.print(table)
    else:
        console.print("Collectives: none")

    ordered = sorted(s.regions.items(), key=lambda kv: (kv[1]["kind"] == RegionKind.TENSOR, kv[0]))
    rows = [(p(name), row["kind"], human_bytes(row["size"]), str(row["graphs"]), str(row["operands"]))
            for name, row in ordered[:top]]  # fmt: skip
    if len(ordered) > top:
        rows.append((f"... {len(ordered) - top} more (--json lists all)", "", "", "", ""))
    if s.regions_not_listed:
        rows.append((f"... and {s.regions_not_listed} uses of regions past the names a summary lists", "", "",
                     "", ""))  # fmt: skip
    _print_rows(console, f"Regions ({len(s.regions)})", REGION_COLUMNS, rows)

    _render_restore(console, s)
    unresolved = s.unresolved
    if not unresolved:
        console.print("Unresolved pointers: none")
        return
    count = len(unresolved) + s.unresolved_not_listed
    table = Table(title=f"Unresolved pointers ({count})", title_justify="left", style="red")
    for col in ("rank", "graph", "node", "where", "value"):
        table.add_column(col)
    for u in unresolved[:top]:
        where = f"param {u['param']}+{u['offset']}" if u["param"] >= 0 else u["site"]
        table.add_row(str(u["rank"]), p(u["graph"]), str(u["node"]), where, u["value"])
    console.print(table)


GRAPH_COLUMNS = (
    Column("rank", right=True), Column("graph"), Column("shape", right=True), Column("nodes", right=True),
    Column("kinds"), Column("edges", right=True), Column("collectives"), Column("unresolved", right=True),
    Column("fingerprint"),
)  # fmt: skip
KERNEL_COLUMNS = (Column("launches", right=True), Column("variants", right=True), Column("kernel"))
REGION_COLUMNS = (Column("region"), Column("kind"), Column("size", right=True), Column("graphs", right=True),
                  Column("operands", right=True))  # fmt: skip


def _print_rows(console: Console, title: str, columns: tuple[Column, ...], rows: list[tuple[Cell, ...]]) -> None:
    """A table drawn by padding where it fits (rich lays out every cell, some 0.1 ms each),
    else by rich, which shrinks and wraps the cells and the title."""
    if print_table(console, title, columns, rows):
        return
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column.name, justify="right" if column.right else "left")
    for row in rows:
        table.add_row(*(cell if isinstance(cell, str) else Text(cell[0], style=cell[1]) for cell in row))
    console.print(table)


def _render_graph_table(console: Console, s: ArchiveSummary) -> None:
    """One row per graph: drawn by padding where it fits (an archive may hold thousands of
    graphs), else by rich, which wraps the long cells."""
    rows = []
    for g in s.graphs:
        unresolved = str(g.unresolved_count)
        rows.append((
            str(g.rank), p(g.name), "-" if g.shape_key is None else str(g.shape_key), str(g.nodes),
            ", ".join(f"{k} {n}" for k, n in sorted(g.kinds.items())), _edge_cell(g),
            p(", ".join(f"{k} {n}" for k, n in sorted(g.collectives.items())) or "-"),
            (unresolved, "red") if g.unresolved_count else unresolved, p(g.fingerprint.split(":")[-1][:12]),
        ))  # fmt: skip
    _print_rows(console, "Graphs", GRAPH_COLUMNS, rows)


def _edge_cell(g: GraphSummary) -> str:
    """The graph's edges, and how many of them are programmatic (the kinds are in --json)."""
    total = sum(g.edges.values())
    return f"{total} ({g.edges_programmatic} programmatic)" if g.edges_programmatic else str(total)


def _render_restore(console: Console, s: ArchiveSummary) -> None:
    """What a LOAD relies on, per rank (archives saved without the hook have none of it)."""
    for facts in s.restore:
        region = facts["region"]
        if region is None:
            console.print(f"Restore, rank {facts['rank']}: no region record (saved without the hook: not loadable)")
            continue
        warm = "kept" if region["warmup_bytes"] is not None else "not kept"
        console.print(
            f"Restore, rank {facts['rank']}: region at {region['base']} up to {human_bytes(region['final_offset'])}, "
            f"{region['allocations']} allocations ({region['warmup_allocations']} before the first capture, "
            f"{region['late_allocations']} late); warm-up bytes {warm}; {facts['images']} images"
        )
        if facts["globals_written"]:
            console.print("  device globals the application set: " + p(", ".join(facts["globals_written"])))
        if facts["globals_per_process"]:
            console.print("  device globals holding host addresses of the process (LOAD needs the application's "
                          "own loaded copy): " + p(", ".join(facts["globals_per_process"])))  # fmt: skip
        if facts["globals_unknown"]:
            console.print("  images whose globals are unknown: " + p(", ".join(facts["globals_unknown"])))
    rng = [g.name for g in s.graphs if g.rng]
    undefined = sum(g.undefined_bytes for g in s.graphs)
    if rng or undefined:
        console.print(f"  graphs drawing random numbers: {p(', '.join(rng)) or 'none'}; "
                      f"undefined parameter bytes (ignored by fingerprints): {undefined}")  # fmt: skip
    planned = sum(g.plan for g in s.graphs)
    if s.restore:
        console.print(f"  launch plans (LOAD --builder native without decoding the IR): {planned} of "
                      f"{len(s.graphs)} graphs")  # fmt: skip


def render_lint(console: Console, report: LintReport, *, strict: bool = False, quiet: bool = False) -> None:
    """Findings, expectations and the verdict; ``quiet`` leaves out what does not fail the run.
    Printed as one text: rich's work per print, not per line (a large archive has hundreds)."""
    from foundry.inspect.lint import Severity

    failing = {Severity.ERROR, Severity.WARNING} if strict else {Severity.ERROR}
    lines: list[Text] = []
    for f in report.findings:
        if quiet and f.severity not in failing:
            continue
        style = "red" if f.severity is Severity.ERROR else "yellow"
        where = f"rank {f.rank} {f.graph}" + (f" node {f.node}" if f.node is not None else "")
        lines.append(Text.assemble((f"{f.severity.value:7}", style), p(f" {f.rule}: {where}: {f.message}")))
    for e in report.expectations:
        if quiet and e.ok:
            continue
        scope = p(f"rank {e.rank} {e.graph}") if e.graph is not None else "total"
        mark = ("ok  ", "green") if e.ok else ("FAIL", "red")
        lines.append(Text.assemble((mark[0], mark[1]), f" {e.kind}={e.expected} in {scope}: found {e.found}"))
    unlisted = sum(report.not_listed.values())
    if unlisted:
        lines.append(Text(f"... and {unlisted} more finding(s) (a report lists {len(report.findings)})"))
    errors, warnings = report.count(Severity.ERROR), report.count(Severity.WARNING)
    failed = sum(not e.ok for e in report.expectations)
    verdict = ("FAILED", "red") if report.failed(strict=strict) else ("clean", "green")
    why = " (--strict: the warnings fail the run)" if strict and warnings else ""
    lines.append(
        Text.assemble(
            f"{len(report.graphs)} graph(s) checked: {errors} error(s), {warnings} warning(s), "
            f"{failed} failed expectation(s) — ",
            verdict,
            why,
        )
    )
    console.print(Text("\n").join(lines), soft_wrap=True)


def render_mark_differences(console: Console, g: GraphDiff, limit: int = 5) -> None:
    """Which kernels' undefined bytes the two SAVEs marked differently."""
    if not g.marks_differ:  # the same bytes, recorded as other runs: nothing to name
        return
    marked = len(g.marks_differ) + g.marks_not_listed
    console.print(f"    rank {g.rank} {p(g.name)}: {marked} node(s) marked differently",
                  markup=False, soft_wrap=True)  # fmt: skip
    for m in g.marks_differ[:limit]:
        console.print(f"      node {m.node} {p(m.label)}: {m.only_a} byte(s) undefined in A only, {m.only_b} in B only",
                      markup=False, soft_wrap=True)  # fmt: skip
    if len(g.marks_differ) > limit:
        console.print(f"      ... and {len(g.marks_differ) - limit} more (--json lists them)")
    if g.marks_not_listed:
        console.print(f"      ... and {g.marks_not_listed} past what a diff lists")


def render_diff(console: Console, d: ArchiveDiff) -> None:
    from foundry.graphir.passes.diff import Status

    console.print(Text.assemble(("A", "bold"), f" {p(d.a)}\n", ("B", "bold"), f" {p(d.b)}"))
    if d.environment:
        table = Table(title="Environment and catalog", title_justify="left")
        for col in ("field", "A", "B"):
            table.add_column(col)
        for c in d.environment:
            table.add_row(p(c.field), p(c.a), p(c.b))
        console.print(table)
    if d.entries:
        table = Table(title="Graph entries (how a LOAD runs them)", title_justify="left")
        for col in ("rank", "graph", "field", "A", "B"):
            table.add_column(col)
        for rank, name, c in d.entries:
            table.add_row(str(rank), p(name), p(c.field), p(c.a), p(c.b))
        console.print(table)
    counts = {s: sum(g.status is s for g in d.graphs) for s in Status}
    console.print("Graphs: " + ", ".join(f"{n} {s.value.replace('_', ' ')}" for s, n in counts.items()))
    marks = sum(g.undefined_only for g in d.graphs)
    if marks:
        console.print(f"  ({marks} of the same differ in fingerprint only through bytes one SAVE marked undefined)")
        for g in d.graphs:
            if g.undefined_only:
                render_mark_differences(console, g)
    for g in d.graphs:
        if g.status is Status.SAME:
            continue
        console.print(
            Text.assemble("\n", (f"rank {g.rank} {p(g.name)}", "bold"), f": {g.status.value.replace('_', ' ')}")
        )
        if g.status is not Status.CHANGED:
            continue
        console.print(f"  fingerprint A {p(g.fingerprint_a)}\n  fingerprint B {p(g.fingerprint_b)}")
        if not (g.node_count or g.edge_count):
            console.print(
                "  no field differs, yet the graphs do not fingerprint alike (a recorded fingerprint "
                "that does not match its graph? `foundry archive verify` checks)"
            )
        for n in g.nodes:
            ids = f"A:{'-' if n.a is None else n.a} B:{'-' if n.b is None else n.b}"
            if n.status is Status.CHANGED:
                console.print(f"  ~ {ids} {p(n.label)}")
                for c in n.changes:
                    console.print(Text.assemble(f"      {p(c.field)}: ", (p(c.a), "red"), " -> ", (p(c.b), "green")))
                if n.changes_not_listed:
                    console.print(f"      ... and {n.changes_not_listed} more changes (past what a diff lists)")
            else:
                sign, style = ("-", "red") if n.status is Status.ONLY_A else ("+", "green")
                console.print(Text(f"  {sign} {ids} {p(n.label)} (only in {'A' if sign == '-' else 'B'})", style=style))
        for c in g.edges_changed:
            ends = f"A {c.a[0]} -> {c.a[1]}, B {c.b[0]} -> {c.b[1]}"
            console.print(Text.assemble(f"  ~ edge {ends}: ", (c.kind_a, "red"), " -> ", (c.kind_b, "green")))
        for src, dst in g.edges_only_a:
            console.print(Text(f"  - edge A {src} -> {dst}", style="red"))
        for src, dst in g.edges_only_b:
            console.print(Text(f"  + edge B {src} -> {dst}", style="green"))
        if g.nodes_not_listed or g.edges_not_listed:
            console.print(f"  ... and {g.nodes_not_listed} more differing nodes, {g.edges_not_listed} more differing "
                          "edges (past what a diff lists)")  # fmt: skip
    rebuilt = d.rebuilt_kernels  # derived from every node change: read once
    if rebuilt:
        console.print(f"\n{len(rebuilt)} kernel(s) differ only in nvcc's per-compilation anonymous-namespace "
                      f"id: the same source built twice, as a JIT compiler does on each machine (SGLang's own "
                      f"kernels do). SAVE both archives with one build to compare them: "
                      f"{p(', '.join(rebuilt))}", markup=False)  # fmt: skip
    console.print("\n" + ("identical" if d.identical else "archives differ"))


def node_rows(ir: GraphIR) -> list[dict[str, object]]:
    """One row per node, as ``graph show`` prints it (and ``--json`` emits it)."""
    rows = []
    for node in ir.nodes():
        row: dict[str, object] = {"id": node.id, "kind": str(node.kind)}
        if isinstance(node, KernelNode):
            row.update(
                kernel=node.kernel.short_name,
                name=node.kernel.name,
                grid=list(node.launch.grid),
                block=list(node.launch.block),
                shared_mem=node.launch.shared_mem,
                params=node.layout.size,
                arg_mode=node.arg_mode,
            )
        elif isinstance(node, MemcpyNode):
            row.update(kernel=f"{node.src_type}->{node.dst_type} {node.extent[0]} B")
        elif isinstance(node, MemsetNode):
            row.update(kernel=f"value {node.value:#x} x{node.width} ({node.element_size} B)")
        row["operands"] = [
            o.location() if o.param >= 0 else f"{o.site.value.rsplit('.', 1)[-1]}={o.location()}"
            for o in ir.operands.of(node.id)
        ]
        rows.append(row)
    return rows


NODE_COLUMNS = ("id", "kind", "kernel / detail", "grid", "block", "smem", "param B", "operands")
_WRAPPING = ("kernel / detail", "operands")
_WRAP_MIN = 20  # narrowest a wrapping column may get before the table gives way to one block per node


def _node_cells(ir: GraphIR) -> list[tuple[str, ...]]:
    cells = []
    for row in node_rows(ir):
        grid = ",".join(map(str, row.get("grid", []))) or "-"
        block = ",".join(map(str, row.get("block", []))) or "-"
        cells.append((str(row["id"]), str(row["kind"]), p(row.get("kernel", "")) or "-", grid, block,
                      str(row.get("shared_mem", "-")), str(row.get("params", "-")),
                      p(", ".join(row["operands"])) or "-"))  # fmt: skip
    return cells


def render_nodes(console: Console, ir: GraphIR, *, full: bool = False) -> None:
    """The node table, every cell whole. ``full`` keeps each row on one line (for a pipe or a
    file, where no width applies); otherwise long cells wrap to the console's width, and a
    console too narrow for the table gets one block of lines per node instead."""
    cells = _node_cells(ir)
    title = f"{p(ir.name)}: {len(ir)} nodes, {ir.edge_count()} edges"
    columns = zip(NODE_COLUMNS, zip(*cells, strict=True), strict=True)
    fixed = sum(max([len(c) for c in column] + [len(name)]) + 3 for name, column in columns if name not in _WRAPPING)
    if not full and cells and console.width < fixed + len(_WRAPPING) * (_WRAP_MIN + 3) + 1:
        console.print(title)
        for c in cells:
            console.print(Text(f"{c[0]:>5} {c[1]} {c[2]}"))
            console.print(Padding(Text(f"grid {c[3]} block {c[4]} smem {c[5]} param B {c[6]}\noperands {c[7]}"),
                                  (0, 0, 0, 6)))  # fmt: skip
        return
    table = Table(title=title, title_justify="left")
    for col in NODE_COLUMNS:
        table.add_column(
            col,
            justify="right" if col in ("id", "smem", "param B") else "left",
            no_wrap=full or col not in _WRAPPING,
            overflow="fold",
            min_width=_WRAP_MIN if col in _WRAPPING and not full else len(col),
            ratio=None if full or col not in _WRAPPING else (2 if col == "operands" else 1),
        )
    for c in cells:
        table.add_row(*c)
    console.print(table)

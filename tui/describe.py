"""Rich renderables for nodes: the node pane's full description, and the
field-by-field view the diff screen lays side by side.

Pointer words are shown by target (``region+0x..``), scalar bytes as hex, so
what two archives disagree on is visible without raw addresses getting in the
way (the same semantic view the fingerprint and the diff pass use). Names from
the archive are text, never markup, with control characters escaped.
"""

from __future__ import annotations

from collections.abc import Iterable

from foundry.tui.model import counted
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from foundry.backends.base import KernelMatch
from foundry.graphir.graph import GraphIR
from foundry.graphir.kernel import LaunchAttribute
from foundry.graphir.nodes import EmptyNode, KernelNode, MemcpyNode, MemsetNode, Node, UnsupportedNode
from foundry.graphir.operands import WORD, Operand, OperandSite
from foundry.graphir.passes.diff import FieldChange
from foundry.inspect.lint import Finding, Severity
from foundry.inspect.render import human_bytes
from foundry.text import plain, printable

KEY_STYLE = "bold"
SECTION_STYLE = "bold underline"
UNRESOLVED_STYLE = "bold red"
OPERAND_STYLE = "cyan"
DEPENDENCIES_LISTED = 8  # neighbours listed on each side; a fan-in of hundreds is counted


def hex_bytes(data: bytes, group: int = 4) -> str:
    """Bytes as hex, a space every ``group`` bytes (``04000000 00000000``)."""
    text = data.hex()
    step = group * 2
    return " ".join(text[i : i + step] for i in range(0, len(text), step))


def location(operand: Operand) -> Text:
    """Where an operand points, red when it points nowhere known."""
    if operand.resolved:
        return plain(operand.location(), style=OPERAND_STYLE)
    return plain(operand.location(), style=UNRESOLVED_STYLE)


def _attr_value(attr: LaunchAttribute) -> str:
    value = attr.value
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={v:#x}" if k == "base_ptr" else f"{k}={v}" for k, v in value.items()) + "}"
    return str(value)


def slot_operands(node: KernelNode, operands: Iterable[Operand], index: int) -> list[Operand]:
    """The pointer words inside parameter ``index``."""
    return [o for o in operands if o.site is OperandSite.PARAM and o.param == index]


def scalar_value(data: bytes) -> str:
    """A small scalar read little-endian (``= 4``), or ``""`` for other sizes."""
    if len(data) in (1, 2, 4, 8):
        return f"= {int.from_bytes(data, 'little')}"
    return ""


def _undefined_in(node: KernelNode, start: int, end: int) -> list[tuple[int, int]]:
    """The undefined byte runs of ``node`` clipped to ``[start, end)``, as ``(first, end)``."""
    runs = []
    for offset, length in node.undefined:
        a, b = max(offset, start), min(offset + length, end)
        if a < b:
            runs.append((a, b))
    return runs


def semantic_param(node: KernelNode, index: int, operands: Iterable[Operand]) -> str:
    """A parameter as compared across archives: scalar bytes in hex, pointer words as ``[region+0x..]``."""
    slot = node.layout.slots[index]
    words = {o.offset: o for o in slot_operands(node, operands, index)}
    parts: list[str] = []
    scalar = bytearray()
    at = slot.offset
    while at < slot.end:
        operand = words.get(at)
        if operand is not None and at + WORD <= slot.end:
            if scalar:
                parts.append(hex_bytes(bytes(scalar)))
                scalar.clear()
            parts.append(f"[{operand.location()}]")
            at += WORD
        else:
            scalar.append(node.params[at])
            at += 1
    if scalar:
        parts.append(hex_bytes(bytes(scalar)))
    return " ".join(parts)


# -- the node pane -------------------------------------------------------------------


def _grid(rows: Iterable[tuple[str, RenderableType]]) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style=KEY_STYLE, no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(key, value if isinstance(value, Text) else plain(value))
    return table


def _section(title: str) -> Text:
    return Text("\n" + title, style=SECTION_STYLE)


def describe_node(
    ir: GraphIR,
    node: Node,
    *,
    rank: int,
    claim: KernelMatch | None = None,
    findings: Iterable[Finding] = (),
) -> Group:
    """Everything the archive records about one node, for the node pane."""
    operands = ir.operands.of(node.id)
    parts: list[RenderableType] = [
        Text.assemble(
            (f"node {node.id}", "bold"), " · ", (str(node.kind), "bold magenta"), f" · rank {rank} {printable(ir.name)}"
        )
    ]
    if isinstance(node, KernelNode):
        parts.extend(_kernel_parts(node, operands, claim))
    elif isinstance(node, MemcpyNode):
        parts.extend(_memcpy_parts(node, operands))
    elif isinstance(node, MemsetNode):
        parts.extend(_memset_parts(node, operands))
    elif isinstance(node, UnsupportedNode):
        detail = node.detail or "-"
        parts += [
            _section("Unsupported node"),
            _grid([("type", str(node.node_type)), ("detail", detail)]),
            Text("LOAD cannot rebuild a node of this kind; lint reports it.", style="red"),
        ]
    elif isinstance(node, EmptyNode):
        parts.append(Text("An empty node: it only orders its neighbours."))
    else:
        parts += [_section("Event"), _grid([("event", str(getattr(node, "event", "-")))])]
    parts.extend(_dependency_parts(ir, node.id))
    shown_inline = (OperandSite.PARAM, OperandSite.MEMCPY_SRC, OperandSite.MEMCPY_DST, OperandSite.MEMSET_DST)
    other = [o for o in operands if o.site not in shown_inline]
    if other:
        parts.append(_section("Operands"))
        parts.append(_grid((o.site.value, Text.assemble(location(o), f"  (0x{o.value:x})")) for o in other))
    findings = list(findings)
    if findings:
        parts.append(_section(f"Lint findings ({len(findings)})"))
        for f in findings:
            style = "red" if f.severity is Severity.ERROR else "yellow"
            parts.append(Text.assemble((f"{f.severity.value:8}", style), printable(f"{f.rule}: {f.message}")))
    return Group(*parts)


def _dependency_parts(ir: GraphIR, node_id: int) -> list:
    """The nodes this one waits for and those waiting for it, each edge with its kind (a
    programmatic edge lets the consumer start before its producer ends)."""
    into, out = ir.dependencies(node_id)
    sides = [("after", [(e.src, e.data) for e in into]), ("before", [(e.dst, e.data) for e in out])]
    rows = []
    for label, edges in sides:
        listed = ", ".join(
            f"{other}" if data.kind == "plain" else f"{other} ({data.kind})"
            for other, data in edges[:DEPENDENCIES_LISTED]
        )
        more = f", and {len(edges) - DEPENDENCIES_LISTED} more" if len(edges) > DEPENDENCIES_LISTED else ""
        rows.append((label, f"{listed}{more}" if edges else "none"))
    return [_section("Dependencies"), _grid(rows)]


def _kernel_parts(node: KernelNode, operands: tuple[Operand, ...], claim: KernelMatch | None) -> list:
    kernel, launch = node.kernel, node.launch
    identity = [
        ("name", plain(kernel.short_name, style="bold green")),
        ("mangled", kernel.name),
        ("demangled", kernel.demangled),
        ("image", kernel.image or Text("not recorded (inspect and diff only)", style="dim")),
    ]
    if claim is not None:
        extra = "".join(
            [f", needs {claim.requires}" if claim.requires else "", ", relocatable" if claim.relocatable else ""]
        )
        identity.append(("backend", plain(f"{claim.backend}: {claim.kind}{extra}", style="bold cyan")))
    attributes = ", ".join(f"{a.name}={_attr_value(a)}" for a in launch.attributes) or "defaults"
    funcs = ", ".join(f"{a.name}={a.value}" for a in node.func_attrs) or "none"
    launch_rows = [
        ("grid", str(launch.grid)),
        ("block", str(launch.block)),
        ("shared mem", f"{launch.shared_mem} B dynamic"),
        ("attributes", attributes),
        ("func attrs", funcs),
        ("arg mode", node.arg_mode),
    ]
    roles = {role.index: role for role in claim.abi} if claim is not None else {}
    params = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold")
    params.add_column("#", justify="right")
    params.add_column("offset", justify="right")
    params.add_column("size", justify="right")
    params.add_column("bytes", overflow="fold", max_width=35)  # 16 bytes a line
    params.add_column("operand / value", overflow="fold")
    if roles:
        params.add_column("role")
    for index, slot in enumerate(node.layout.slots):
        data = node.params[slot.offset : slot.end]
        inside = slot_operands(node, operands, index)
        if inside:
            value = Text()
            for o in inside:
                if value:
                    value.append("\n")
                if len(inside) > 1 or o.offset != slot.offset:
                    value.append(f"+{o.offset - slot.offset}: ")
                value.append_text(location(o))
        else:
            value = Text(scalar_value(data), style="dim")
        runs = _undefined_in(node, slot.offset, slot.end)
        if runs:
            if value:
                value.append("\n")
            value.append("undefined " + ", ".join(f"+{a - slot.offset}..{b - slot.offset - 1}" for a, b in runs),
                         style="yellow")  # fmt: skip
        cells = [str(index), str(slot.offset), str(slot.size), hex_bytes(data), value]
        if roles:
            role = roles.get(index)
            cells.append(plain(role.role) if role else "")
        params.add_row(*cells)
    pointers = sum(1 for o in operands if o.site is OperandSite.PARAM)
    undefined = sum(length for _, length in node.undefined)
    title = f"Parameters ({len(node.layout.slots)}, {node.layout.size} bytes, {counted(pointers, 'pointer word')}"
    title += f", {undefined} undefined bytes ignored by fingerprints)" if undefined else ")"
    return [
        _section("Kernel"),
        _grid(identity),
        _section("Launch"),
        _grid(launch_rows),
        _section(title),
        params if node.layout.slots else Text("no parameters", style="dim"),
    ]


def _address(value: int, operands: tuple[Operand, ...], site: OperandSite) -> Text:
    text = Text(f"0x{value:x}")
    for o in operands:
        if o.site is site:
            text.append("  -> ")
            text.append_text(location(o))
    return text


def _memcpy_parts(node: MemcpyNode, operands: tuple[Operand, ...]) -> list:
    width, height, depth = node.extent
    return [
        _section("Copy"),
        _grid(
            [
                ("direction", f"{node.src_type} -> {node.dst_type}"),
                ("src", _address(node.src, operands, OperandSite.MEMCPY_SRC)),
                ("dst", _address(node.dst, operands, OperandSite.MEMCPY_DST)),
                ("extent", f"{width} B x {height} x {depth} ({human_bytes(width * height * depth)})"),
                ("src pos", str(node.src_pos)),
                ("dst pos", str(node.dst_pos)),
                ("src pitch", f"{node.src_pitch} (height {node.src_height})"),
                ("dst pitch", f"{node.dst_pitch} (height {node.dst_height})"),
            ]
        ),
    ]


def _memset_parts(node: MemsetNode, operands: tuple[Operand, ...]) -> list:
    return [
        _section("Memset"),
        _grid(
            [
                ("dst", _address(node.dst, operands, OperandSite.MEMSET_DST)),
                ("value", f"{node.value:#x}"),
                ("element", f"{node.element_size} B"),
                ("width x height", f"{node.width} x {node.height} (pitch {node.pitch})"),
            ]
        ),
    ]


# -- side by side (diff) ----------------------------------------------------------------


def compare_fields(ir: GraphIR, node: Node) -> list[tuple[str, str, str]]:
    """``(key, label, value)`` rows of one node for the side-by-side view. ``key``
    is what :func:`change_key` maps a diff's field names to."""
    operands = ir.operands.of(node.id)
    rows = [("kind", "kind", str(node.kind))]
    if isinstance(node, KernelNode):
        launch = node.launch
        rows += [
            ("kernel", "kernel", node.kernel.short_name),
            ("kernel", "mangled", node.kernel.name),
            ("image", "image", node.kernel.image or "-"),
            ("grid", "grid", str(launch.grid)),
            ("block", "block", str(launch.block)),
            ("shared_mem", "shared mem", str(launch.shared_mem)),
            ("attributes", "attributes", ", ".join(f"{a.name}={_attr_value(a)}" for a in launch.attributes) or "-"),
            ("func_attrs", "func attrs", ", ".join(f"{a.name}={a.value}" for a in node.func_attrs) or "-"),
            ("arg_mode", "arg mode", node.arg_mode),
            ("layout", "layout", " ".join(f"{s.offset}:{s.size}" for s in node.layout.slots) or "-"),
        ]
        for index in range(len(node.layout.slots)):
            rows.append((f"param[{index}]", f"param[{index}]", semantic_param(node, index, operands)))
        return rows
    by_site = {o.site: o for o in operands}
    for name, value in _struct_items(node):
        site = _SITES.get((type(node), name))
        operand = by_site.get(site) if site else None
        shown = (
            operand.location() if operand is not None else (f"0x{value:x}" if name in ("src", "dst") else str(value))
        )
        rows.append((name, name.replace("_", " "), shown))
    return rows


_SITES = {
    (MemcpyNode, "src"): OperandSite.MEMCPY_SRC,
    (MemcpyNode, "dst"): OperandSite.MEMCPY_DST,
    (MemsetNode, "dst"): OperandSite.MEMSET_DST,
}


def _struct_items(node: Node) -> list[tuple[str, object]]:
    return [(name, getattr(node, name)) for name in node.__struct_fields__ if name != "id"]


_SUBJECT_ROWS = {
    "memcpy.src": "src",
    "memcpy.dst": "dst",
    "memset.dst": "dst",
    "attr.access_policy_window": "attributes",
    "params": "layout",
}


def change_key(change: FieldChange) -> str:
    """The side-by-side row a diff :class:`~foundry.graphir.passes.diff.FieldChange` belongs to
    (``param[3] bytes 12..15`` and ``operand param[3]+8`` both belong to ``param[3]``)."""
    return _SUBJECT_ROWS.get(change.subject, change.subject)

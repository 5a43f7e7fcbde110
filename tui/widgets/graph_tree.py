"""The archive's ranks and their graphs, as a tree. A rank's session is read
when the rank is first expanded, so a large world opens at once; a rank of many
graphs lists them in groups, each filled when first expanded
(:func:`foundry.tui.model.graph_groups`), so 2,000 graphs open at once too."""

from __future__ import annotations

from dataclasses import dataclass

from foundry.tui.model import counted, graph_groups
from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

from foundry.archive.reader import Archive
from foundry.archive.schema import GraphEntry
from foundry.errors import FoundryError
from foundry.text import printable


@dataclass(frozen=True)
class RankItem:
    rank: int


@dataclass(frozen=True)
class GroupItem:
    rank: int
    entries: tuple[GraphEntry, ...]


@dataclass(frozen=True)
class GraphItem:
    rank: int
    entry: GraphEntry

    @property
    def key(self) -> tuple[int, str]:
        return (self.rank, self.entry.name)


def graph_label(entry: GraphEntry) -> Text:
    return Text.assemble(printable(entry.name), (f" {entry.nodes}", "dim"))


class GraphTree(Tree[RankItem | GroupItem | GraphItem]):
    """Ranks -> graphs. Posts :class:`GraphTree.GraphChosen` when the cursor
    reaches a graph, with ``opened`` set when it is selected (enter, click).
    Home and End go to the first and the last line."""

    BINDINGS = [
        Binding("home", "first_line", "First line", show=False),
        Binding("end", "last_line", "Last line", show=False),
    ]

    class GraphChosen(Message):
        """The cursor is on a graph (``opened``: the user selected it)."""

        def __init__(self, rank: int, entry: GraphEntry, *, opened: bool) -> None:
            super().__init__()
            self.rank = rank
            self.entry = entry
            self.opened = opened

    def __init__(self, archive: Archive, **kwargs) -> None:
        super().__init__("archive", **kwargs)
        self.archive = archive
        self.show_root = False
        self.guide_depth = 2
        self._filled: set[int] = set()
        self._rank_nodes: dict[int, TreeNode[RankItem | GroupItem | GraphItem]] = {}
        self._graph_nodes: dict[tuple[int, str], TreeNode[RankItem | GroupItem | GraphItem]] = {}
        self._group_of: dict[tuple[int, str], TreeNode[RankItem | GroupItem | GraphItem]] = {}  # graph -> its group

    def on_mount(self) -> None:
        for rank in self.archive.ranks:
            label = Text.assemble(("rank ", "bold"), (str(rank), "bold"))
            self._rank_nodes[rank] = self.root.add(label, data=RankItem(rank))
        if self._rank_nodes:
            first = self._rank_nodes[min(self._rank_nodes)]
            self._fill(first)
            first.expand()
            target = first.children[0] if first.children else first
            if isinstance(target.data, GroupItem):  # a rank of many graphs: its first group open
                self._fill(target)
                target.expand()
                target = target.children[0] if target.children else target
            self.call_after_refresh(self.move_cursor, target)  # lines exist after the first refresh

    def _fill(self, node: TreeNode[RankItem | GroupItem | GraphItem]) -> None:
        item = node.data
        if isinstance(item, GroupItem):
            if not node.children:
                self._add_graphs(node, item.rank, item.entries)
            return
        if not isinstance(item, RankItem) or item.rank in self._filled:
            return
        self._filled.add(item.rank)
        try:
            entries = self.archive.entries(item.rank)
        except FoundryError as err:  # a damaged session: say so in the tree, keep the rest usable
            node.add_leaf(Text(f"unreadable: {err}", style="red"))
            return
        count = counted(len(entries), "graph")
        node.set_label(Text.assemble(("rank ", "bold"), (str(item.rank), "bold"), (f" {count}", "dim")))
        groups = graph_groups([entry.name for entry in entries])
        if groups is None:
            self._add_graphs(node, item.rank, entries)
            return
        for label, members in groups:
            grouped = tuple(entries[i] for i in members)
            if len(grouped) == 1:  # a group of one is its graph
                self._add_graphs(node, item.rank, grouped)
                continue
            group = node.add(Text.assemble(printable(label), (f" {counted(len(grouped), 'graph')}", "dim")),
                             data=GroupItem(item.rank, grouped))  # fmt: skip
            for entry in grouped:
                self._group_of[(item.rank, entry.name)] = group

    def _add_graphs(self, node: TreeNode[RankItem | GroupItem | GraphItem], rank: int,
                    entries: tuple[GraphEntry, ...]) -> None:  # fmt: skip
        for entry in entries:
            self._graph_nodes[(rank, entry.name)] = node.add_leaf(graph_label(entry), data=GraphItem(rank, entry))

    def action_first_line(self) -> None:
        self.cursor_line = 0
        self.scroll_to_line(0)

    def action_last_line(self) -> None:
        self.cursor_line = self.last_line
        self.scroll_to_line(self.last_line)

    def on_tree_node_expanded(self, event: Tree.NodeExpanded) -> None:
        self._fill(event.node)

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted) -> None:
        event.stop()
        item = event.node.data
        if isinstance(item, GraphItem):
            self.post_message(self.GraphChosen(item.rank, item.entry, opened=False))

    def on_tree_node_selected(self, event: Tree.NodeSelected) -> None:
        event.stop()
        item = event.node.data
        if isinstance(item, GraphItem):
            self.post_message(self.GraphChosen(item.rank, item.entry, opened=True))

    @property
    def has_graphs(self) -> bool:
        """Whether the ranks read so far list any graph."""
        return bool(self._graph_nodes or self._group_of)

    @property
    def current(self) -> GraphItem | None:
        node = self.cursor_node
        return node.data if node is not None and isinstance(node.data, GraphItem) else None

    def show_graph(self, rank: int, name: str) -> bool:
        """Move the cursor to a graph (expanding its rank); ``False`` if there is none."""
        rank_node = self._rank_nodes.get(rank)
        if rank_node is None:
            return False
        self._fill(rank_node)
        rank_node.expand()
        group = self._group_of.get((rank, name))
        if group is not None:
            self._fill(group)
            group.expand()
        leaf = self._graph_nodes.get((rank, name))
        if leaf is None:
            return False
        self.call_after_refresh(self.move_cursor, leaf)  # after the expanded rank's lines are laid out
        return True

    def order(self) -> list[tuple[int, str]]:
        """Every graph of the archive in tree order, groups as listed (reads sessions not yet read)."""
        out = []
        for rank in self.archive.ranks:
            try:
                names = [e.name for e in self.archive.entries(rank)]
            except FoundryError:
                continue
            groups = graph_groups(names)
            listed = range(len(names)) if groups is None else (i for _, members in groups for i in members)
            out += [(rank, names[i]) for i in listed]
        return out

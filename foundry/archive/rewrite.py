"""Rewrite an archive's graphs in place, keeping its integrity chain.

Each graph file is replaced atomically, then each session with the new sizes,
sha256s and fingerprints, then the catalog last: an interrupted rewrite leaves
an archive whose hashes name the files that changed, which every reader refuses.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec

from foundry.archive.files import DirectoryWriter, atomic_write, encode_record, sha256_hex
from foundry.archive.reader import Archive
from foundry.archive.schema import CATALOG_FILE, GraphEntry, RankEntry, session_version
from foundry.graphir.codec import encode_graph
from foundry.graphir.fingerprint import fingerprint, topology_key
from foundry.graphir.graph import GraphIR


def rewrite_graphs(archive: Archive, transform: Callable[[int, GraphIR], GraphIR], *, keep_plans: bool = False) -> None:
    """Replace every graph ``ir`` of every rank with ``transform(rank, ir)`` (see
    :func:`rewrite_rank_graphs`)."""
    rewrite_rank_graphs(archive, lambda rank, irs: [transform(rank, ir) for ir in irs], keep_plans=keep_plans)


def rewrite_rank_graphs(archive: Archive, transform: Callable[[int, list[GraphIR]], list[GraphIR]], *,
                        keep_plans: bool = False) -> None:  # fmt: skip
    """Replace each rank's graphs, in session order, with ``transform(rank, graphs)``:
    the same graphs, in the same order. Every graph is transformed and encoded before
    the first file is written, so a transform that fails leaves the archive as it was.
    Launch plans are dropped (LOAD then builds from the IR) unless ``keep_plans``:
    only for transforms that change no parameter, launch or edge, such as marking
    undefined bytes."""
    staged: list[tuple[int, list[tuple[GraphEntry, bytes, GraphIR]]]] = []
    for rank_entry in archive.catalog.ranks:
        entries = archive.session(rank_entry.rank).graphs
        irs = transform(rank_entry.rank, [archive.graph(rank_entry.rank, entry) for entry in entries])
        if [ir.name for ir in irs] != [entry.name for entry in entries]:
            raise ValueError("a graph rewrite must return the rank's graphs in their order")
        graphs = []
        for entry, ir in zip(entries, irs, strict=True):
            ir.check()
            graphs.append((entry, encode_graph(ir), ir))
        staged.append((rank_entry.rank, graphs))
    ranks = []
    for (rank, graphs), rank_entry in zip(staged, archive.catalog.ranks, strict=True):
        entries = []
        directories: dict[Path, DirectoryWriter] = {}  # one sweep and one sync each (files.DirectoryWriter)
        for entry, data, ir in graphs:
            path = archive.graph_path(rank, entry)
            directories.setdefault(path.parent, DirectoryWriter(path.parent)).write(path.name, data)
            sha256 = sha256_hex(data)
            plan = entry.plan if keep_plans else None
            if plan is not None and plan.graph_sha256 is not None:  # bound to the graph it still encodes
                plan = msgspec.structs.replace(plan, graph_sha256=sha256)
            entries.append(msgspec.structs.replace(entry, sha256=sha256, size=len(data), fingerprint=fingerprint(ir),
                                                   nodes=len(ir), topology=topology_key(ir), plan=plan))  # fmt: skip
        for directory in directories.values():
            directory.sync()
        session = archive.session(rank)
        version = max(session.format_version, session_version(session.images, entries))
        data = encode_record(msgspec.structs.replace(session, graphs=tuple(entries), format_version=version))
        atomic_write(archive.session_path(rank), data)
        ranks.append(RankEntry(rank, rank_entry.session, sha256_hex(data)))
    catalog = msgspec.structs.replace(archive.catalog, ranks=tuple(ranks))
    atomic_write(archive.root / CATALOG_FILE, encode_record(catalog))

"""Rewrite an archive's graphs in place, keeping its integrity chain.

Each graph file is replaced atomically, then each session with the new sizes,
sha256s and fingerprints, then the catalog last: an interrupted rewrite leaves
an archive whose hashes name the files that changed, which every reader refuses.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from foundry.archive.files import atomic_write, sha256_hex
from foundry.archive.reader import Archive
from foundry.archive.schema import CATALOG_FILE, RankEntry
from foundry.archive.writer import encode_record
from foundry.graphir.codec import encode_graph
from foundry.graphir.fingerprint import fingerprint, topology_key
from foundry.graphir.graph import GraphIR


def rewrite_graphs(archive: Archive, transform: Callable[[int, GraphIR], GraphIR]) -> None:
    """Replace every graph ``ir`` of every rank with ``transform(rank, ir)``."""
    ranks = []
    for rank_entry in archive.catalog.ranks:
        rank = rank_entry.rank
        session = archive.session(rank)
        entries = []
        for entry in session.graphs:
            ir = transform(rank, archive.graph(rank, entry))
            ir.check()
            data = encode_graph(ir)
            atomic_write(archive.graph_path(rank, entry), data)
            entries.append(msgspec.structs.replace(entry, sha256=sha256_hex(data), size=len(data),
                                                   fingerprint=fingerprint(ir), nodes=len(ir),
                                                   topology=topology_key(ir)))  # fmt: skip
        data = encode_record(msgspec.structs.replace(session, graphs=tuple(entries)))
        atomic_write(archive.session_path(rank), data)
        ranks.append(RankEntry(rank, rank_entry.session, sha256_hex(data)))
    catalog = msgspec.structs.replace(archive.catalog, ranks=tuple(ranks))
    atomic_write(archive.root / CATALOG_FILE, encode_record(catalog))

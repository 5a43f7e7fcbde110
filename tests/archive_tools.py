"""Helpers for tests that tamper with archives.

Tampering tests must hit the check they are about, not an earlier integrity
check: after editing a file they *re-seal* the archive (recompute graph
sizes, sha256s and fingerprints into the sessions, and session sha256s into
the catalog), as a SAVE of the edited content would have written it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from foundry.archive import Archive, ArchiveWriter
from foundry.archive.files import sha256_hex
from foundry.archive.schema import CATALOG_FILE
from foundry.graphir.codec import decode_graph, encode_graph
from foundry.graphir.fingerprint import fingerprint
from foundry.graphir.graph import GraphIR


def reseal(root: Path, *, fingerprints: bool = True, graphs: bool = True) -> None:
    """Recompute every hash chain link of the archive at ``root``; with
    ``graphs=False`` only the sessions' hashes in the catalog (for edits that
    point graph entries somewhere a reader must refuse)."""
    catalog_path = root / CATALOG_FILE
    catalog = json.loads(catalog_path.read_text())
    for rank in catalog["ranks"]:
        session_path = root / rank["session"]
        if not graphs:  # hash the session as it is, without parsing it
            rank["sha256"] = sha256_hex(session_path.read_bytes())
            continue
        session = json.loads(session_path.read_text())
        for entry in session["graphs"] if graphs else ():
            data = (session_path.parent / entry["file"]).read_bytes()
            entry["sha256"], entry["size"] = sha256_hex(data), len(data)
            if fingerprints:
                try:
                    ir = decode_graph(data, deep=False)
                except Exception:  # noqa: BLE001 - a deliberately broken graph keeps its old fingerprint
                    continue
                entry["fingerprint"], entry["nodes"] = fingerprint(ir), len(ir)
        session_bytes = (json.dumps(session, indent=1) + "\n").encode()
        session_path.write_bytes(session_bytes)
        rank["sha256"] = sha256_hex(session_bytes)
    catalog_path.write_text(json.dumps(catalog, indent=1) + "\n")


def graph_file(root: Path, name: str, rank: int = 0) -> Path:
    session = json.loads((root / f"rank{rank}" / "session.json").read_text())
    entry = next(g for g in session["graphs"] if g["name"] == name)
    return root / f"rank{rank}" / entry["file"]


def edit_graph(root: Path, name: str, edit: Callable[[GraphIR], None], *, rank: int = 0) -> None:
    """Decode a graph, let ``edit`` change its IR, write it back, drop its launch plan (as
    Foundry's own rewrites do: a LOAD then builds from the IR) and re-seal."""
    path = graph_file(root, name, rank)
    ir = decode_graph(path.read_bytes())
    edit(ir)
    path.write_bytes(encode_graph(ir))

    def drop_plan(session: dict) -> None:
        next(g for g in session["graphs"] if g["name"] == name)["plan"] = None

    edit_json(root / f"rank{rank}" / "session.json", drop_plan, root=root, graphs=True)


def edit_json(path: Path, edit: Callable[[dict], None], *, root: Path | None = None, graphs: bool = False) -> None:
    """Edit a catalog or session JSON file, then re-seal ``root`` if given
    (graph entries are recomputed only with ``graphs=True``)."""
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=1) + "\n")
    if root is not None:
        reseal(root, graphs=graphs)


def flag_first_graph(root: Path, flags: int) -> None:
    """Give rank 0's first graph of the archive at ``root`` these instantiation flags (a
    session of format 6, as a SAVE that saw them writes it), re-sealed."""

    def flagged(session: dict) -> None:
        session["format_version"] = 6
        session["graphs"][0]["instantiate_flags"] = flags

    edit_json(root / "rank0" / "session.json", flagged, root=root)


def write_archive(path: Path, graphs: list[GraphIR], *, like: Path, modules: tuple[bytes, ...] = (),
                  plan_of: Callable[[GraphIR], Any] | None = None) -> Archive:  # fmt: skip
    """A one-rank archive of ``graphs`` (and module images) in the environment of the archive at ``like``;
    ``plan_of(ir)`` gives each graph's launch plan (or None)."""
    writer = ArchiveWriter(path, environment=Archive.open(like).catalog.environment)
    for blob in modules:
        writer.add_module(blob, format="cubin")
    rank = writer.rank(0)
    for ir in graphs:
        rank.add_graph(ir, plan=plan_of(ir) if plan_of else None)
    rank.seal()
    writer.commit()
    return Archive.open(path)

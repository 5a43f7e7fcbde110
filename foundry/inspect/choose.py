"""Things named on a command line (a graph, a glob of graphs, a kind, a rule), refused
with what does exist: the closest names first, then a short listing of the rest.

A refusal that only echoes the input leaves the user to guess; these name the
candidates, in one line however many there are.
"""

from __future__ import annotations

from collections.abc import Iterable

from foundry.archive.reader import Archive
from foundry.archive.schema import GraphEntry
from foundry.errors import ArchiveError, LintError

LISTED = 8  # names listed before "and N more"


def listing(names: Iterable[str], *, limit: int = LISTED) -> str:
    """``a, b, c`` or ``a, b, ... and 12 more``: names in one short phrase."""
    names = list(names)
    if not names:
        return "none"
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"


def suggestion(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to ``word`` (a typo's intended name), if one is close."""
    import difflib  # imported here: only a refusal needs it

    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return close[0] if close else None


def _candidates_phrase(word: str, names: list[str], what: str) -> str:
    near = suggestion(word, names)
    hint = f"did you mean {near!r}? " if near else ""
    return f"{hint}{what}: {listing(names)}"


def graph_entry(archive: Archive, rank: int, name: str) -> GraphEntry:
    """The graph ``name`` of ``rank``; refused naming the graphs the rank has."""
    if rank not in archive.ranks:
        raise ArchiveError(f"archive has no rank {rank} (ranks: {listing(map(str, archive.ranks))})",
                           path=str(archive.root), field="--rank", found=rank)  # fmt: skip
    entries = archive.entries(rank)
    for entry in entries:
        if entry.name == name:
            return entry
    names = [e.name for e in entries]
    raise ArchiveError(f"rank {rank} has no graph {name!r}; " + _candidates_phrase(name, names, "its graphs"),
                       path=str(archive.root), field="GRAPH", found=name)  # fmt: skip


def selection(archive: Archive, *, rank: int | None, pattern: str | None) -> list[tuple[int, GraphEntry]]:
    """``(rank, entry)`` pairs for ``--rank``/``--graph``; an empty selection is refused
    naming the graphs there are."""
    if rank is not None and rank not in archive.ranks:
        raise LintError(f"archive has no rank {rank} (ranks: {listing(map(str, archive.ranks))})", field="--rank",
                        found=rank)  # fmt: skip
    chosen = archive.select(rank=rank, pattern=pattern)
    if chosen:
        return chosen
    names = sorted({e.name for _, e in archive.select(rank=rank)})
    where = "the archive" if rank is None else f"rank {rank}"
    if pattern is None:
        raise LintError(f"{where} holds no graph", field="--rank", found=rank)
    raise LintError(f"no graph matches --graph {pattern!r} in {where}; graphs: {listing(names)}", field="--graph",
                    found=pattern)  # fmt: skip


def unknown(word: str, candidates: Iterable[str], *, what: str, option: str) -> LintError:
    """A refusal of an unknown ``what`` (a kind, a rule) given to ``option``, with the
    closest candidate and a short listing."""
    names = sorted(candidates)
    return LintError(f"unknown {what} {word!r}; " + _candidates_phrase(word, names, f"{what}s"), field=option)

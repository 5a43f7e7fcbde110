"""Reading archives: every file bounded, every blob checked against its sha256,
every record decoded by type, every problem one :class:`ArchiveError` that names
the file and the field."""

from __future__ import annotations

import fnmatch
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import msgspec

from foundry.archive.files import DEFAULT_LIMITS, Limits, contained_path, hash_bounded, read_bounded, sha256_hex
from foundry.archive.outputs import check_output
from foundry.archive.schema import (
    ARCHIVE_FORMAT,
    CATALOG_FILE,
    FORMAT_VERSION,
    MAX_ARCHIVE_GRAPHS,
    MAX_WORLD_SIZE,
    PLAN_SUFFIX,
    SESSION_FORMAT,
    SESSION_VERSION,
    Catalog,
    GlobalRecord,
    GraphEntry,
    ModuleState,
    Session,
    catalog_version,
    session_version,
)
from foundry.errors import ArchiveError, IRError

if TYPE_CHECKING:
    from foundry.graphir.graph import GraphIR

T = TypeVar("T")

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_FIELD = re.compile(r" - at `\$\.?(.*)`$")


class _Header(msgspec.Struct):
    format: str | None = None
    format_version: int | None = None


def decode_error(err: Exception, *, path: Path) -> ArchiveError:
    """One ArchiveError, naming the field, for a failed typed decode."""
    if isinstance(err, msgspec.ValidationError):
        text = str(err)
        match = _FIELD.search(text)
        message = _FIELD.sub("", text) if match else text
        return ArchiveError(message, path=str(path), field=match.group(1) if match else None)
    if isinstance(err, RecursionError):
        return ArchiveError("nested too deeply", path=str(path))
    if isinstance(err, UnicodeDecodeError):
        return ArchiveError(f"not valid UTF-8 at byte {err.start}", path=str(path))
    return ArchiveError(f"cannot be decoded: {err}", path=str(path))


_DECODE_ERRORS = (msgspec.ValidationError, msgspec.DecodeError, RecursionError, UnicodeDecodeError)


def decode_typed(data: bytes, kind: type[T], *, path: Path) -> T:
    """Decode JSON into ``kind``; any failure becomes one ArchiveError naming the field."""
    try:
        return msgspec.json.decode(data, type=kind)
    except _DECODE_ERRORS as err:
        raise decode_error(err, path=path) from None


def _check_header(data: bytes, *, expected: str, path: Path, newest: int = FORMAT_VERSION) -> None:
    """The file's kind and a format version this Foundry reads (1 to ``newest``)."""
    header = decode_typed(data, _Header, path=path)
    if header.format != expected:
        raise ArchiveError(
            "not a Foundry file of this kind", path=str(path), field="format", expected=expected, found=header.format
        )
    version = header.format_version
    if not isinstance(version, int) or not 1 <= version <= newest:
        reason = (
            "written by a newer Foundry"
            if isinstance(version, int) and version > newest
            else "unsupported format version"
        )
        expected = newest if newest == 1 else f"1 to {newest}"
        raise ArchiveError(reason, path=str(path), field="format_version", expected=expected, found=version)


def _check_global_words(g: GlobalRecord, *, path: Path, field: str) -> None:
    """A global's skipped words: whole 8-byte words inside it, and its kept bytes its size."""
    if g.size < 0 or (g.value is not None and len(g.value) != g.size):
        raise ArchiveError("a device global's bytes differ from its size", path=str(path), field=f"{field}.size",
                           expected=g.size, found=None if g.value is None else len(g.value))  # fmt: skip
    for name in ("loader_words", "host_words"):
        bad = [o for o in getattr(g, name) or () if o % 8 or not 0 <= o <= g.size - 8]
        if bad:
            raise ArchiveError("a word offset is not an 8-byte word inside the global", path=str(path),
                               field=f"{field}.{name}", found=bad[:4])  # fmt: skip


def _check_sha(value: str, *, path: Path, field: str) -> None:
    if not _SHA256.match(value):
        raise ArchiveError("not a sha256 (64 lowercase hex digits)", path=str(path), field=field, found=value)


def _check_plan(graph: GraphEntry, *, path: Path, rank_dir: Path, field: str,
                resolved: dict[Path, Path] | None = None) -> None:  # fmt: skip
    """A launch plan's own record, and that it was packed from the graph file the entry names:
    a LOAD from plans never decodes the graph, so a graph changed after SAVE must not keep it."""
    plan = graph.plan
    assert plan is not None
    _check_sha(plan.sha256, path=path, field=f"{field}.sha256")
    contained_path(rank_dir, plan.file, field=f"{field}.file", source=path, resolved=resolved)
    if plan.graph_sha256 is not None and plan.graph_sha256 != graph.sha256:
        raise ArchiveError(f"the launch plan of graph {graph.name!r} was packed from another graph file: "
                           "the graph changed after SAVE and its plan did not", path=str(path),
                           field=f"{field}.graph_sha256", expected=graph.sha256, found=plan.graph_sha256)  # fmt: skip


class Archive:
    """An opened archive. Sessions and graphs are read lazily and checked on read."""

    def __init__(self, root: Path, catalog: Catalog, limits: Limits) -> None:
        self.root = root
        self.catalog = catalog
        self.limits = limits
        self._sessions: dict[int, Session] = {}
        self._session_bytes = 0  # of the sessions read: all of them are kept
        self._graph_count = 0  # in the sessions read
        self._lock = threading.Lock()  # the TUI reads sessions from worker threads

    @classmethod
    def open(cls, path: str | Path, *, limits: Limits = DEFAULT_LIMITS) -> Archive:
        root = Path(path)
        if not root.exists():
            raise ArchiveError("no such archive", path=str(root))
        if not root.is_dir():
            raise ArchiveError("an archive is a directory holding foundry-archive.json", path=str(root))
        catalog_path = root / CATALOG_FILE
        data = read_bounded(catalog_path, limits.catalog, what="catalog")
        _check_header(data, expected=ARCHIVE_FORMAT, path=catalog_path)
        catalog = decode_typed(data, Catalog, path=catalog_path)
        archive = cls(root, catalog, limits)
        archive._check_catalog(catalog_path)
        return archive

    # -- catalog ----------------------------------------------------------------

    def _check_catalog(self, path: Path) -> None:
        cat = self.catalog
        if not 1 <= cat.world_size <= MAX_WORLD_SIZE:
            raise ArchiveError("world size out of range", path=str(path), field="world_size", found=cat.world_size)
        ranks = [entry.rank for entry in cat.ranks]
        if sorted(ranks) != list(range(cat.world_size)):
            raise ArchiveError(
                "ranks must be 0..world_size-1, each once",
                path=str(path),
                field="ranks",
                expected=f"0..{cat.world_size - 1}",
                found=ranks[:16],
            )
        for i, entry in enumerate(cat.ranks):
            _check_sha(entry.sha256, path=path, field=f"ranks[{i}].sha256")
            contained_path(self.root, entry.session, field=f"ranks[{i}].session", source=path)
        for i, blob in enumerate(cat.modules.blobs):
            _check_sha(blob.sha256, path=path, field=f"modules.blobs[{i}].sha256")
        if cat.modules.state is ModuleState.ABSENT and cat.modules.blobs:
            raise ArchiveError("module state 'absent' but blobs are listed", path=str(path), field="modules")
        if cat.jit is not None:
            _check_sha(cat.jit.sha256, path=path, field="jit.sha256")
        if cat.format_version < catalog_version(cat):  # an older Foundry would have misread it
            raise ArchiveError("the catalog holds fields of a later format version", path=str(path),
                               field="format_version", expected=catalog_version(cat),
                               found=cat.format_version)  # fmt: skip

    @property
    def ranks(self) -> list[int]:
        return sorted(entry.rank for entry in self.catalog.ranks)

    # -- sessions ---------------------------------------------------------------

    def session(self, rank: int) -> Session:
        with self._lock:
            if rank not in self._sessions:
                self._sessions[rank] = self._read_session(rank)
            return self._sessions[rank]

    def _read_session(self, rank: int) -> Session:
        entry = next((e for e in self.catalog.ranks if e.rank == rank), None)
        if entry is None:
            raise ArchiveError(
                f"archive has no rank {rank}", path=str(self.root), field="ranks", expected=self.ranks, found=rank
            )
        path = contained_path(self.root, entry.session, field="session", source=self.root / CATALOG_FILE)
        left = self.limits.sessions - self._session_bytes  # the sessions of all ranks together have a limit too
        try:
            data = read_bounded(path, min(self.limits.session, left), what=f"rank {rank} session")
        except ArchiveError as err:
            if err.field == "size" and left < self.limits.session:
                raise ArchiveError(
                    "the sessions of all ranks together are larger than the reader accepts",
                    path=str(path),
                    field="size",
                    expected=f"<= {self.limits.sessions} bytes in all",
                    found=f"{self._session_bytes} bytes before this one, then {err.found}",
                ) from None
            raise
        self._session_bytes += len(data)
        found = sha256_hex(data)
        if found != entry.sha256:
            raise ArchiveError(
                "session does not match the catalog's sha256 (altered or damaged)",
                path=str(path),
                expected=entry.sha256,
                found=found,
            )
        _check_header(data, expected=SESSION_FORMAT, path=path, newest=SESSION_VERSION)
        session = decode_typed(data, Session, path=path)
        self._check_session(session, rank, path)
        self._graph_count += len(session.graphs)
        if self._graph_count > MAX_ARCHIVE_GRAPHS:
            raise ArchiveError("the archive's ranks hold more graphs in all than a reader accepts",
                               path=str(path), field="graphs", expected=f"<= {MAX_ARCHIVE_GRAPHS}",
                               found=self._graph_count)  # fmt: skip
        return session

    def _check_session(self, session: Session, rank: int, path: Path) -> None:
        if session.rank != rank:
            raise ArchiveError(
                "session belongs to another rank", path=str(path), field="rank", expected=rank, found=session.rank
            )
        names: set[str] = set()
        rank_dir = path.parent
        resolved: dict[Path, Path] = {}  # the rank's few directories, resolved once
        for i, graph in enumerate(session.graphs):
            field = f"graphs[{i}]"
            if graph.name in names:
                raise ArchiveError("graph name used twice", path=str(path), field=f"{field}.name", found=graph.name)
            names.add(graph.name)
            _check_sha(graph.sha256, path=path, field=f"{field}.sha256")
            contained_path(rank_dir, graph.file, field=f"{field}.file", source=path, resolved=resolved)
            if graph.size < 0 or graph.nodes < 0:
                raise ArchiveError("negative size or node count", path=str(path), field=field)
            if graph.outputs is not None:
                check_output(graph.outputs, path=str(path), field=f"{field}.outputs")
            if graph.plan is not None:
                _check_plan(graph, path=path, rank_dir=rank_dir, field=f"{field}.plan", resolved=resolved)
        warm = session.region.warmup_bytes if session.region is not None else None
        if warm is not None:
            _check_sha(warm.sha256, path=path, field="region.warmup_bytes.sha256")
            contained_path(rank_dir, warm.file, field="region.warmup_bytes.file", source=path)
        backends = [b.backend for b in session.backends]
        if len(set(backends)) != len(backends):
            raise ArchiveError("a backend has two state records", path=str(path), field="backends")
        for i, image in enumerate(session.images):
            for j, g in enumerate(image.globals):
                _check_global_words(g, path=path, field=f"images[{i}].globals[{j}]")
        needed = session_version(session.images, session.graphs, session.region)
        if session.format_version < needed:  # an older Foundry would have misread it
            raise ArchiveError(f"the session holds fields of format version {needed}", path=str(path),
                               field="format_version", expected=needed, found=session.format_version)  # fmt: skip

    def session_path(self, rank: int) -> Path:
        entry = next(e for e in self.catalog.ranks if e.rank == rank)
        return self.root.joinpath(entry.session)

    # -- graphs -----------------------------------------------------------------

    def entries(self, rank: int) -> tuple[GraphEntry, ...]:
        return self.session(rank).graphs

    def entry(self, rank: int, name: str) -> GraphEntry:
        for graph in self.entries(rank):
            if graph.name == name:
                return graph
        raise ArchiveError(
            f"rank {rank} has no graph {name!r}", path=str(self.session_path(rank)), field="graphs", found=name
        )

    def select(self, *, rank: int | None = None, pattern: str | None = None) -> list[tuple[int, GraphEntry]]:
        """``(rank, entry)`` pairs matching a rank and a glob over graph names."""
        ranks = self.ranks if rank is None else [rank]
        if rank is not None and rank not in self.ranks:
            raise ArchiveError(
                f"archive has no rank {rank}", path=str(self.root), field="ranks", expected=self.ranks, found=rank
            )
        return [
            (r, e) for r in ranks for e in self.entries(r) if pattern is None or fnmatch.fnmatchcase(e.name, pattern)
        ]

    def graph_path(self, rank: int, entry: GraphEntry) -> Path:
        session_path = self.session_path(rank)
        return contained_path(session_path.parent, entry.file, field="file", source=session_path)

    def graph_bytes(self, rank: int, entry: GraphEntry) -> bytes:
        return self._graph_file(rank, entry)[1]

    def _graph_file(self, rank: int, entry: GraphEntry) -> tuple[Path, bytes]:
        """The graph file's path and its bytes, of the entry's size and sha256: :meth:`graph` names
        the path in its errors without resolving it again (each resolution walks the directories)."""
        path = self.graph_path(rank, entry)
        try:
            data = read_bounded(path, self.limits.graph, what=f"graph {entry.name!r}", size=entry.size)
        except ArchiveError as err:
            if err.field == "size" and err.expected == entry.size:  # compared before reading
                raise ArchiveError("graph file size differs from its session entry", path=str(path), field="size",
                                   expected=entry.size, found=err.found) from None  # fmt: skip
            raise
        found = sha256_hex(data)
        if found != entry.sha256:
            raise ArchiveError(
                "graph does not match its sha256 (altered or damaged)",
                path=str(path),
                field="sha256",
                expected=entry.sha256,
                found=found,
            )
        return path, data

    def graph(self, rank: int, name: str | GraphEntry, *, deep: bool = True) -> GraphIR:
        """Read, check and decode one graph.

        The file's size and sha256 are always checked. ``deep`` (the default)
        also checks every operand against the node bytes and its region, as
        LOAD, diff and verify need; inspect, lint and the TUI pass
        ``deep=False`` and check structure only, which keeps them safe on any
        input and fast on large archives."""
        from foundry.graphir.codec import decode_graph  # here: opening an archive imports no IR

        entry = name if isinstance(name, GraphEntry) else self.entry(rank, name)
        path, data = self._graph_file(rank, entry)
        try:
            ir = decode_graph(data, deep=deep)
        except _DECODE_ERRORS as err:
            raise decode_error(err, path=path) from None
        except IRError as err:
            raise ArchiveError(
                err.message,
                path=str(path),
                field=err.field,
                node=err.node,
                kernel=err.kernel,
                expected=err.expected,
                found=err.found,
            ) from None
        if ir.name != entry.name or len(ir) != entry.nodes:
            raise ArchiveError(
                "graph file disagrees with its session entry",
                path=str(path),
                field="name/nodes",
                expected=(entry.name, entry.nodes),
                found=(ir.name, len(ir)),
            )
        return ir

    # -- modules ----------------------------------------------------------------

    def module(self, sha256: str) -> bytes:
        path = contained_path(self.root, f"modules/{sha256}.bin", field="modules", source=self.root / CATALOG_FILE)
        data = read_bounded(path, self.limits.module, what=f"module image {sha256[:12]}")
        if sha256_hex(data) != sha256:
            raise ArchiveError(
                "module image does not match its sha256", path=str(path), expected=sha256, found=sha256_hex(data)
            )
        return data

    def check_module(self, sha256: str, size: int | None = None) -> None:
        """Check a module image against its sha256 (and recorded size) without holding it."""
        path = contained_path(self.root, f"modules/{sha256}.bin", field="modules", source=self.root / CATALOG_FILE)
        found = hash_bounded(path, self.limits.module, what=f"module image {sha256[:12]}", size=size)
        if found != sha256:
            raise ArchiveError("module image does not match its sha256", path=str(path), expected=sha256, found=found)

    def module_present(self, sha256: str) -> bool:
        return (self.root / "modules" / f"{sha256}.bin").is_file()

    # -- rank blobs ---------------------------------------------------------------

    def rank_blob(self, rank: int, relative: str, *, sha256: str, size: int, what: str) -> bytes:
        """A rank-level file (the warm-up bytes, a launch plan) of exactly ``size`` bytes with
        this sha256; the file's real size is compared with ``size`` before anything is read."""
        path = self._rank_file(rank, relative, what)
        data = read_bounded(path, self._rank_limit(relative), what=what, size=size)
        if sha256_hex(data) != sha256:
            raise ArchiveError(f"{what} does not match its record", path=str(path), field="sha256", expected=sha256,
                               found=sha256_hex(data))  # fmt: skip
        return data

    def check_rank_blob(self, rank: int, relative: str, *, sha256: str, size: int, what: str) -> None:
        """Check a rank-level file as :meth:`rank_blob` does, reading it in pieces (memory stays flat)."""
        path = self._rank_file(rank, relative, what)
        found = hash_bounded(path, self._rank_limit(relative), what=what, size=size)
        if found != sha256:
            raise ArchiveError(f"{what} does not match its record", path=str(path), field="sha256", expected=sha256,
                               found=found)  # fmt: skip

    def _rank_file(self, rank: int, relative: str, what: str) -> Path:
        session_path = self.session_path(rank)
        return contained_path(session_path.parent, relative, field=what, source=session_path)

    def _rank_limit(self, relative: str) -> int:
        return self.limits.graph if relative.endswith(PLAN_SUFFIX) else self.limits.warmup

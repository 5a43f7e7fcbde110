"""Writing archives: every file atomically, every blob content-addressed, the
catalog last, so a SAVE that dies at any point leaves nothing that opens as an
archive."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import msgspec

from foundry.archive.files import DirectoryWriter, atomic_write, encode_record, sha256_hex
from foundry.archive.outputs import OutputValue, check_output
from foundry.archive.rank_parts import RankPart, check_save_id, commit_when_complete, make_catalog, write_part
from foundry.archive.schema import (
    CATALOG_FILE,
    PLAN_SUFFIX,
    SESSION_FORMAT,
    BackendState,
    Environment,
    GraphEntry,
    ImageRecord,
    LaunchPlan,
    ModuleBlob,
    ModuleState,
    PlanKernel,
    RankEntry,
    RegionRecord,
    RngRecord,
    Session,
    session_version,
)
from foundry.errors import ArchiveError
from foundry.graphir.codec import GRAPH_SUFFIX, encode_graph
from foundry.graphir.fingerprint import fingerprint, topology_key
from foundry.graphir.graph import GraphIR

GRAPH_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class RankWriter:
    """Collects one rank's graphs and state; :meth:`seal` writes its session."""

    def __init__(self, archive: ArchiveWriter, rank: int) -> None:
        self.archive = archive
        self.rank = rank
        self.dir = archive.root / f"rank{rank}"
        self.graphs: list[GraphEntry] = []
        self._names: set[str] = set()
        self._graph_files = DirectoryWriter(self.dir / "graphs")
        self._plan_files = DirectoryWriter(self.dir / "plans")
        self.backends: list[BackendState] = []
        self.region: RegionRecord | None = None
        self.images: list[ImageRecord] = []
        self.sealed: RankEntry | None = None

    def add_graph(
        self,
        ir: GraphIR,
        *,
        shape_key: int | None = None,
        runner: str | None = None,
        outputs: OutputValue | None = None,
        rng: RngRecord | None = None,
        plan: tuple[bytes, tuple[PlanKernel, ...]] | None = None,
        instantiate_flags: int = 0,
    ) -> GraphEntry:
        """Check, encode and write one graph (and its launch plan: packed bytes and
        function table); return its session entry."""
        self._check_open()
        if not GRAPH_NAME.match(ir.name):
            raise ArchiveError(
                "graph names are 1-128 of A-Z a-z 0-9 . _ - (starting alphanumeric)", field="name", found=ir.name
            )
        if ir.name in self._names:
            raise ArchiveError(f"rank {self.rank} already has a graph {ir.name!r}", field="name")
        if outputs is not None:
            check_output(outputs, path=str(self.dir), field=f"{ir.name}.outputs")
        ir.check()
        data = encode_graph(ir)
        filename = f"{ir.name}{GRAPH_SUFFIX}"
        self._graph_files.write(filename, data)
        sha256 = sha256_hex(data)
        entry = GraphEntry(
            name=ir.name,
            file=f"graphs/{filename}",
            sha256=sha256,
            size=len(data),
            fingerprint=fingerprint(ir),
            nodes=len(ir),
            shape_key=shape_key,
            runner=runner,
            outputs=outputs,
            topology=topology_key(ir),
            rng=rng,
            plan=None if plan is None else self._write_plan(ir.name, *plan, graph_sha256=sha256),
            instantiate_flags=instantiate_flags or msgspec.UNSET,
        )
        self.graphs.append(entry)
        self._names.add(ir.name)
        return entry

    def _write_plan(self, name: str, data: bytes, kernels: tuple[PlanKernel, ...], *, graph_sha256: str) -> LaunchPlan:
        filename = f"{name}{PLAN_SUFFIX}"
        self._plan_files.write(filename, data)
        return LaunchPlan(file=f"plans/{filename}", sha256=sha256_hex(data), size=len(data), kernels=kernels,
                          graph_sha256=graph_sha256)  # fmt: skip

    def add_backend_state(self, state: BackendState) -> None:
        self._check_open()
        if any(b.backend == state.backend for b in self.backends):
            raise ArchiveError(f"backend {state.backend!r} already has a state record", field="backends")
        self.backends.append(state)

    def set_region(self, region: RegionRecord) -> None:
        self._check_open()
        self.region = region

    def add_images(self, images: list[ImageRecord]) -> None:
        self._check_open()
        self.images.extend(images)

    def add_file(self, name: str, data: bytes) -> str:
        """Write a rank-level blob (e.g. the warm-up bytes); return its sha256."""
        self._check_open()
        atomic_write(self.dir / name, data)
        return sha256_hex(data)

    def seal(self) -> RankEntry:
        """Write ``session.json``; the rank takes no more graphs afterwards."""
        self._check_open()
        self._graph_files.sync()  # the files it names are in place before it is
        self._plan_files.sync()
        session = Session(
            format=SESSION_FORMAT,
            format_version=session_version(self.images, self.graphs, self.region),
            rank=self.rank,
            graphs=tuple(self.graphs),
            region=self.region,
            backends=tuple(sorted(self.backends, key=lambda b: b.backend)),
            images=tuple(sorted(self.images, key=lambda i: i.sha256)),
        )
        data = encode_record(session)
        atomic_write(self.dir / "session.json", data)
        self.sealed = RankEntry(self.rank, f"rank{self.rank}/session.json", sha256_hex(data))
        return self.sealed

    def _check_open(self) -> None:
        if self.sealed is not None:
            raise ArchiveError(f"rank {self.rank} is already sealed")


class ArchiveWriter:
    """Writes an archive directory.

    An existing archive is never replaced unless ``overwrite`` is set; then its
    catalog is removed first, so a SAVE that dies leaves no archive that looks
    valid rather than a mixture of old and new.

    With ``save_id``, this process writes only some ranks of an archive other
    processes write the rest of (:mod:`foundry.archive.rank_parts`): :meth:`commit`
    leaves each sealed rank's part, and the catalog is written by whichever
    process completes the set. ``overwrite`` then removes only the catalog; the
    ranks' files are replaced by their own processes.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        environment: Environment,
        world_size: int = 1,
        model: dict[str, str] | None = None,
        overwrite: bool = False,
        save_id: str | None = None,
    ) -> None:
        self.root = Path(path)
        self.save_id = save_id
        if save_id is not None:
            check_save_id(self.root, save_id)
        catalog = self.root / CATALOG_FILE
        if catalog.exists() and not overwrite:
            raise ArchiveError("already holds an archive (pass overwrite to replace it)", path=str(self.root))
        if self.root.exists() and not self.root.is_dir():
            raise ArchiveError("exists and is not a directory", path=str(self.root))
        self.root.mkdir(parents=True, exist_ok=True)
        if catalog.exists() and save_id is not None:  # shared: the other ranks' files are theirs
            catalog.unlink(missing_ok=True)
        elif catalog.exists():  # overwrite: invalidate first, then clear what the old archive owned
            catalog.unlink()
            for owned in [*self.root.glob("rank[0-9]*"), self.root / "modules", self.root / "jit"]:
                if owned.is_dir() and not owned.is_symlink():
                    shutil.rmtree(owned)
        self.environment = environment
        self.world_size = world_size
        self.model = dict(model or {})
        self.ranks: dict[int, RankWriter] = {}
        self.modules: dict[str, ModuleBlob] = {}
        self.module_state = ModuleState.ABSENT
        self._module_files = DirectoryWriter(self.root / "modules", shared=True)  # every rank's process

    def rank(self, rank: int) -> RankWriter:
        if not 0 <= rank < self.world_size:
            raise ArchiveError("rank out of range", field="rank", expected=f"0..{self.world_size - 1}", found=rank)
        if rank not in self.ranks:
            self.ranks[rank] = RankWriter(self, rank)
        return self.ranks[rank]

    def add_module(self, image: bytes, *, format: str = "unknown") -> str:
        """Store a module image once, under its sha256; return the sha256."""
        digest = sha256_hex(image)
        if digest not in self.modules:
            self._module_files.write(f"{digest}.bin", image)
            self.modules[digest] = ModuleBlob(digest, len(image), format)
        self.module_state = ModuleState.COMPLETE
        return digest

    def commit(self) -> Path | None:
        """Write the catalog once every rank is sealed; the archive exists from here on.
        Shared (``save_id``): leave this process's parts and write the catalog if they
        complete the set; None when another process's commit is still to come."""
        self._module_files.sync()  # the images the catalog (or this process's part) names
        if self.save_id is not None:
            return self._commit_shared()
        missing = [r for r in range(self.world_size) if r not in self.ranks or self.ranks[r].sealed is None]
        if missing:
            raise ArchiveError("cannot commit before every rank is sealed", path=str(self.root), found=missing)
        ranks = tuple(self.ranks[r].sealed for r in range(self.world_size))
        catalog = make_catalog(self.environment, self.world_size, ranks, self.module_state, self.modules.values(),
                               self.model)  # fmt: skip
        atomic_write(self.root / CATALOG_FILE, encode_record(catalog))
        return self.root

    def _commit_shared(self) -> Path | None:
        assert self.save_id is not None
        unsealed = [r for r, writer in self.ranks.items() if writer.sealed is None]
        if unsealed or not self.ranks:
            raise ArchiveError("cannot commit before this process's ranks are sealed", path=str(self.root),
                               found=unsealed)  # fmt: skip
        blobs = tuple(sorted(self.modules.values(), key=lambda b: b.sha256))
        for writer in self.ranks.values():
            assert writer.sealed is not None
            write_part(self.root, RankPart(self.save_id, self.world_size, writer.sealed, self.environment, blobs,
                                           self.module_state, dict(self.model)))  # fmt: skip
        return self.root if commit_when_complete(self.root, self.world_size, self.save_id) else None

"""Finding backends through the ``foundry.backends`` entry-point group.

Built-ins register through the same group as third parties, so a new
collective type is a package, not an edit to Foundry. A backend that fails to
load or breaks the contract is recorded as broken with the reason; it becomes
fatal only when an archive needs it (:meth:`BackendRegistry.require`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from foundry.backends.base import CONTRACT_VERSION, KIND_PATTERN, Backend, KernelMatch
from foundry.errors import BackendError
from foundry.graphir.kernel import KernelIdentity

if TYPE_CHECKING:  # importlib.metadata is imported by discovery: a command reading graphs forks its workers first
    from importlib.metadata import EntryPoint


def _describe(ep: EntryPoint) -> str:
    """An entry point as a backend's origin; its distribution's name is read from its metadata
    (an e-mail parser: every command discovers backends, few show where they came from)."""
    return f"{ep.value} ({ep.dist.name if ep.dist else 'unknown distribution'})"


def _warn(message: str, *args: object) -> None:
    """A broken backend, logged: logging imported only then (every command discovers backends)."""
    import logging

    logging.getLogger(__name__).warning(message, *args)


ENTRY_POINT_GROUP = "foundry.backends"


@dataclass(frozen=True)
class BrokenBackend:
    """A registered backend that could not be used, and why."""

    name: str
    target: str
    reason: str


def registered(group: str = ENTRY_POINT_GROUP) -> list[EntryPoint]:
    """The entry points registered under ``group``, in a stable order, none loaded: reading
    every installed package's metadata imports nothing of theirs, so it can run on a
    thread beside a program's own imports, which loading a backend could race."""
    from importlib.metadata import entry_points

    return sorted(entry_points(group=group), key=lambda e: (e.name, e.value))


class BackendRegistry:
    """The backends of one process. Built explicitly; nothing global."""

    def __init__(self, backends: Iterable[Backend] = (), broken: Iterable[BrokenBackend] = ()) -> None:
        self.backends: dict[str, Backend] = {}
        self.broken: dict[str, BrokenBackend] = {b.name: b for b in broken}
        self.origins: dict[str, str | EntryPoint] = {}  # an entry point is named when asked (see origin)
        for backend in backends:
            self.add(backend)
        self._matches: dict[str, KernelMatch | None] = {}

    @classmethod
    def discover(cls, group: str = ENTRY_POINT_GROUP) -> BackendRegistry:
        """Load every backend registered under ``group``."""
        return cls.load(registered(group))

    @classmethod
    def load(cls, eps: list[EntryPoint]) -> BackendRegistry:
        """The backends of ``eps`` (as :func:`registered` lists them), each imported here."""
        registry = cls()
        for ep in eps:
            registry._load(ep)
        return registry

    def _load(self, ep: EntryPoint) -> None:
        if ep.name in self.backends:
            self._broken(ep.name, _describe(ep), f"name already registered by {self.origin(ep.name)}")
            return
        try:
            loaded = ep.load()
        except Exception as err:  # noqa: BLE001 - any import failure makes the backend broken, with its reason
            self._broken(ep.name, _describe(ep), f"import failed: {type(err).__name__}: {err}")
            return
        try:
            backend = self._instantiate(ep.name, loaded)
        except BackendError as err:
            self._broken(ep.name, _describe(ep), err.message)
            return
        self.add(backend, origin=ep)

    @staticmethod
    def _instantiate(name: str, loaded: object) -> Backend:
        if not (isinstance(loaded, type) and issubclass(loaded, Backend)):
            raise BackendError(f"entry point does not name a subclass of foundry.backends.Backend ({loaded!r})")
        if getattr(loaded, "name", None) != name:
            raise BackendError(f"declares name {getattr(loaded, 'name', None)!r} but is registered as {name!r}")
        if loaded.contract != CONTRACT_VERSION:
            raise BackendError(f"written for contract {loaded.contract}, this Foundry speaks {CONTRACT_VERSION}")
        bad = [k for k in loaded.kinds if not KIND_PATTERN.match(k)]
        if bad:
            raise BackendError(f"kind names must be lowercase words joined by '-': {bad}")
        if not isinstance(loaded.needs_state, bool):
            raise BackendError(f"needs_state must be True or False, not {loaded.needs_state!r}")
        try:
            return loaded()
        except Exception as err:  # noqa: BLE001 - a constructor failure is a broken backend, not a crash
            raise BackendError(f"construction failed: {type(err).__name__}: {err}") from None

    def _broken(self, name: str, origin: str, reason: str) -> None:
        _warn("backend %s is broken: %s", name, reason)
        self.broken[name] = BrokenBackend(name, origin, reason)

    def origin(self, name: str) -> str:
        """Where backend ``name`` came from: its entry point and distribution, or in-process."""
        origin = self.origins[name]
        return origin if isinstance(origin, str) else _describe(origin)

    def add(self, backend: Backend, *, origin: str | EntryPoint = "in-process") -> None:
        if backend.name in self.backends:
            raise BackendError(f"backend {backend.name!r} is registered twice")
        self.backends[backend.name] = backend
        self.origins[backend.name] = origin
        self._matches = {}

    # -- use --------------------------------------------------------------------

    def recognise(self, kernel: KernelIdentity) -> KernelMatch | None:
        """The first claim on ``kernel`` in backend-name order (cached by kernel name)."""
        if kernel.name not in self._matches:
            claims = [m for b in self.backends.values() if (m := b.recognise(kernel)) is not None]
            if len(claims) > 1:
                _warn("kernel %s claimed by %s; using %s", kernel.name, [c.backend for c in claims], claims[0].backend)
            self._matches[kernel.name] = claims[0] if claims else None
        return self._matches[kernel.name]

    def kinds(self) -> set[str]:
        return {kind for backend in self.backends.values() for kind in backend.kinds}

    def require(self, name: str) -> Backend:
        """The backend an archive needs, or an error naming it and why it is unusable."""
        if name in self.backends:
            return self.backends[name]
        if name in self.broken:
            raise BackendError(f"archive needs backend {name!r}, which is broken: {self.broken[name].reason}")
        raise BackendError(
            f"archive needs backend {name!r}, which is not installed", expected=name, found=sorted(self.backends)
        )

    def describe(self) -> list[dict[str, object]]:
        """Every backend, usable or broken, as rows for ``foundry backends list``."""
        rows: list[dict[str, object]] = []
        for name, backend in sorted(self.backends.items()):
            rows.append(
                {
                    "name": name,
                    "status": "ok",
                    "origin": self.origin(name),
                    "kinds": sorted(backend.kinds),
                    "implements": list(backend.implements()),
                    "description": backend.description,
                }
            )
        for name, broken in sorted(self.broken.items()):
            rows.append({"name": name, "status": "broken", "origin": broken.target, "reason": broken.reason})
        return rows

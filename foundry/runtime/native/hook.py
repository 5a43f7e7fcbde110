"""The native hook seen from Python: ctypes over ``native/include/foundry_hook.h``.

The hook is loaded with ``LD_PRELOAD``; its control API is then in the process's
global symbol namespace. :meth:`Hook.attach` refuses, with the reason, when it
is not there.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from foundry.env import HOOK_LIB, MODES, THREAD_POLICIES
from foundry.errors import HookError

ABI = 9
LIBRARY = "libfoundry_hook.so"
COUNTERS = (
    "stream_captures",
    "graph_instantiates",
    "allocations",
    "refused",
    "images",
    "native_instantiate_us",
    "native_nodes_us",
    "ipc_imports",
    "passthrough_captures",
    "passthrough_instantiates",
    "other_thread_allocations",
    "late_allocations",
)


class _Alloc(ctypes.Structure):
    _fields_ = [
        ("order", ctypes.c_uint64),
        ("offset", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
        ("request", ctypes.c_uint64),
        ("freed", ctypes.c_int32),
        ("reserve", ctypes.c_int32),
        ("phase", ctypes.c_int32),
        ("pad", ctypes.c_int32),
    ]


class _RegionInfo(ctypes.Structure):
    _fields_ = [
        ("base", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
        ("cursor", ctypes.c_uint64),
        ("allocations", ctypes.c_uint64),
        ("granularity", ctypes.c_uint64),
        ("mode", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("late_expected", ctypes.c_uint64),
        ("late_made", ctypes.c_uint64),
        ("diverged", ctypes.c_int32),
        ("following", ctypes.c_int32),
    ]


class _Image(ctypes.Structure):
    _fields_ = [
        ("handle", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
        ("kind", ctypes.c_int32),
        ("format", ctypes.c_int32),
        ("copied", ctypes.c_int32),
        ("unloaded", ctypes.c_int32),
        ("hashed", ctypes.c_int32),
        ("pad", ctypes.c_int32),
        ("sha256", ctypes.c_uint8 * 32),
    ]


class _Config(ctypes.Structure):
    _fields_ = [
        ("mode", ctypes.c_int32),
        ("region_threads", ctypes.c_int32),
        ("region_base", ctypes.c_uint64),
        ("region_size", ctypes.c_uint64),
        ("import_base", ctypes.c_uint64),
        ("rank", ctypes.c_int64),
        ("hook_echo", ctypes.c_int32),
        ("hook_symbols", ctypes.c_int32),
        ("load_captures", ctypes.c_int32),
        ("region_numbers_ok", ctypes.c_int32),
        ("session_pid", ctypes.c_int64),
        ("session_marker", ctypes.c_int32),
        ("session_checked", ctypes.c_int32),
    ]


_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
PHASES = ("warmup", "capture", "late", "restored", "sealed")  # enum foundry_phase
IMAGE_KINDS = {1: "module", 2: "library"}
IMAGE_FORMATS = {0: "unknown", 1: "cubin", 2: "fatbin", 3: "ptx"}


@dataclass(frozen=True)
class Image:
    """A code image the process loaded, as the hook's registry recorded it."""

    index: int
    handle: int
    size: int
    kind: str
    format: str
    copied: bool
    unloaded: bool
    sha256: str | None


@dataclass(frozen=True)
class Allocation:
    order: int
    offset: int
    size: int
    request: int
    freed: bool
    reserve: bool = False
    # warmup, capture, late (between captures: a LOAD repeating the warm-ups makes it again at SAVE's offset),
    # restored (after a LOAD restored the region: the program's own) or sealed (after a SAVE wrote its archive)
    phase: str = "warmup"

    def raw(self) -> _Alloc:
        return _Alloc(self.order, self.offset, self.size, self.request, int(self.freed), int(self.reserve),
                      PHASES.index(self.phase), 0)  # fmt: skip


@dataclass(frozen=True)
class RegionInfo:
    base: int
    size: int
    cursor: int
    allocations: int
    granularity: int
    mode: str
    reserved: bool
    late_expected: int = 0  # LOAD: SAVE's allocations between captures it is to repeat
    late_made: int = 0  # LOAD: how many of them it repeated so far
    diverged: bool = False  # LOAD: an allocation departed from SAVE's trace (the events say which)
    following: bool = False  # LOAD: restored, repeating SAVE's late allocations until sealed


@dataclass(frozen=True)
class HookConfig:
    """The ``FOUNDRY_*`` configuration the hook reads from its environment, as its
    parsers make it (``foundry_hook_config``; :mod:`foundry.env` says what each means).
    An unset variable reads as the value the hook uses instead."""

    mode: str
    region_threads: str  # owner, any, or "neither" for another word
    region_base: int
    region_size: int
    import_base: int
    rank: int | None  # None: not a rank number
    hook_echo: bool
    hook_symbols: bool
    load_captures: bool
    region_numbers_ok: bool  # False: the region's base or size is not a number
    session_pid: int | None  # the process `foundry run` became (0: unset); None: not a process id
    session_marker: bool  # a marker file is named
    session_checked: bool  # this process's exit 0 fails when no session wrote the marker


def _allocation(a: _Alloc) -> Allocation:
    phase = PHASES[a.phase] if 0 <= a.phase < len(PHASES) else str(a.phase)
    return Allocation(a.order, a.offset, a.size, a.request, bool(a.freed), bool(a.reserve), phase)


_HERE = Path(__file__).resolve()
PACKAGE_LIBRARY = _HERE.parents[2] / "_native" / LIBRARY  # where an installed package has it
NATIVE_SOURCES = _HERE.parents[3] / "native"  # a source checkout's (an editable install's) native/


def library_path() -> Path | None:
    """Where the built hook is: ``FOUNDRY_HOOK_LIB``, the package, or the source tree's build."""
    given = HOOK_LIB.read()
    candidates = [None if given is None else str(given)]
    candidates += [str(PACKAGE_LIBRARY), str(NATIVE_SOURCES / "build" / LIBRARY)]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def build_hint() -> str:
    """Exactly what to run to get the hook for this installation of Foundry."""
    if (NATIVE_SOURCES / "Makefile").is_file():  # a source checkout: the lookup searches its native/build
        return f"run `make -C {NATIVE_SOURCES}` (needs cuda.h, from CUDA_HOME or /usr/local/cuda, and a C compiler)"
    return (f"reinstall Foundry where cuda.h (CUDA_HOME) and a C compiler are (pip install --force-reinstall "
            f"--no-deps SOURCE-DIR-OR-WHEEL), or point {HOOK_LIB.name} at a built {LIBRARY}")  # fmt: skip


def hook_status() -> str:
    """One phrase for ``foundry --version``: where the hook is, or that it is not built and what to run."""
    path = library_path()
    return f"native hook: {path}" if path is not None else f"native hook: not built; {build_hint()}"


class Hook:
    """The hook loaded in this process."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib

    @classmethod
    def attach(cls) -> Hook:
        lib = ctypes.CDLL(None)
        try:
            abi = lib.foundry_hook_abi()
        except AttributeError:
            raise HookError(
                f"the native hook is not loaded in this process (start it with LD_PRELOAD={LIBRARY})"
            ) from None
        if abi != ABI:
            raise HookError("the loaded native hook speaks another ABI", expected=ABI, found=abi)
        return cls(lib)

    @classmethod
    def open_library(cls, path: Path) -> Hook:
        """The library loaded without LD_PRELOAD: only its pure functions are meaningful."""
        return cls(ctypes.CDLL(str(path)))

    def active(self) -> bool:
        """Whether the driver's entry points have been interposed (after CUDA initialised)."""
        return bool(self.lib.foundry_hook_active())

    def config(self) -> HookConfig:
        """What the hook makes of its ``FOUNDRY_*`` variables (see :class:`HookConfig`)."""
        raw = _Config()
        self._check(self.lib.foundry_hook_config(ctypes.byref(raw)), "foundry_hook_config")
        threads = THREAD_POLICIES[raw.region_threads] if raw.region_threads in (0, 1) else "neither"
        return HookConfig(MODES[raw.mode], threads, raw.region_base, raw.region_size, raw.import_base,
                          None if raw.rank < 0 else raw.rank, bool(raw.hook_echo), bool(raw.hook_symbols),
                          bool(raw.load_captures), bool(raw.region_numbers_ok),
                          None if raw.session_pid < 0 else raw.session_pid, bool(raw.session_marker),
                          bool(raw.session_checked))  # fmt: skip

    def region(self) -> RegionInfo:
        info = _RegionInfo()
        self._check(self.lib.foundry_region_info(ctypes.byref(info)), "foundry_region_info")
        mode = {0: "off", 1: "save", 2: "load"}.get(info.mode, str(info.mode))
        return RegionInfo(info.base, info.size, info.cursor, info.allocations, info.granularity, mode,
                          bool(info.reserved), info.late_expected, info.late_made, bool(info.diverged),
                          bool(info.following))  # fmt: skip

    def trace(self) -> list[Allocation]:
        count = ctypes.c_size_t()
        self.lib.foundry_region_trace(None, 0, ctypes.byref(count))
        buf = (_Alloc * max(count.value, 1))()
        self._check(self.lib.foundry_region_trace(buf, count.value, ctypes.byref(count)), "foundry_region_trace")
        return [_allocation(a) for a in buf[: count.value]]

    def reserve(self) -> None:
        """Reserve the region now (a context must be current), so a taken base is refused up front."""
        if self.lib.foundry_region_reserve() < 0:
            raise HookError("cannot reserve the deterministic region", found=self._last_error())

    def set_owner(self) -> None:
        """Make the calling thread the one allowed to allocate in the region."""
        self._check(self.lib.foundry_region_set_owner(), "foundry_region_set_owner")

    def expect(self, warmup: list[Allocation]) -> None:
        """LOAD: every allocation until :meth:`map_to` must repeat SAVE's warm-up, in order."""
        raw = (_Alloc * max(len(warmup), 1))(*(a.raw() for a in warmup))
        if self.lib.foundry_region_expect(raw, len(warmup)) < 0:
            raise HookError("the allocations made before LOAD began already differ from SAVE's warm-up")

    def call_shifted(
        self, fn: Callable[[], None], *, shift: int = 40_976, poison: int = 1 << 20, pattern: int = 0xA5
    ) -> None:
        """Run ``fn`` with its frames ``shift`` bytes lower on this thread's stack, over
        ``poison`` bytes of ``pattern`` (see native/src/stack.c). Exceptions propagate."""
        failure: list[BaseException] = []

        def trampoline(_: int | None) -> None:
            try:
                fn()
            except BaseException as err:  # noqa: BLE001 - re-raised below, outside the C frames
                failure.append(err)

        callback = _CALLBACK(trampoline)
        status = self.lib.foundry_call_shifted(ctypes.c_size_t(shift), ctypes.c_size_t(poison), pattern, callback, None)
        self._check(status, "foundry_call_shifted")
        if failure:
            raise failure[0]

    def errors(self) -> list[str]:
        """The hook's error events, oldest first."""
        return [line.removeprefix("error: ") for line in self.events() if line.startswith("error:")]

    def _last_error(self) -> str | None:
        errors = [line for line in self.events() if line.startswith("error:")]
        return errors[-1].removeprefix("error: ") if errors else None

    def map_to(self, offset: int) -> None:
        """LOAD: map the region up to SAVE's final offset, so every address its graphs use exists."""
        if self.lib.foundry_region_map_to(ctypes.c_uint64(offset)) < 0:
            raise HookError(
                "cannot map the region up to SAVE's final offset",
                found=offset,
                expected=f"see the hook's events: {self.events()[-3:]}",
            )

    def restore(self, ranges: list[tuple[int, int]], final_offset: int, late: list[Allocation], *,
                follow: bool) -> None:  # fmt: skip
        """LOAD: map ``ranges`` (offset, size) up to SAVE's final offset, leaving room for
        SAVE's ``late`` allocations; with ``follow`` the program's next allocations must
        repeat them, each placed at SAVE's offset (see :mod:`foundry.runtime.sessions.placement`)."""
        flat = (ctypes.c_uint64 * max(2 * len(ranges), 1))(*(n for pair in ranges for n in pair))
        raw = (_Alloc * max(len(late), 1))(*(a.raw() for a in late))
        fn = self.lib.foundry_region_restore
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t,
                       ctypes.c_int]  # fmt: skip
        if fn(flat, len(ranges), final_offset, raw, len(late), int(follow)) < 0:
            raise HookError(
                "cannot restore the region up to SAVE's final offset",
                found=final_offset,
                expected=f"see the hook's events: {self.events()[-3:]}",
            )

    def counter(self, name: str) -> int:
        value = ctypes.c_uint64()
        self._check(self.lib.foundry_counter(name.encode(), ctypes.byref(value)), "foundry_counter")
        return value.value

    def counters(self) -> dict[str, int]:
        return {name: self.counter(name) for name in COUNTERS}

    def image_count(self) -> int:
        count = ctypes.c_size_t()
        self._check(self.lib.foundry_registry_count(ctypes.byref(count)), "foundry_registry_count")
        return count.value

    def image(self, index: int, *, hash: bool = False) -> Image:
        raw = _Image()
        self._check(self.lib.foundry_registry_entry(ctypes.c_size_t(index), int(hash), ctypes.byref(raw)),
                    "foundry_registry_entry")  # fmt: skip
        sha = bytes(raw.sha256).hex() if raw.hashed else None
        return Image(index, raw.handle, raw.size, IMAGE_KINDS.get(raw.kind, str(raw.kind)),
                     IMAGE_FORMATS.get(raw.format, "unknown"), bool(raw.copied), bool(raw.unloaded), sha)  # fmt: skip

    def images(self) -> list[Image]:
        return [self.image(i) for i in range(self.image_count())]

    def find_image(self, handle: int, kind: str) -> Image | None:
        """The loaded image behind a ``CUmodule`` (kind ``module``) or ``CUlibrary`` handle."""
        index = ctypes.c_size_t()
        code = {"module": 1, "library": 2}[kind]
        status = self.lib.foundry_registry_find(ctypes.c_uint64(handle), code, ctypes.byref(index))
        return None if status < 0 else self.image(index.value, hash=True)

    def cache_config(self, handle: int) -> int:
        """The ``CUfunc_cache`` the program last set on a ``CUfunction`` or ``CUkernel``
        handle (0, ``CU_FUNC_CACHE_PREFER_NONE``, when it set none): the driver cannot say."""
        config = ctypes.c_int32()
        self._check(self.lib.foundry_cache_config(ctypes.c_uint64(handle), ctypes.byref(config)),
                    "foundry_cache_config")  # fmt: skip
        return config.value

    def image_bytes(self, image: Image) -> bytes:
        buf = ctypes.create_string_buffer(image.size)
        self._check(self.lib.foundry_registry_copy(ctypes.c_size_t(image.index), buf, image.size),
                    "foundry_registry_copy")  # fmt: skip
        return buf.raw

    @contextlib.contextmanager
    def passthrough(self) -> Iterator[None]:
        """Captures inside are the program's own, not persisted: they neither end the
        warm-up nor are refused by a LOAD (counted as ``passthrough_captures``)."""
        self._check(self.lib.foundry_region_passthrough(1), "foundry_region_passthrough")
        try:
            yield
        finally:
            self._check(self.lib.foundry_region_passthrough(0), "foundry_region_passthrough")

    def seal(self) -> None:
        """SAVE once the archive is written, LOAD once the session finished: later
        allocations are the program's own (a server's requests), neither late nor compared."""
        self._check(self.lib.foundry_region_seal(), "foundry_region_seal")

    def import_zone(self) -> tuple[int, int, int]:
        """``(base, slot size, slots)`` of this process's import zone: peer rank r's
        region offset o maps at base + r * slot size + o."""
        base, slot, slots = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint32()
        self._check(self.lib.foundry_ipc_zone(ctypes.byref(base), ctypes.byref(slot), ctypes.byref(slots)),
                    "foundry_ipc_zone")  # fmt: skip
        return base.value, slot.value, slots.value

    def events(self) -> list[str]:
        needed = ctypes.c_size_t()
        self.lib.foundry_events(None, 0, ctypes.byref(needed))
        buf = ctypes.create_string_buffer(needed.value)
        self.lib.foundry_events(buf, needed.value, ctypes.byref(needed))
        return [line for line in buf.value.decode(errors="replace").splitlines() if line]

    def trace_diverges(self, expected: list[Allocation], actual: list[Allocation]) -> int | None:
        """The first index where ``actual`` leaves ``expected`` (None: a prefix of it)."""
        fn = self.lib.foundry_trace_diverges
        fn.restype = ctypes.c_longlong
        raw_e = (_Alloc * max(len(expected), 1))(*(a.raw() for a in expected))
        raw_a = (_Alloc * max(len(actual), 1))(*(a.raw() for a in actual))
        index = fn(raw_e, ctypes.c_size_t(len(expected)), raw_a, ctypes.c_size_t(len(actual)))
        return None if index < 0 else index

    @staticmethod
    def _check(status: int, call: str) -> None:
        if status < 0:
            raise HookError(f"{call} failed with status {status}")

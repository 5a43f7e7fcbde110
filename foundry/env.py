"""The ``FOUNDRY_*`` environment: what ``foundry run`` tells the program it starts.

Every variable is listed once, in :data:`VARIABLES`: its name, its type, its default,
who reads it and what it means. :class:`RunEnvironment` holds their values;
:meth:`RunEnvironment.to_env` writes them (the launcher,
:func:`foundry.runtime.launch.launcher.environment`) and
:meth:`RunEnvironment.from_env` reads them back (the sessions, the engine plugins).
Code that needs a single variable reads it with :meth:`Variable.read`. The native
hook reads its variables under the same names, from ``native/include/foundry_env.h``.
``tests/test_env.py`` starts a real child through the launcher and checks, for
every variable, what each side parsed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from foundry.errors import FoundryError

MODES = ("off", "save", "load")
WARMUP_MODES = ("replay", "restore")  # LOAD: repeat the warm-up, or restore the bytes it left
BUILDERS = ("python", "native")  # LOAD: cuda-bindings node by node, or the hook's builder (and launch plans)
INSTANTIATE_MODES = ("now", "background")  # LOAD, native builder: background instantiates behind the program
THREAD_POLICIES = ("owner", "any")  # which threads may allocate in the region


class Kind(StrEnum):
    """How a variable's text is read."""

    CHOICE = "choice"  # one of a few words
    COUNT = "count"  # a decimal number, 0 or more
    NUMBER = "number"  # an integer in any base Python's int(text, 0) reads (addresses in hex)
    FLAG = "flag"  # on when it holds exactly its `on` word, off otherwise
    PATH = "path"  # a file or directory; empty means none
    TEXT = "text"  # free text; empty means none
    PADDING = "padding"  # only its length counts


class Written(StrEnum):
    """When the launcher writes a variable into the child's environment."""

    ALWAYS = "always"  # every run says it, defaults included
    GIVEN = "given"  # when it has a value; otherwise the child inherits the launcher's own
    PER_RUN = "per-run"  # when it has a value; otherwise removed, never inherited


class Reader(StrEnum):
    """Who reads a variable."""

    SESSION = "session"  # the SAVE/LOAD sessions (open_session, load_options, SaveSession)
    SGLANG = "sglang"  # the SGLang plugin (foundry.integrations.sglang)
    VLLM = "vllm"  # the vLLM plugin (foundry.integrations.vllm)
    HOOK = "hook"  # the native hook (native/include/foundry_env.h)
    LAUNCHER = "launcher"  # `foundry run` itself, and the launchers of a SAVE's later runs


@dataclass(frozen=True)
class Variable:
    """One ``FOUNDRY_*`` variable: its name, how its text is read and written, its
    default, who reads it and what it means."""

    name: str
    kind: Kind
    default: Any
    readers: frozenset[Reader]
    meaning: str
    written: Written = Written.GIVEN
    choices: tuple[str, ...] = ()
    what: str = ""  # CHOICE: what an unknown word is ("warm-up mode"); COUNT: what the number must be
    on: str = "1"  # FLAG: the word that turns it on
    in_hex: bool = False  # NUMBER: written in hex

    def read(self, environ: Mapping[str, str] | None = None) -> Any:
        """This variable's value in ``environ`` (default: this process's environment);
        :class:`FoundryError` naming the variable when its text is not of its kind."""
        text = (os.environ if environ is None else environ).get(self.name, "")
        return self.parse(text)

    def parse(self, text: str) -> Any:
        """The value ``text`` means ("" when the variable is absent)."""
        if self.kind is Kind.FLAG:
            return text == self.on
        if self.kind is Kind.PADDING:
            return len(text)
        if not text:
            return self.default
        if self.kind is Kind.CHOICE:
            if text not in self.choices:
                raise FoundryError(f"unknown {self.what}", field=self.name, expected=self.choices, found=text)
            return text
        if self.kind is Kind.COUNT:
            if not text.isdigit():
                raise FoundryError(f"{self.name} must be {self.what}", field=self.name, found=text)
            return int(text)
        if self.kind is Kind.NUMBER:
            try:
                return int(text, 0)
            except ValueError:
                raise FoundryError("not a number", field=self.name, found=text) from None
        return Path(text) if self.kind is Kind.PATH else text

    def format(self, value: Any) -> str:
        """The text that :meth:`parse` reads back as ``value``."""
        if self.kind is Kind.FLAG:
            return self.on if value else "0"
        if self.kind is Kind.PADDING:
            return "." * value
        if self.kind is Kind.NUMBER:
            return hex(value) if self.in_hex else str(value)
        return str(value)

    def check(self, value: Any) -> None:
        """Refuse a value this variable cannot carry (one :meth:`parse` would not give)."""
        if value is None and self.default is None:
            return
        wanted = {Kind.CHOICE: str, Kind.COUNT: int, Kind.NUMBER: int, Kind.FLAG: bool, Kind.PATH: Path,
                  Kind.TEXT: str, Kind.PADDING: int}[self.kind]  # fmt: skip
        bad = not isinstance(value, wanted) or (self.kind is Kind.CHOICE and value not in self.choices)
        if bad or (self.kind in (Kind.COUNT, Kind.PADDING) and value < 0) or (self.kind is Kind.TEXT and not value):
            raise FoundryError(f"{self.name} cannot be {value!r}", field=self.name, expected=self.choices or None)


# fmt: off
_S, _G, _V, _H, _L = Reader.SESSION, Reader.SGLANG, Reader.VLLM, Reader.HOOK, Reader.LAUNCHER

MODE = Variable("FOUNDRY_MODE", Kind.CHOICE, "off", frozenset({_S, _G, _V, _H}),
                "off: capture as usual; save: persist the program's graphs; load: restore them",
                Written.ALWAYS, MODES, "mode")
ARCHIVE = Variable("FOUNDRY_ARCHIVE", Kind.PATH, None, frozenset({_S, _G, _V}),
                   "the archive a SAVE writes or a LOAD reads", Written.ALWAYS)
RANK = Variable("FOUNDRY_RANK", Kind.COUNT, 0, frozenset({_S, _H}),
                "this process's rank: its part of the archive, its slot in its peers' import zones",
                Written.ALWAYS, what="a rank number")
WORLD_SIZE = Variable("FOUNDRY_WORLD_SIZE", Kind.COUNT, 1, frozenset({_S}),
                      "SAVE: how many ranks the archive holds, one process each", Written.ALWAYS,
                      what="a number")
LOAD_WARMUP = Variable("FOUNDRY_LOAD_WARMUP", Kind.CHOICE, "replay", frozenset({_S, _G, _V}),
                       "LOAD: replay the program's warm-up, or restore the bytes SAVE's warm-up left",
                       Written.ALWAYS, WARMUP_MODES, "warm-up mode")
BUILDER = Variable("FOUNDRY_BUILDER", Kind.CHOICE, "python", frozenset({_S}),
                   "LOAD: build graphs through cuda-bindings, or with the hook's native builder",
                   Written.ALWAYS, BUILDERS, "graph builder")
BUILD_THREADS = Variable("FOUNDRY_BUILD_THREADS", Kind.COUNT, 1, frozenset({_S}),
                         "LOAD, native builder: threads that build (and instantiate) graphs", Written.ALWAYS,
                         what="a number")
INSTANTIATE = Variable("FOUNDRY_INSTANTIATE", Kind.CHOICE, "now", frozenset({_S}),
                       "LOAD, native builder: instantiate before the first graph() returns, or on a thread "
                       "behind the program", Written.ALWAYS, INSTANTIATE_MODES, "instantiation mode")
RELOCATE = Variable("FOUNDRY_RELOCATE", Kind.FLAG, False, frozenset({_S}),
                    "LOAD: the region lies at another base than SAVE's and every operand is rebased",
                    Written.ALWAYS)
OVERWRITE = Variable("FOUNDRY_OVERWRITE", Kind.FLAG, False, frozenset({_S, _G, _V}),
                     "SAVE: replace an archive already at the path", Written.ALWAYS)
SAVE_ID = Variable("FOUNDRY_SAVE_ID", Kind.TEXT, None, frozenset({_S, _G, _L}),
                   "SAVE of several ranks: the id every rank's process shares (1-64 of A-Z a-z 0-9 . _ -)")
SAVE_FIRST_RUN = Variable("FOUNDRY_SAVE_FIRST_RUN", Kind.PATH, None, frozenset({_G, _V}),
                          "SAVE runs after the first: the first run's archive (sizes not to profile again)",
                          Written.PER_RUN)
LAYOUT_PAD = Variable("FOUNDRY_LAYOUT_PAD", Kind.PADDING, 0, frozenset(),
                      "SAVE runs after the first: padding that moves the stack and heap; nothing reads it",
                      Written.PER_RUN)
REGION_BASE = Variable("FOUNDRY_REGION_BASE", Kind.NUMBER, None, frozenset({_G, _V, _H}),
                       "the deterministic region's base address (the hook's default: 0x600000000000)",
                       in_hex=True)
REGION_SIZE = Variable("FOUNDRY_REGION_SIZE", Kind.NUMBER, None, frozenset({_G, _V, _H}),
                       "the deterministic region's size in bytes (the hook's default: 64 GiB)")
REGION_THREADS = Variable("FOUNDRY_REGION_THREADS", Kind.CHOICE, "owner", frozenset({_H}),
                          "which threads may allocate in the region: the owner, or any",
                          Written.ALWAYS, THREAD_POLICIES, "region threads policy")
HOOK_ECHO = Variable("FOUNDRY_HOOK_ECHO", Kind.FLAG, False, frozenset({_H}),
                     "the hook also writes its errors to stderr, for processes no session reads",
                     Written.ALWAYS)
HOOK_SYMBOLS = Variable("FOUNDRY_HOOK_SYMBOLS", Kind.FLAG, False, frozenset({_H}),
                        "the hook logs every name resolved through cuGetProcAddress")
LOAD_CAPTURES = Variable("FOUNDRY_LOAD_CAPTURES", Kind.FLAG, False, frozenset({_H}),
                         "LOAD: the program captures graphs of its own on purpose (the hook refuses them "
                         "otherwise)", on="allow")
IMPORT_BASE = Variable("FOUNDRY_IMPORT_BASE", Kind.NUMBER, None, frozenset({_H}),
                       "the base of the zone peers' region memory is mapped at (the hook's default: "
                       "0x700000000000)", in_hex=True)
JIT_ROOT = Variable("FOUNDRY_JIT_ROOT", Kind.PATH, None, frozenset({_L}),
                    "where archives' JIT caches are installed, one directory each (default: "
                    "$XDG_CACHE_HOME/foundry/jit, else ~/.cache/foundry/jit)")
HOOK_LIB = Variable("FOUNDRY_HOOK_LIB", Kind.PATH, None, frozenset({_L}),
                    "the built hook library, where it is neither in the package nor in the source tree")
SGLANG_CONFIG = Variable("FOUNDRY_SGLANG_CONFIG", Kind.PATH, None, frozenset({_G}),
                         "without `foundry run`: the SGLang plugin's TOML configuration")
SGLANG_REPORT = Variable("FOUNDRY_SGLANG_REPORT", Kind.PATH, None, frozenset({_G}),
                         "where the SGLang plugin writes its session's report (JSON)")
SESSION_MARKER = Variable("FOUNDRY_SESSION_MARKER", Kind.PATH, None, frozenset({_S, _H}),
                          "a file every SAVE or LOAD session writes when the program opens it, so `foundry run` "
                          "can tell a program that never opened one (a LOAD without a session fails)",
                          Written.PER_RUN)
SESSION_PID = Variable("FOUNDRY_SESSION_PID", Kind.COUNT, None, frozenset({_H}),
                       "a LOAD: the process `foundry run` became; its hook fails the program's exit 0 when no "
                       "session wrote the marker (the hook removes the marker then)", Written.PER_RUN,
                       what="a process id")
SGLANG_GC = Variable("FOUNDRY_SGLANG_GC", Kind.CHOICE, "skip", frozenset({_G}),
                     "a LOAD restoring the warm-ups' bytes: leave out SGLang's garbage collections around its "
                     "capture loop, keeping the one before it where the loop makes SAVE's allocations again "
                     "(skip), leave out both there too (skip-all), or keep them (keep)", Written.GIVEN,
                     ("skip", "skip-all", "keep"), "collection choice")
VLLM_CONFIG = Variable("FOUNDRY_VLLM_CONFIG", Kind.PATH, None, frozenset({_V}),
                       "without `foundry run`: the vLLM plugin's TOML configuration")
VLLM_REPORT = Variable("FOUNDRY_VLLM_REPORT", Kind.PATH, None, frozenset({_V}),
                       "where the vLLM plugin writes its worker's report (JSON)")
SAVE_REPLAY = Variable("FOUNDRY_SAVE_REPLAY", Kind.CHOICE, "captured", frozenset({_S}),
                       "SAVE: the program replays the graphs it captured, or the same graphs rebuilt from "
                       "their IR in its process, as a LOAD builds them (tells a graph's speed apart from its "
                       "process's; the archive is the same)", Written.GIVEN, ("captured", "rebuilt"),
                       "replay choice")
# fmt: on

#: Every variable, by the :class:`RunEnvironment` field that holds its value.
VARIABLES: dict[str, Variable] = {
    "mode": MODE,
    "archive": ARCHIVE,
    "rank": RANK,
    "world_size": WORLD_SIZE,
    "load_warmup": LOAD_WARMUP,
    "builder": BUILDER,
    "build_threads": BUILD_THREADS,
    "instantiate": INSTANTIATE,
    "relocate": RELOCATE,
    "overwrite": OVERWRITE,
    "save_id": SAVE_ID,
    "save_first_run": SAVE_FIRST_RUN,
    "layout_pad": LAYOUT_PAD,
    "region_base": REGION_BASE,
    "region_size": REGION_SIZE,
    "region_threads": REGION_THREADS,
    "hook_echo": HOOK_ECHO,
    "hook_symbols": HOOK_SYMBOLS,
    "load_captures": LOAD_CAPTURES,
    "import_base": IMPORT_BASE,
    "jit_root": JIT_ROOT,
    "hook_lib": HOOK_LIB,
    "sglang_config": SGLANG_CONFIG,
    "sglang_report": SGLANG_REPORT,
    "session_marker": SESSION_MARKER,
    "session_pid": SESSION_PID,
    "sglang_gc": SGLANG_GC,
    "vllm_config": VLLM_CONFIG,
    "vllm_report": VLLM_REPORT,
    "save_replay": SAVE_REPLAY,
}


@dataclass(frozen=True)
class RunEnvironment:
    """The values of every ``FOUNDRY_*`` variable (see :data:`VARIABLES` for each
    one's meaning); a field left at its default is not written unless its variable
    is written always."""

    mode: str = MODE.default
    archive: Path | None = ARCHIVE.default
    rank: int = RANK.default
    world_size: int = WORLD_SIZE.default
    load_warmup: str = LOAD_WARMUP.default
    builder: str = BUILDER.default
    build_threads: int = BUILD_THREADS.default
    instantiate: str = INSTANTIATE.default
    relocate: bool = RELOCATE.default
    overwrite: bool = OVERWRITE.default
    save_id: str | None = SAVE_ID.default
    save_first_run: Path | None = SAVE_FIRST_RUN.default
    layout_pad: int = LAYOUT_PAD.default
    region_base: int | None = REGION_BASE.default
    region_size: int | None = REGION_SIZE.default
    region_threads: str = REGION_THREADS.default
    hook_echo: bool = HOOK_ECHO.default
    hook_symbols: bool = HOOK_SYMBOLS.default
    load_captures: bool = LOAD_CAPTURES.default
    import_base: int | None = IMPORT_BASE.default
    jit_root: Path | None = JIT_ROOT.default
    hook_lib: Path | None = HOOK_LIB.default
    sglang_config: Path | None = SGLANG_CONFIG.default
    sglang_report: Path | None = SGLANG_REPORT.default
    session_marker: Path | None = SESSION_MARKER.default
    session_pid: int | None = SESSION_PID.default
    sglang_gc: str = SGLANG_GC.default
    vllm_config: Path | None = VLLM_CONFIG.default
    vllm_report: Path | None = VLLM_REPORT.default
    save_replay: str = SAVE_REPLAY.default

    def __post_init__(self) -> None:
        for field, variable in VARIABLES.items():
            variable.check(getattr(self, field))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RunEnvironment:
        """Every variable read from ``environ`` (default: this process's environment);
        :class:`FoundryError` naming the first one that does not parse."""
        env = os.environ if environ is None else environ
        return cls(**{field: variable.read(env) for field, variable in VARIABLES.items()})

    def to_env(self) -> dict[str, str]:
        """The variables to set: every one written always, and every other one that has a value."""
        out = {}
        for field, variable in VARIABLES.items():
            value = getattr(self, field)
            if value is not None and (variable.written is Written.ALWAYS or value != variable.default):
                out[variable.name] = variable.format(value)
        return out

    def apply(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` (the launcher's own environment) with these variables set and the
        per-run ones this run does not set removed."""
        written = self.to_env()
        env = {k: v for k, v in base.items() if k in written or k not in _PER_RUN}
        env.update(written)
        return env


_PER_RUN = frozenset(v.name for v in VARIABLES.values() if v.written is Written.PER_RUN)


def launched(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``foundry run`` (or a program acting for it) configured this process:
    ``FOUNDRY_MODE`` is set."""
    return bool((os.environ if environ is None else environ).get(MODE.name))

"""The JIT caches a serving engine and its kernel libraries fill, as Foundry knows them.

For each cache: the variable Foundry points at a directory of its own, every variable
the library reads to find its directory (and how it reads them, so a setting of the
user's can be resolved as the library would), which of its files are final artefacts
(what a later process reads instead of compiling: no temporary directories, lock
files or build logs) and which are host code (what a process would execute or
unpickle: shared objects, Python, pickles, build scripts). Sources read, for SGLang
0.5.17 and its libraries, are listed in ``docs/sglang.md`` ("Fresh machines and
JIT-built kernels").

Two of the caches are ninja build directories (FlashInfer's JIT modules, torch's C++
extensions): their libraries run ninja on every load, and ninja rebuilds a module
whose object files, ``.ninja_log`` or ``.ninja_deps`` are missing or older than its
inputs. For them the build state is the artefact, object files included, and all of it
is host code (ninja runs what ``build.ninja`` says).
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path


class Cache(StrEnum):
    """A JIT cache Foundry carries in an archive."""

    TRITON = "triton"
    INDUCTOR = "inductor"
    FLASHINFER = "flashinfer"
    TVM_FFI = "tvm-ffi"
    SGLANG = "sglang"
    DEEP_GEMM = "deep-gemm"
    TORCH_EXTENSIONS = "torch-extensions"
    CUDA = "cuda"
    VLLM = "vllm"


@dataclass(frozen=True)
class Resolved:
    """Where a library keeps its cache in an environment, and which variable decided it
    (``"default"`` when none did)."""

    path: Path | None  # None: the variable is set but empty (the library's own behaviour then varies)
    by: str


def home(environ: Mapping[str, str]) -> Path:
    """``~`` as ``os.path.expanduser`` reads it: ``HOME`` (``/`` when empty), else the password database."""
    if "HOME" in environ:
        return Path(environ["HOME"] or "/")
    try:
        return Path(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:
        return Path("/")


def _expand(text: str, environ: Mapping[str, str]) -> Path:
    """``Path(text).expanduser()`` with ``~`` read from ``environ``."""
    if text == "~" or text.startswith("~/"):
        return home(environ) / text[2:]
    return Path(text)


def _tempdir(environ: Mapping[str, str]) -> Path:
    """``tempfile.gettempdir()``: the first of TMPDIR, TEMP, TMP that is a directory, else /tmp."""
    for name in ("TMPDIR", "TEMP", "TMP"):
        value = environ.get(name)
        if value and Path(value).is_dir():
            return Path(value)
    return Path("/tmp")


def _user(environ: Mapping[str, str]) -> str:
    """``getpass.getuser()``: LOGNAME, USER, LNAME, USERNAME, else the password database."""
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        if environ.get(name):
            return environ[name]
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def xdg_cache_home(environ: Mapping[str, str]) -> Path:
    """``$XDG_CACHE_HOME``, else ``~/.cache`` (the XDG base-directory rule torch's appdirs follows)."""
    value = environ.get("XDG_CACHE_HOME")
    return Path(value) if value else home(environ) / ".cache"


def _from(variable: str, default: Callable[[Mapping[str, str]], Path],
          expand: bool = True) -> Callable[[Mapping[str, str]], Resolved]:  # fmt: skip
    """A resolution: ``variable`` when set (``~`` expanded when the library expands it), else ``default``."""

    def resolve(environ: Mapping[str, str]) -> Resolved:
        if variable not in environ:
            return Resolved(default(environ), "default")
        value = environ[variable]
        if not value:
            return Resolved(None, variable)
        return Resolved(_expand(value, environ) if expand else Path(value), variable)

    return resolve


def _triton(environ: Mapping[str, str]) -> Resolved:
    """triton/knobs.py (3.7): ``TRITON_CACHE_DIR``, else ``$TRITON_HOME/.triton/cache``, ``TRITON_HOME``
    defaulting to ``~``."""
    if "TRITON_CACHE_DIR" in environ:
        value = environ["TRITON_CACHE_DIR"]
        return Resolved(Path(value) if value else None, "TRITON_CACHE_DIR")
    if environ.get("TRITON_HOME"):
        return Resolved(Path(environ["TRITON_HOME"]) / ".triton" / "cache", "TRITON_HOME")
    return Resolved(home(environ) / ".triton" / "cache", "default")


def _torch_extensions(environ: Mapping[str, str]) -> Resolved:
    """torch/utils/cpp_extension.py: ``TORCH_EXTENSIONS_DIR``, else appdirs' user cache
    (``$XDG_CACHE_HOME``, else ``~/.cache``) ``/torch_extensions``, its real path."""
    if "TORCH_EXTENSIONS_DIR" in environ:
        value = environ["TORCH_EXTENSIONS_DIR"]
        return Resolved(Path(value) if value else None, "TORCH_EXTENSIONS_DIR")
    by = "XDG_CACHE_HOME" if environ.get("XDG_CACHE_HOME") else "default"
    return Resolved(Path(os.path.realpath(xdg_cache_home(environ) / "torch_extensions")), by)


def _flashinfer(environ: Mapping[str, str]) -> Resolved:
    """flashinfer/jit/env.py (0.6.15): ``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer``, the base
    defaulting to ``Path.home()``."""
    if "FLASHINFER_WORKSPACE_BASE" in environ:
        return Resolved(Path(environ["FLASHINFER_WORKSPACE_BASE"] or ".") / ".cache" / "flashinfer",
                        "FLASHINFER_WORKSPACE_BASE")  # fmt: skip
    return Resolved(home(environ) / ".cache" / "flashinfer", "default")


def _vllm(environ: Mapping[str, str]) -> Resolved:
    """vllm/envs.py (0.25.1): ``VLLM_CACHE_ROOT``, else ``$XDG_CACHE_HOME/vllm``, that defaulting to
    ``~/.cache``; ``~`` expanded in either. vLLM keeps torch.compile's cache there, and points
    Inductor's and Triton's inside it in each worker (``InductorAdaptor.initialize_cache``)."""
    for name in ("VLLM_CACHE_ROOT", "XDG_CACHE_HOME"):
        if name in environ:
            value = environ[name]  # an empty one makes vLLM's directory relative to the working directory
            if not value:
                return Resolved(None, name)
            path = _expand(value, environ)
            return Resolved(path if name == "VLLM_CACHE_ROOT" else path / "vllm", name)
    return Resolved(home(environ) / ".cache" / "vllm", "default")


@dataclass(frozen=True)
class CacheSpec:
    """One cache: who fills it, the variable Foundry sets, and how the library resolves its directory."""

    cache: Cache
    library: str
    variable: str  # what Foundry points at a directory of its own
    reads: tuple[str, ...]  # every variable the library's resolution reads
    resolve: Callable[[Mapping[str, str]], Resolved]
    subdir: tuple[str, ...] = ()  # where the library keeps its files below the variable's directory
    ninja: bool = False  # a ninja build directory: the build state is the artefact, all of it host code
    device_only: bool = False  # read by the CUDA driver only: device code, never host code

    def root(self, directory: Path) -> Path:
        """Where the library keeps its files when :attr:`variable` is ``directory``."""
        return directory.joinpath(*self.subdir)


# fmt: off
SPECS: dict[Cache, CacheSpec] = {spec.cache: spec for spec in (
    CacheSpec(Cache.TRITON, "Triton", "TRITON_CACHE_DIR", ("TRITON_CACHE_DIR", "TRITON_HOME", "HOME"), _triton),
    CacheSpec(Cache.INDUCTOR, "torch Inductor", "TORCHINDUCTOR_CACHE_DIR",
              ("TORCHINDUCTOR_CACHE_DIR", "TMPDIR", "TEMP", "TMP", "LOGNAME", "USER"),
              _from("TORCHINDUCTOR_CACHE_DIR", lambda e: _tempdir(e) / f"torchinductor_{_user(e)}", expand=False)),
    CacheSpec(Cache.FLASHINFER, "FlashInfer", "FLASHINFER_WORKSPACE_BASE", ("FLASHINFER_WORKSPACE_BASE", "HOME"),
              _flashinfer, subdir=(".cache", "flashinfer"), ninja=True),
    CacheSpec(Cache.TVM_FFI, "tvm-ffi", "TVM_FFI_CACHE_DIR", ("TVM_FFI_CACHE_DIR", "HOME"),
              _from("TVM_FFI_CACHE_DIR", lambda e: home(e) / ".cache" / "tvm-ffi")),
    CacheSpec(Cache.SGLANG, "SGLang", "SGLANG_CACHE_DIR", ("SGLANG_CACHE_DIR", "HOME"),
              _from("SGLANG_CACHE_DIR", lambda e: home(e) / ".cache" / "sglang", expand=False)),
    CacheSpec(Cache.DEEP_GEMM, "DeepGEMM (through SGLang)", "SGLANG_DG_CACHE_DIR", ("SGLANG_DG_CACHE_DIR", "HOME"),
              _from("SGLANG_DG_CACHE_DIR", lambda e: home(e) / ".cache" / "deep_gemm", expand=False)),
    CacheSpec(Cache.TORCH_EXTENSIONS, "torch C++ extensions", "TORCH_EXTENSIONS_DIR",
              ("TORCH_EXTENSIONS_DIR", "XDG_CACHE_HOME", "HOME"),
              _torch_extensions, ninja=True),
    CacheSpec(Cache.CUDA, "the CUDA driver", "CUDA_CACHE_PATH", ("CUDA_CACHE_PATH", "HOME"),
              _from("CUDA_CACHE_PATH", lambda e: home(e) / ".nv" / "ComputeCache", expand=False),
              device_only=True),
    CacheSpec(Cache.VLLM, "vLLM", "VLLM_CACHE_ROOT", ("VLLM_CACHE_ROOT", "XDG_CACHE_HOME", "HOME"), _vllm),
)}
# fmt: on

#: Every variable any cache's resolution reads, for the benchmark's fresh nodes and for tests.
READ_VARIABLES = tuple(dict.fromkeys(name for spec in SPECS.values() for name in spec.reads))


def cache_environment(directory: Path) -> dict[str, str]:
    """The variables that point every cache at its own directory under ``directory``
    (``directory/<cache>``)."""
    return {spec.variable: str(directory / spec.cache.value) for spec in SPECS.values()}


def user_settings(environ: Mapping[str, str]) -> list[tuple[CacheSpec, Resolved]]:
    """The caches whose directory a cache setting of the user's decides (not the library's
    default from ``HOME`` or the temporary directory), with where the library would put them."""
    resolved = [(spec, spec.resolve(environ)) for spec in SPECS.values()]
    return [(spec, where) for spec, where in resolved if where.by != "default"]


# -- which files count ----------------------------------------------------------------

_NOT_ARTEFACT_SUFFIXES = (".lock", ".log", ".tmp", ".d")
_OBJECT_SUFFIXES = (".o", ".obj")
# files whose name says they are data a library parses (metadata, device code, IR it reads back)
DATA_SUFFIXES = (".json", ".cubin", ".ptx", ".ttir", ".ttgir", ".llir", ".source", ".best_config", ".fatbin")
HOST_SUFFIXES = (".so", ".py", ".pyc", ".pkl", ".pickle", ".o", ".a", ".sh")
EM_CUDA = 190  # ELF e_machine of CUDA device code (cubins)
SNIFF_BYTES = 20  # enough of a file's head to tell ELF machine, pickle, script


def is_bookkeeping(relative: str) -> bool:
    """Whether the file at ``relative`` (POSIX, below a cache's root) is one a library
    writes around its builds rather than builds: anything in a temporary directory
    (Triton's ``tmp.pid_*``, FlashInfer's ``tmp``), locks, logs and dependency files."""
    *dirs, name = relative.split("/")
    temporary = any(d == "tmp" or d.startswith("tmp.") for d in dirs)
    return temporary or name == "lock" or name.endswith(_NOT_ARTEFACT_SUFFIXES)


def is_artefact(spec: CacheSpec, relative: str) -> bool:
    """Whether the file at ``relative`` (POSIX, below the cache's root) is a final artefact:
    what a later process reads instead of compiling. Bookkeeping never is; object files
    only in ninja build directories; tvm-ffi's only its shared objects (SGLang loads a
    built module by its ``.so`` alone)."""
    if is_bookkeeping(relative):
        return False
    name = relative.rsplit("/", 1)[-1]
    if spec.cache is Cache.TVM_FFI:
        return name.endswith(".so")
    return spec.ninja or not name.endswith(_OBJECT_SUFFIXES)


def made_on_first_use(spec: CacheSpec, artefacts: Iterable[str]) -> set[str]:
    """The empty files a library makes beside builds it finds (``relative`` paths, POSIX,
    below the cache's root), which SAVE leaves out as bookkeeping: FlashInfer 0.6.15's lock
    per JIT module (``<workspace>/cached_ops/tmp/<module>.lock``, taken by its ``FileLock``
    around every load, ``flashinfer/jit/core.py:268-269,313``) and its logger's file
    (``<workspace>/flashinfer_jit.log``, created empty at import when missing, ``core.py:47-52``).
    An install lays them down empty, so that a program which compiles nothing adds no file."""
    if spec.cache is not Cache.FLASHINFER:
        return set()
    made = set()
    for relative in artefacts:
        parts = relative.split("/")  # <version>/<arch>/cached_ops/<module>/<file>
        if len(parts) >= 5 and parts[2] == "cached_ops" and parts[3] != "tmp":
            workspace = "/".join(parts[:2])
            made |= {f"{workspace}/cached_ops/tmp/{parts[3]}.lock", f"{workspace}/flashinfer_jit.log"}
    return made


def host_code_by_name(spec: CacheSpec, relative: str) -> bool:
    """Whether a file is host code by its cache and name alone: everything in a ninja
    build directory, known host suffixes, and any name not known as data (fail closed),
    except in the driver's cache."""
    if spec.ninja or relative.endswith(HOST_SUFFIXES):
        return True
    return not spec.device_only and not relative.endswith(DATA_SUFFIXES)


def host_code_by_content(head: bytes) -> bool:
    """Whether a file's first bytes say host code: an ELF object for a CPU (a cubin's
    machine is CUDA's), a pickle (protocol 2 and later start with 0x80), a script."""
    if head.startswith(b"\x7fELF"):
        if len(head) < SNIFF_BYTES:
            return True
        order = "little" if head[5] == 1 else "big"
        return int.from_bytes(head[18:20], order) != EM_CUDA
    return (len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5) or head.startswith(b"#!")


def is_host_code(spec: CacheSpec, relative: str, head: bytes) -> bool:
    """Whether a process would execute or unpickle this file: by name, or by content."""
    return host_code_by_name(spec, relative) or host_code_by_content(head)

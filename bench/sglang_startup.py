"""SGLang start-up, plain vs Foundry LOAD, on fresh and warm nodes (run on a GPU machine).

    python bench/sglang_startup.py save    --work DIR [--preset qwen3-8b]
    python bench/sglang_startup.py pairs   --work DIR --kind warm|fresh|import --pairs N [--discard] [--build-threads T]
    python bench/sglang_startup.py summary --work DIR [--build-threads T] [RESULTS.jsonl ...]

``save`` makes the archive LOADs restore (``DIR/archive``; the SGLang recipe's preset
at SGLang's default decode graph set), JIT caches included (a priming run first, the
caches under ``DIR/jit-root``, ``FOUNDRY_JIT_ROOT``). ``pairs`` runs N pairs of plain SGLang and
Foundry LOAD (``--warmup restore --builder native --instantiate background
--trust-cached-code``: the archive is the benchmark's own),
alternating (plain first in odd pairs, LOAD first in even ones: ``first`` in each
line), each run in a fresh process, and appends one JSON line per run to
``DIR/results.jsonl`` (its wall time, and ``cpu_s``: the CPU seconds of its process
tree, less sensitive to a busy machine); ``--discard`` runs one plain start first
and keeps it out of the figures. Before each run the file system's unwritten data is
flushed (``sync``; ``sync_s`` says how long that took), so that what one run wrote
(a fresh plain run builds hundreds of files) is not written out during the next.
``--build-threads T`` has the fresh and warm LOADs build their graphs on T threads
(each LOAD's line records it; ``summary --build-threads T`` takes the pairs whose
LOAD did, default 1). A call may run a subset (one device call lasts
at most ten minutes) and later calls append: ``summary`` merges every results file
it is given (by default DIR's) and prints medians, spreads (min-max) and median paired
differences (LOAD minus plain) of: seconds to ready, to the first answer, before
the scheduler starts (ready minus ``scheduler_e2e``), ``scheduler_e2e``, SGLang's
graph phase, and Foundry's share (the plugin's time on the scheduler's critical
path, instantiation waits included).

Kinds:

- ``warm``: every run shares one set of JIT caches under DIR; the first call's
  first plain start fills them and is not counted (as ``--discard`` does: SAVE's
  runs fill the archive's caches, not these), and ``summary`` leaves out any warm
  pair whose plain run still started a compiler, not counting build tools (it was not warm);
- ``fresh``: every run gets a new empty ``HOME``, ``XDG_CACHE_HOME`` and ``TMPDIR``
  with every JIT cache variable unset, so nothing compiled before is found, and
  ``DIR/jit-root`` (where a LOAD installs the archive's caches) is emptied first: a
  fresh node has nothing installed, at the path SAVE's caches were built under
  (FlashInfer's ninja files name it). The
  run lists the files it created outside those directories (there must be none:
  ``outside``) and those the libraries left in the fresh ``HOME`` and
  ``XDG_CACHE_HOME``, their default cache places (``new_in_home``: a LOAD points
  every cache elsewhere);
- ``import``: ``python3 -c 'import torch, sglang.srt.entrypoints.engine'``
  plain and under ``foundry run --mode load --trust-cached-code``: Foundry's own
  start-up cost (the first call's first plain import is not counted: it may build
  Triton's helpers, as it did on the H200 test machine); each LOAD also records
  ``launcher_s``, the launcher's own figure from its start to the program's exec
  (its ``foundry: launcher: ...`` line), and ``hook_pre_cuda_ms``, the hook's own milliseconds
  before CUDA started (its ``foundry: hook: ...`` line at exit: constructors, and the
  lookup its ``dlsym`` does for each symbol asked, ``hook_lookups``). The program reads its clock at its first
  line and after the imports, so each run splits into ``to_program_s`` (from the
  benchmark's spawn to that first line: the interpreter's start, and a LOAD's
  launcher), ``imports_s`` and ``exit_s``; it also says how long ``import torch`` took
  (``torch_import_s``), its own CPU seconds in the imports (``imports_cpu_s``, which
  another process's load on the machine changes less than wall time), and whether they
  started CUDA or mapped ``libcuda.so`` (``cuda_initialized``, ``libcuda_mapped``). The program opens no session, so its
  LOAD exits 2 saying so (``no_session``): that refusal is the expected end of
  this run, and counts as one.

Every run records the compiler processes it saw (``compilers``: nvcc, ptxas, cicc,
gcc, ninja, ... polled every 20 ms) with their command lines and working directories
(``compiler_commands``), and every LOAD the files it added to or rewrote in the
caches it installed (``new_in_caches``: anything not the archive's entry at the
size and modification time the install gave it); ``summary`` counts apart the
locks, logs and temporaries among them (FlashInfer takes a lock and logs at each load
of a JIT module; the install lays both down empty, so a LOAD that compiled nothing
adds no file at all) from build outputs. Build tools (ninja, which FlashInfer and torch's extension loader run at each
load of a JIT module to find it up to date) are listed whenever the poll catches
them, and counted apart from compilers.

Byte code is compiled once (``save`` runs ``compileall`` over the installed
packages) so neither side pays it. Every LOAD's outputs are compared with the
plain run of its pair (the 16 prompts x 32 tokens of ``recipes/sglang/run.py``):
``identical`` in each result line. Each LOAD's line also holds the parts of Foundry's
share from its report (``foundry_parts``: the plugin's session opening, start, graphs
and finish, and the session's own steps in each).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from foundry.archive import Archive
from foundry.archive.jit_caches import is_bookkeeping
from foundry.archive.jit_install import changed_since_install, install_directory
from foundry.archive.jit_manifest import read_manifest
from foundry.archive.jit_schema import JitManifest
from foundry.errors import FoundryError

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "sglang" / "run.py"
FAST = ("--warmup", "restore", "--builder", "native", "--instantiate", "background", "--trust-cached-code")
CACHE_VARIABLES = ("TRITON_CACHE_DIR", "TRITON_HOME", "TORCHINDUCTOR_CACHE_DIR", "TVM_FFI_CACHE_DIR",
                   "FLASHINFER_WORKSPACE_BASE", "FLASHINFER_JIT_DIR", "CUDA_CACHE_PATH", "SGLANG_CACHE_DIR",
                   "SGLANG_DG_CACHE_DIR", "XDG_CACHE_HOME", "HF_HOME", "TORCH_EXTENSIONS_DIR", "PYTHONPYCACHEPREFIX",
                   "VLLM_CACHE_ROOT", "FOUNDRY_JIT_ROOT")  # fmt: skip
LAUNCHER_LINE = re.compile(r"^foundry: launcher: ([0-9.]+) s from its start to the program's exec(?: \((.*)\))?$", re.M)
HOOK_LINE = re.compile(r"^foundry: hook: ([0-9.]+) ms of its own before CUDA started \((\d+) symbol lookups", re.M)
COMPILERS = {"nvcc", "ptxas", "cicc", "fatbinary", "nvlink", "gcc", "g++", "cc", "c++", "cc1", "cc1plus", "ld",
             "ninja", "clang"}  # fmt: skip
# build tools that compile nothing when their outputs are current: FlashInfer runs ninja at every load of a
# JIT module, so a warm start runs it too (a 20 ms poll sees that short check only sometimes)
BUILD_TOOLS = {"ninja"}
# the program's own clock at its first line, after torch and after SGLang, its own CPU time in the imports,
# and whether they started CUDA (the hook does nothing until CUDA starts)
IMPORT = (
    "import time; t0, c0 = time.time(), time.process_time(); import torch; t1 = time.time(); "
    "import sglang.srt.entrypoints.engine; t2, c2 = time.time(), time.process_time(); "
    "print('imported', t0, t2, 'torch', t1 - t0, 'cpu', c2 - c0, 'cuda', int(torch.cuda.is_initialized()), "
    "int('libcuda.so' in open('/proc/self/maps').read()))"
)
IMPORTED_LINE = re.compile(
    r"^imported ([0-9.]+) ([0-9.]+)(?: torch ([0-9.]+) cpu ([0-9.]+) cuda ([01]) ([01]))?$", re.M
)
NO_SESSION = "never opened a LOAD session"  # how a LOAD of a program that opens none ends (exit 2)
# where a run could leave files outside its own directories; pseudo file systems and this benchmark's own left out
SCAN_PRUNE = ("/proc", "/sys", "/dev", "/run")


class CompilerWatch:
    """Polls /proc for compiler processes while a run lasts."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.commands: dict[str, str] = {}  # pid -> its command line (cut), for each compiler seen
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> CompilerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        while not self._stop.wait(0.02):
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit():
                    continue
                try:
                    name = Path(entry.path, "comm").read_text().strip()
                except OSError:
                    continue
                if name in COMPILERS and entry.name not in self.commands:
                    self.seen.add(name)
                    self.commands[entry.name] = command_line(entry.path, name)


def command_line(proc_dir: str, name: str) -> str:
    """A process's command line and working directory, cut to 300 characters (its name
    when it ended before they were read)."""
    try:
        argv = Path(proc_dir, "cmdline").read_bytes().split(b"\0")
        cwd = os.readlink(Path(proc_dir, "cwd"))
    except OSError:
        return name
    return f"{' '.join(a.decode(errors='replace') for a in argv if a)} (in {cwd})"[:300]


def files_created_since(marker: Path, keep_out: list[Path]) -> list[str]:
    """Regular files on the root file system newer than ``marker``, outside ``keep_out``."""
    prune = [*SCAN_PRUNE, *map(str, keep_out)]
    expression = [p for path in prune for p in ("-path", path, "-prune", "-o")]
    proc = subprocess.run(["find", "/", "-xdev", *expression, "-type", "f", "-newer", str(marker), "-print"],
                          capture_output=True, text=True)  # fmt: skip
    return sorted(line for line in proc.stdout.splitlines() if line)


@functools.cache
def installed_manifest(work: Path) -> JitManifest:
    """The benchmark archive's JIT manifest."""
    archive = Archive.open(work / "archive")
    return read_manifest(archive.root, archive.catalog.jit)


def installed_directory(work: Path) -> Path:
    """Where the benchmark's LOADs (``--trust-cached-code``) install the archive's caches."""
    return install_directory(work / "jit-root", installed_manifest(work).cache_id, trust_host_code=True)


def fresh_environment(scratch: Path, work: Path) -> dict[str, str]:
    """A new empty HOME, XDG_CACHE_HOME and TMPDIR, every cache variable unset, and
    nothing installed where a LOAD installs the archive's caches."""
    env = {k: v for k, v in os.environ.items() if k not in CACHE_VARIABLES}
    for name in ("home", "cache", "tmp"):
        (scratch / name).mkdir(parents=True)
    env.update(HOME=str(scratch / "home"), XDG_CACHE_HOME=str(scratch / "cache"), TMPDIR=str(scratch / "tmp"))
    shutil.rmtree(work / "jit-root", ignore_errors=True)
    env["FOUNDRY_JIT_ROOT"] = str(work / "jit-root")
    return env


def warm_environment(work: Path) -> dict[str, str]:
    """Every JIT cache under one directory of the benchmark's, shared by all warm runs
    (a LOAD's installed ones under DIR/jit-root, kept between runs)."""
    caches = work / "warm-caches"
    env = {k: v for k, v in os.environ.items() if k not in CACHE_VARIABLES}
    env.update(HOME=str(caches / "home"), XDG_CACHE_HOME=str(caches / "cache"), FOUNDRY_JIT_ROOT=str(work / "jit-root"))
    (caches / "home").mkdir(parents=True, exist_ok=True)
    return env


def recipe_command(args: argparse.Namespace, out: Path, side: str) -> list[str]:
    recipe = [sys.executable, str(RECIPE), "--preset", args.preset, "--out", str(out),
              "--model-dir", str(args.work / "model")]  # fmt: skip
    if side == "plain":
        return recipe
    threads = ["--build-threads", str(args.build_threads)] if args.build_threads > 1 else []
    return [sys.executable, "-m", "foundry", "run", "--mode", "load", *FAST, *threads, "--archive",
            str(args.work / "archive"), "--", *recipe]  # fmt: skip


def import_command(args: argparse.Namespace, side: str) -> list[str]:
    plain = [sys.executable, "-c", IMPORT]
    if side == "plain":
        return plain
    return [sys.executable, "-m", "foundry", "run", "--mode", "load", "--trust-cached-code", "--archive",
            str(args.work / "archive"), "--", *plain]  # fmt: skip


def one_run(args: argparse.Namespace, kind: str, side: str, index: int) -> dict:
    """One start, timed; for the recipe, its report's figures."""
    scratch = Path(tempfile.mkdtemp(prefix=f"{kind}-{side}-{index}-", dir=args.work / "scratch"))
    env = fresh_environment(scratch, args.work) if kind == "fresh" else warm_environment(args.work)
    out = scratch / "report.json"
    command = import_command(args, side) if kind == "import" else recipe_command(args, out, side)
    synced = time.perf_counter()
    os.sync()  # what the run before wrote (a fresh plain run's builds) is flushed now, not during this run
    synced = time.perf_counter() - synced
    marker = scratch / "marker"
    marker.touch()
    time.sleep(0.01)  # files made from now on are newer than the marker
    with CompilerWatch() as watch:
        spawned, begun, cpu = time.time(), time.perf_counter(), children_cpu_s()
        proc = subprocess.run(command, env=env, capture_output=True, text=True, cwd=ROOT)
        wall, ended = time.perf_counter() - begun, time.time()
    cpu = children_cpu_s() - cpu
    (scratch / "log.txt").write_text(proc.stdout + proc.stderr)
    result = {"kind": kind, "side": side, "index": index, "rc": proc.returncode, "wall_s": wall, "cpu_s": cpu,
              "sync_s": synced,
              "compilers": sorted(watch.seen), "compiler_commands": sorted(set(watch.commands.values()))[:10],
              "log": str(scratch / "log.txt")}  # fmt: skip
    if kind == "fresh":
        result["outside"] = files_created_since(marker, [scratch, args.work])[:50]
        # where the libraries keep their caches by default on a fresh node: a LOAD points every one elsewhere
        result["new_in_home"] = sorted(str(p) for d in ("home", "cache") for p in (scratch / d).rglob("*")
                                       if not p.is_dir())[:50]  # fmt: skip
    if side == "load":
        result["new_in_caches"] = changed_since_install(
            installed_directory(args.work), installed_manifest(args.work), trust_host_code=True
        )[:50]
    imported = IMPORTED_LINE.search(proc.stdout) if kind == "import" else None
    if imported:  # before the program's first line (the launcher's share), the imports, the exit after them
        first, last = float(imported.group(1)), float(imported.group(2))
        result.update(to_program_s=first - spawned, imports_s=last - first, exit_s=ended - last)
        if imported.group(3) is not None:  # how the imports split, and whether they started CUDA
            result.update(torch_import_s=float(imported.group(3)), imports_cpu_s=float(imported.group(4)))
            result.update(cuda_initialized=imported.group(5) == "1", libcuda_mapped=imported.group(6) == "1")
    if kind == "import" and side == "load":
        result["no_session"] = proc.returncode == 2 and NO_SESSION in proc.stderr
    launched = LAUNCHER_LINE.search(proc.stderr)
    if side == "load" and launched:
        result["launcher_s"] = float(launched.group(1))
        result["launcher_steps"] = launched.group(2)  # where it went (None from a launcher that did not say)
    hooked = HOOK_LINE.search(proc.stderr) if side == "load" else None
    if hooked:
        result.update(hook_pre_cuda_ms=float(hooked.group(1)), hook_lookups=int(hooked.group(2)))
    if side == "load" and kind != "import":
        result["build_threads"] = args.build_threads
    if kind != "import" and proc.returncode == 0:
        result.update(figures(json.loads(out.read_text())))
    return result


def children_cpu_s() -> float:
    """User and system CPU seconds of this process's children that ended (a run's whole
    tree, once reaped): steadier than wall time on a machine whose load varies."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def compiled(run: dict) -> list[str]:
    """The compilers a run was seen to start, build tools left out."""
    return [c for c in run["compilers"] if c not in BUILD_TOOLS]


def figures(report: dict) -> dict:
    """The recipe report's start-up figures, and its outputs for the comparison."""
    startup = report.get("startup") or {}
    foundry = report.get("foundry") or {}
    e2e = startup.get("scheduler_e2e")
    return {
        "ready_s": report["ready_s"],
        "first_answer_s": report["ready_s"] + report["batch_s"][0],
        "before_scheduler_s": None if e2e is None else report["ready_s"] - e2e,
        "scheduler_e2e_s": e2e,
        "graph_phase_s": sum((startup.get("cuda_graph") or {}).values()) if startup else None,
        "foundry_s": (foundry.get("sglang_seconds") or {}).get("foundry_s"),
        "foundry_parts": foundry_parts(foundry) if foundry else None,
        "outputs": [o["output_ids"] for o in report["outputs"]],
        "logprobs": [o["logprobs"] for o in report["outputs"]],
    }


# where Foundry's share goes: the plugin's session opening, start, graphs and finish, and the session's steps
SHARE_PARTS = ("session_open_s", "session_start_s", "graphs_s", "session_finish_s")
SESSION_PARTS = ("open_s", "start_s", "finish_s", "module_check_s", "restore_s", "map_s", "build_s", "instantiated_s")


def foundry_parts(foundry: dict) -> dict:
    """A LOAD report's parts of Foundry's share (:data:`SHARE_PARTS`, :data:`SESSION_PARTS`)."""
    seconds = foundry.get("sglang_seconds") or {}
    return {**{k: seconds.get(k) for k in SHARE_PARTS}, **{k: foundry.get(k) for k in SESSION_PARTS}}


def cmd_save(args: argparse.Namespace) -> int:
    for site in {p for p in sys.path if p.endswith(("site-packages", "dist-packages")) or "sglang-site" in p}:
        subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", site], capture_output=True)
    if (args.work / "archive").exists():
        print(f"{args.work / 'archive'} exists; keeping it")
        return 0
    env = warm_environment(args.work)
    recipe = [sys.executable, str(RECIPE), "--preset", args.preset, "--out", str(args.work / "save.json"),
              "--model-dir", str(args.work / "model")]  # fmt: skip
    command = [sys.executable, "-m", "foundry", "run", "--mode", "save", "--archive", str(args.work / "archive"), "--",
               *recipe]  # fmt: skip
    return subprocess.run(command, env=env, cwd=ROOT).returncode


def cmd_pairs(args: argparse.Namespace) -> int:
    try:  # refused before any run: a LOAD needs the archive `save` writes (and its JIT caches)
        installed_manifest(args.work)
    except FoundryError as err:
        print(f"sglang_startup.py: {err} (run `save --work {args.work}` first)", file=sys.stderr)
        return 2
    results = args.work / "results.jsonl"
    done = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    start = 1 + max((r["index"] for r in done if r["kind"] == args.kind), default=0)
    # the first warm start fills the shared caches (SAVE's own runs fill the archive's, not those);
    # the first import may build Triton's helpers
    if args.kind in ("warm", "import") and start == 1 and not args.discard:
        print(f"the first {args.kind} pairs: one plain start first, not counted", flush=True)
        args.discard = True
    if args.discard:
        record(results, {**one_run(args, args.kind, "plain", 0), "discarded": True})
    status = 0
    for index in range(start, start + args.pairs):
        runs: dict[str, dict] = {}
        for side in ("plain", "load") if index % 2 else ("load", "plain"):  # each side first in every other pair
            runs[side] = {**one_run(args, args.kind, side, index), "first": not runs}
            if side == "plain":
                record(results, runs[side])
        plain, load = runs["plain"], runs["load"]
        if "outputs" in plain and "outputs" in load:
            load["identical"] = (plain["outputs"], plain["logprobs"]) == (load["outputs"], load["logprobs"])
        record(results, load)
        # an import LOAD ends with the hook's "never opened a session" (exit 2): that is its success
        load_failed = load["rc"] != 0 and not load.get("no_session")
        status |= plain["rc"] != 0 or load_failed or load.get("identical") is False
    return 1 if status else 0


def record(path: Path, result: dict) -> None:
    slim = {k: v for k, v in result.items() if k not in ("outputs", "logprobs")}
    print(json.dumps(slim), flush=True)
    with path.open("a") as handle:
        handle.write(json.dumps(result) + "\n")


FIGURES = ("ready_s", "first_answer_s", "before_scheduler_s", "scheduler_e2e_s", "graph_phase_s", "foundry_s",
           "launcher_s", "hook_pre_cuda_ms", "to_program_s", "imports_s", "torch_import_s", "imports_cpu_s", "exit_s",
           "wall_s", "cpu_s")  # fmt: skip


def cmd_summary(args: argparse.Namespace) -> int:
    paths = args.results or [args.work / "results.jsonl"]
    missing = [str(p) for p in paths if not Path(p).is_file()]
    if missing:
        print(f"sglang_startup.py: no results file {missing[0]}", file=sys.stderr)
        return 2
    runs = [json.loads(line) for path in paths for line in Path(path).read_text().splitlines() if line.strip()]
    runs = [r for r in runs if not r.get("discarded") and (r["rc"] == 0 or r.get("no_session"))]
    threads = args.build_threads
    if threads > 1:
        print(f"fresh and warm LOADs building on {threads} threads (--build-threads {threads})")
    print("kind    figure               plain median [min-max]     LOAD median [min-max]      paired LOAD-plain  n")
    for kind in ("fresh", "warm", "import"):
        pairs = [(p, q) for p, q in paired(runs, kind) if kind == "import" or q.get("build_threads", 1) == threads]
        if kind == "warm":  # a plain run that compiled was not warm
            cold = [plain for plain, _ in pairs if compiled(plain)]
            pairs = [(plain, load) for plain, load in pairs if not compiled(plain)]
            if cold:
                print(f"warm    left out: {len(cold)} pair(s) whose plain run compiled (indices "
                      f"{', '.join(str(r['index']) for r in cold)})")  # fmt: skip
        if not pairs:
            continue
        for name in FIGURES:
            plain = [p[name] for p, _ in pairs if p.get(name) is not None]
            load = [q[name] for _, q in pairs if q.get(name) is not None]
            diffs = [q[name] - p[name] for p, q in pairs if p.get(name) is not None and q.get(name) is not None]
            if not load and not plain:
                continue
            unit = "ms" if name.endswith("_ms") else "s"
            print(f"{kind:7s} {name:20s} {spread(plain):26s} {spread(load):26s} "
                  f"{statistics.median(diffs) if diffs else float('nan'):+9.2f} {unit}  {len(pairs)}")  # fmt: skip
        loads = [q for _, q in pairs]
        tools = ", ".join(sorted(BUILD_TOOLS))
        seen = (f"compilers seen: plain {sorted({c for p, _ in pairs for c in compiled(p)})}, "
                f"LOAD {sorted({c for q in loads for c in compiled(q)})}; {tools} seen in "
                f"{sum(1 for p, _ in pairs if BUILD_TOOLS & set(p['compilers']))} plain runs and "
                f"{sum(1 for q in loads if BUILD_TOOLS & set(q['compilers']))} LOADs")  # fmt: skip
        print_what_loads_left(kind, loads)
        print_share_parts(kind, loads)
        if kind == "import":  # no outputs: the program only imports SGLang
            print(f"import  LOADs ending in the hook's no-session exit 2 (expected: the program opens none): "
                  f"{sum(1 for q in loads if q.get('no_session'))} of {len(loads)}; {seen}")  # fmt: skip
            for flag in ("cuda_initialized", "libcuda_mapped"):
                print(f"import  {flag}: plain {sum(1 for p, _ in pairs if p.get(flag))}, "
                      f"LOAD {sum(1 for q in loads if q.get(flag))} of {len(pairs)}")  # fmt: skip
            continue
        print(f"{kind:7s} outputs identical in {sum(1 for q in loads if q.get('identical'))} of {len(loads)} LOADs; "
              f"{seen}; files outside: "
              f"{sum(len(r.get('outside', [])) for p, q in pairs for r in (p, q))}")  # fmt: skip
    return 0


def print_share_parts(kind: str, loads: list[dict]) -> None:
    """Medians of the parts of Foundry's share over the LOADs that recorded them, with the
    session's steps within each (``open_s``, ``start_s``, ``finish_s``)."""
    parts = [q["foundry_parts"] for q in loads if q.get("foundry_parts")]
    if not parts:
        return
    steps = [f"{name} {_median_of([p.get(name) for p in parts])}"
             for name in (*SHARE_PARTS, "restore_s", "module_check_s")]  # fmt: skip
    for nested in ("open_s", "start_s", "finish_s"):
        inner = [p.get(nested) or {} for p in parts]
        names = dict.fromkeys(n for steps_of in inner for n in steps_of)
        steps.append(f"{nested} ({', '.join(f'{n} {_median_of([i.get(n) for i in inner])}' for n in names)})")
    print(f"{kind:7s} Foundry's share, medians of {len(parts)} LOADs (s): {'; '.join(steps)}")


def _median_of(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{statistics.median(known):.3f}" if known else "?"


def print_what_loads_left(kind: str, loads: list[dict]) -> None:
    """The compilers LOADs started, by command, and the files they added to the caches
    (the installed ones; on a fresh node also the libraries' default places)."""
    commands = sorted({c for q in loads for c in q.get("compiler_commands", [])})
    for command in commands[:5]:
        print(f"{kind:7s} a LOAD ran: {command}")
    if not any("new_in_caches" in q for q in loads):  # results of a benchmark that did not look
        return
    changed = [f for q in loads for f in q.get("new_in_caches", [])]
    home = [f for q in loads for f in q.get("new_in_home", [])]
    built = [f for f in changed if not is_bookkeeping(f)]  # locks and logs are written around builds, not built
    around = ""
    if changed:
        around = f" ({len(changed) - len(built)} of them locks, logs or temporaries; first: {changed[0]})"
    print(f"{kind:7s} files LOADs added to or rewrote in the installed caches: {len(changed)}{around}"
          f"; build outputs among them: {len(built)}{f' (first: {built[0]})' if built else ''}"
          f"{f'; in the fresh HOME and XDG_CACHE_HOME: {len(home)}' if kind == 'fresh' else ''}"
          f"{f' (first: {home[0]})' if home else ''}")  # fmt: skip


def paired(runs: list[dict], kind: str) -> list[tuple[dict, dict]]:
    by_index: dict[int, dict[str, dict]] = {}
    for r in runs:
        if r["kind"] == kind:
            by_index.setdefault(r["index"], {})[r["side"]] = r
    return [(sides["plain"], sides["load"]) for _, sides in sorted(by_index.items()) if len(sides) == 2]


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):7.2f} [{min(values):.2f}-{max(values):.2f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("save", "pairs", "summary"):
        p = sub.add_parser(name)
        p.add_argument("--work", type=Path, required=True, help="the benchmark's directory (archive, caches, results)")
        p.add_argument("--preset", default="qwen3-8b", help="recipes/sglang/run.py --preset")
    sub.choices["pairs"].add_argument("--kind", choices=["warm", "fresh", "import"], required=True)
    sub.choices["pairs"].add_argument("--pairs", type=int, default=1)
    sub.choices["pairs"].add_argument("--discard", action="store_true", help="one plain run first, not counted")
    sub.choices["summary"].add_argument("results", nargs="*", type=Path)
    for name in ("pairs", "summary"):
        sub.choices[name].add_argument(
            "--build-threads",
            type=int,
            default=1,
            help="the LOADs' --build-threads (summary: pairs whose LOAD used it)",
        )
    args = parser.parse_args(argv)
    args.work = args.work.resolve()
    if args.command == "summary":  # reads results only: makes nothing in the work directory
        return cmd_summary(args)
    (args.work / "scratch").mkdir(parents=True, exist_ok=True)
    if args.command == "save":
        return cmd_save(args)
    return cmd_pairs(args)


if __name__ == "__main__":
    sys.exit(main())

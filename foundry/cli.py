"""The ``foundry`` command.

Exit codes: 0 success (lint clean, diff identical); 1 findings (lint findings
or failed expectations, archives that differ); 2 usage or archive errors.
Every error is one line on stderr naming the file and field; with ``--json``
it is one JSON object on stdout instead (nothing else is written there). Never
a traceback. Text from archives is shown as text, never as rich markup, with
its control characters escaped (:mod:`foundry.text`).
"""

from __future__ import annotations

import functools
import json
import os
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from foundry import __version__
from foundry.archive.sample import SAMPLE_NAME, resolve_archive_arg
from foundry.env import SAVE_ID
from foundry.errors import FoundryError
from foundry.text import plain, printable

if TYPE_CHECKING:  # the rest is imported where a command needs it: `foundry run` starts a program quickly
    from rich.console import Console

    from foundry.archive.reader import Archive
    from foundry.backends.registry import BackendRegistry

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR, EXIT_INTERNAL = 0, 1, 2, 70

ARCHIVE_HELP = f"an archive directory, or {SAMPLE_NAME} for the bundled sample"


def _stdout() -> Console:
    """Rich console on stdout; 120 columns when piped (rich would assume 80)."""
    from rich.console import Console

    width = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 120
    return Console(soft_wrap=False, highlight=False, width=width, markup=False)  # archives' text is never markup


def _emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=1, default=str))


def _fail(message: str, code: int, as_json: bool, detail: dict | None = None) -> None:
    """The one refusal: a JSON object on stdout with ``--json``, else one line on stderr."""
    if as_json:
        click.echo(json.dumps({"ok": False, "error": detail or {"message": message}}, default=str))
    else:
        click.echo(f"foundry: error: {printable(message)}", err=True)
    sys.exit(code)


def guarded(fn: Callable[..., int | None]) -> Callable[..., None]:
    """Turn Foundry errors into one line and exit 2; an unexpected failure into exit 70."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        as_json = bool(kwargs.get("as_json"))
        try:
            code = fn(*args, **kwargs)
        except FoundryError as err:
            _fail(str(err), EXIT_ERROR, as_json, err.to_dict())
        except OSError as err:
            _fail(f"{err.filename or ''}: {err.strerror or err}", EXIT_ERROR, as_json,
                  {"error": type(err).__name__, "message": str(err.strerror or err), "path": err.filename})  # fmt: skip
        except (click.exceptions.Exit, click.ClickException, SystemExit, KeyboardInterrupt):
            raise
        except Exception as err:  # noqa: BLE001 - the last guard: one line, no traceback, a distinct code
            _fail(f"internal error: {type(err).__name__}: {err} (please report this)", EXIT_INTERNAL, as_json)
        sys.exit(code or EXIT_OK)

    return run


def open_archive(text: str) -> Archive:
    from foundry.archive.reader import Archive

    return Archive.open(resolve_archive_arg(text))


def _registry() -> BackendRegistry:
    from foundry.backends.registry import BackendRegistry

    return BackendRegistry.discover()


json_option = click.option("--json", "as_json", is_flag=True, help="machine-readable output on stdout")
rank_option = click.option("--rank", type=click.IntRange(min=0), default=None, help="only this rank")


_HELP_REQUESTED = getattr(click.exceptions, "NoArgsIsHelpError", ())  # click >= 8.2


class _Commands(click.Group):
    """The ``foundry`` group. A usage error (an unknown option, a bad value, a missing
    argument) is a refusal like any other: one line on stderr, or one JSON object on stdout
    with ``--json``, and exit 2; click's own form of it is four lines."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:  # fmt: skip
        argv = list(sys.argv[1:] if args is None else args)
        if not standalone_mode:
            return super().main(argv, prog_name, complete_var, False, **extra)
        as_json = "--json" in (argv[: argv.index("--")] if "--" in argv else argv)  # not a program's own flags
        try:
            code = super().main(argv, prog_name, complete_var, False, **extra)
        except _HELP_REQUESTED as err:  # a group named without its command: its help, as click shows it
            err.show()
            sys.exit(err.exit_code)
        except click.ClickException as err:  # usage errors among them
            hint = f" (see '{err.ctx.command_path} --help')" if isinstance(err, click.UsageError) and err.ctx else ""
            message = err.format_message() + hint
            _fail(message, err.exit_code, as_json, {"error": type(err).__name__, "message": message})
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else EXIT_OK)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="foundry")
def main() -> None:
    """Foundry: inspect, lint and diff archives of persisted CUDA graphs."""


# -- archive ------------------------------------------------------------------------


@main.group()
def archive() -> None:
    """Whole-archive commands: inspect, diff, verify."""


@archive.command(
    "inspect",
    help="Ranks, graphs, node counts by kind, kernel histogram, collectives, regions "
    f"and unresolved pointers of ARCHIVE ({ARCHIVE_HELP}).",
)
@click.argument("path", metavar="ARCHIVE")
@rank_option
@click.option("--top", type=click.IntRange(min=1), default=15, show_default=True, help="rows per table")
@json_option
@guarded
def archive_inspect(path: str, rank: int | None, top: int, as_json: bool) -> int:
    from foundry.inspect.render import render_summary
    from foundry.inspect.summary import summarize

    summary = summarize(open_archive(path), _registry(), rank=rank)
    if as_json:
        _emit_json(summary.to_dict())
    else:
        render_summary(_stdout(), summary, top=top)
    return EXIT_OK


@archive.command("diff")
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@click.option("--relocations", is_flag=True,
              help="A and B are SAVEs at different region bases: check every changed word is an operand "
              "that moved by exactly its region's delta")  # fmt: skip
@json_option
@guarded
def archive_diff(a: str, b: str, relocations: bool, as_json: bool) -> int:
    """Environment, graph set, fingerprints and node-level differences of two archives.

    Exits 0 when identical (with --relocations: when every change is a relocation), 1 otherwise."""
    from foundry.inspect.archive_diff import diff_archives
    from foundry.inspect.render import render_diff

    if relocations:
        return _relocation_check(open_archive(a), open_archive(b), as_json)
    result = diff_archives(open_archive(a), open_archive(b))
    if as_json:
        _emit_json(result.to_dict())
    else:
        render_diff(_stdout(), result)
    return EXIT_OK if result.identical else EXIT_FINDINGS


def _relocation_check(a: Archive, b: Archive, as_json: bool) -> int:
    from foundry.inspect.relocations import check_relocations

    report = check_relocations(a, b)
    if as_json:
        _emit_json({"ok": not report.findings, **report.to_dict()})
        return EXIT_FINDINGS if report.findings else EXIT_OK
    out = _stdout()
    moved = ", ".join(f"{name} by {delta:#x}" for name, delta in sorted(report.deltas.items())) or "nothing"
    out.print(f"regions moved: {moved}")
    out.print(f"{report.graphs} graph(s): {report.operands_moved} operands moved by their region's delta, "
              f"{report.operands_fixed} in regions that stayed")  # fmt: skip
    for f in report.findings[:50]:
        where = "the pair" if f.rank is None else f"rank {f.rank} {f.graph}"
        where += f" node {f.node}" if f.node is not None else ""
        detail = f" ({f.a} -> {f.b})" if f.a or f.b else ""
        out.print(f"finding: {printable(where)}: {printable(f.what)}{printable(detail)}")
    if report.finding_count > 50:
        out.print(f"... and {report.finding_count - 50} more findings")
    out.print("every change is a relocation" if not report.findings else f"{report.finding_count} finding(s)")
    return EXIT_FINDINGS if report.findings else EXIT_OK


@archive.command("strip")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--keep-warmup", is_flag=True, help="keep the warm-up bytes a LOAD --warmup restore needs")
@click.option("--caches-only", is_flag=True,
              help="drop only the JIT caches (and with them any host code): PATH still LOADs, compiling at "
              "start-up")  # fmt: skip
@json_option
@guarded
def archive_strip(path: Path, keep_warmup: bool, caches_only: bool, as_json: bool) -> int:
    """Drop module images, warm-up bytes and JIT caches to make PATH small; it then inspects but no longer LOADs."""
    from foundry.archive.reader import Archive
    from foundry.archive.strip import strip

    removed = strip(Archive.open(path), keep_warmup=keep_warmup, caches_only=caches_only)
    if as_json:
        _emit_json({"ok": True, **removed})
    else:
        click.echo(f"stripped {path}: {removed['files']} files, {removed['bytes'] / 2**20:.1f} MiB removed")
    return EXIT_OK


@archive.command("verify")
@click.argument("path", metavar="ARCHIVE")
@json_option
@guarded
def archive_verify(path: str, as_json: bool) -> int:
    """Read every file, check every hash, re-check every graph and recompute its
    fingerprint and launch plan; module images, warm-up bytes and JIT cache files must match
    their records."""
    from foundry.archive.verify import check_files
    from foundry.graphir.fingerprint import fingerprint

    arch = open_archive(path)
    mismatches = []
    checked = 0
    plans_unchecked = 0
    can_pack = _have_driver_structures()
    for r, entry in arch.select():
        ir = arch.graph(r, entry)
        found = fingerprint(ir)
        checked += 1
        if found != entry.fingerprint:
            mismatches.append({"rank": r, "graph": entry.name, "field": "fingerprint", "expected": entry.fingerprint,
                               "found": found})  # fmt: skip
        if entry.plan is not None and not can_pack:
            plans_unchecked += 1
        elif entry.plan is not None and not _plan_matches(arch, r, entry, ir):
            mismatches.append({"rank": r, "graph": entry.name, "field": "plan", "expected": "the graph packed again",
                               "found": entry.plan.file})  # fmt: skip
    files = check_files(arch)
    if as_json:
        by_field = {field: [m for m in mismatches if m["field"] == field] for field in ("fingerprint", "plan")}
        _emit_json({"ok": not mismatches, "graphs": checked, "fingerprint_mismatches": by_field["fingerprint"],
                    "plan_mismatches": by_field["plan"], "plans_unchecked": plans_unchecked,
                    "modules": files.modules, "warmup_files": files.warmup, "jit_files": files.jit})  # fmt: skip
    else:
        for m in mismatches:
            where = f"rank {m['rank']} {printable(m['graph'])}"
            if m["field"] == "plan":
                click.echo(f"{where}: launch plan {printable(m['found'])} differs from the graph packed again")
            else:
                click.echo(f"{where}: fingerprint {m['found']} differs from recorded {m['expected']}")
        jit = f", {files.jit} JIT cache file(s)" if files.jit else ""
        kept = (
            f" ({files.modules} module image(s), {files.warmup} warm-up file(s){jit} matched)"
            if files.modules + files.warmup + files.jit
            else ""
        )
        click.echo(
            f"{checked} graph(s) verified{kept}" + (f", {len(mismatches)} mismatch(es)" if mismatches else ", all ok")
        )
        if plans_unchecked:
            click.echo(f"{plans_unchecked} launch plan(s) not compared: packing needs cuda-bindings "
                       "(pip install 'foundry[gpu]')")  # fmt: skip
    return EXIT_FINDINGS if mismatches else EXIT_OK


def _have_driver_structures() -> bool:
    """Whether cuda-bindings is importable (packing launch attributes uses its structures)."""
    import importlib.util

    try:
        return importlib.util.find_spec("cuda.bindings") is not None
    except ModuleNotFoundError:  # no `cuda` package at all
        return False


def _plan_matches(arch: Any, rank: int, entry: Any, ir: Any) -> bool:
    """Whether the entry's launch plan is exactly what packing its graph gives (the plan file's
    size and sha256 checked first, against the session's record)."""
    from foundry.runtime.graphs.launch_plan import make_plan

    plan = entry.plan
    data = arch.rank_blob(rank, plan.file, sha256=plan.sha256, size=plan.size, what="launch plan")
    try:
        packed = make_plan(ir)
    except (struct.error, KeyError, ValueError, TypeError, OverflowError) as err:  # the IR was checked: say where
        raise FoundryError(f"the graph cannot be packed again: {type(err).__name__}: {err}",
                           path=str(arch.graph_path(rank, entry)), field="plan") from None  # fmt: skip
    return packed == (data, plan.kernels)


# -- graph --------------------------------------------------------------------------


@main.group()
def graph() -> None:
    """Per-graph commands: lint, show, export."""


@graph.command("lint")
@click.argument("path", metavar="ARCHIVE")
@rank_option
@click.option("--graph", "pattern", default=None, metavar="GLOB", help="only graphs whose name matches")
@click.option(
    "--expect",
    "expects",
    multiple=True,
    metavar="KIND=N",
    help="KIND occurs N times in every selected graph (repeatable)",
)
@click.option("--total", is_flag=True, help="expectations count over the whole selection instead")
@click.option("--disable", "disabled", multiple=True, metavar="RULE", help="turn a built-in rule off (repeatable)")
@click.option("--strict", is_flag=True, help="warnings fail too")
@json_option
@guarded
def graph_lint(
    path: str,
    rank: int | None,
    pattern: str | None,
    expects: tuple[str, ...],
    total: bool,
    disabled: tuple[str, ...],
    strict: bool,
    as_json: bool,
) -> int:
    """Check graphs against built-in rules and --expect counts.

    Rules: unresolved-pointer, unsupported-node, missing-module-image.
    KIND is a node kind (kernel, memset, ...) or a backend kind
    (symm-allreduce, nccl-allreduce, deepep-dispatch, ...).
    Exits 0 clean, 1 findings, 2 usage or archive error."""
    from foundry.inspect.lint import Expectation, lint
    from foundry.inspect.render import render_lint

    expectations = [Expectation.parse(e) for e in expects]
    report = lint(
        open_archive(path),
        _registry(),
        rank=rank,
        pattern=pattern,
        expectations=expectations,
        total=total,
        disabled=disabled,
    )
    if as_json:
        _emit_json(report.to_dict(strict=strict))
    else:
        render_lint(_stdout(), report, strict=strict)
    return EXIT_FINDINGS if report.failed(strict=strict) else EXIT_OK


@graph.command("show")
@click.argument("path", metavar="ARCHIVE")
@click.argument("name", metavar="GRAPH")
@click.option("--rank", type=click.IntRange(min=0), default=0, show_default=True)
@json_option
@guarded
def graph_show(path: str, name: str, rank: int, as_json: bool) -> int:
    """The node table of one graph."""
    from foundry.inspect.render import node_rows, render_nodes

    ir = open_archive(path).graph(rank, name)
    if as_json:
        _emit_json(
            {
                "graph": ir.name,
                "rank": rank,
                "nodes": node_rows(ir),
                "edges": [[e.src, e.dst, e.data.type] for e in ir.edges()],
            }
        )
    else:
        render_nodes(_stdout(), ir)
    return EXIT_OK


@graph.command("export")
@click.argument("path", metavar="ARCHIVE")
@click.argument("name", metavar="GRAPH")
@click.option("--format", "fmt", type=click.Choice(["dot", "graphml"]), required=True)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="write here (atomically) instead of stdout",
)
@click.option("--rank", type=click.IntRange(min=0), default=0, show_default=True)
@guarded
def graph_export(path: str, name: str, fmt: str, output: Path | None, rank: int) -> int:
    """Export one graph as Graphviz DOT or GraphML."""
    from foundry.archive.files import atomic_write
    from foundry.graphir.passes.export import export

    text = export(open_archive(path).graph(rank, name), fmt)
    if output is None:
        click.echo(text, nl=False)
    else:
        atomic_write(output, text.encode())
        click.echo(f"wrote {output}", err=True)
    return EXIT_OK


# -- backends -----------------------------------------------------------------------


@main.group()
def backends() -> None:
    """Registered backends (entry-point group foundry.backends)."""


@backends.command("list")
@json_option
@guarded
def backends_list(as_json: bool) -> int:
    """Every registered backend: kinds it recognises, contract steps it implements, or why it is broken."""
    from rich.table import Table

    rows = _registry().describe()
    if as_json:
        _emit_json(rows)
        return EXIT_OK
    table = Table(title="Backends", title_justify="left")
    for col in ("name", "status", "kinds", "implements", "origin / reason"):
        table.add_column(col, overflow="fold")
    for row in rows:
        if row["status"] == "ok":
            table.add_row(plain(row["name"]), "ok", plain(", ".join(row["kinds"]) or "-"),
                          ", ".join(row["implements"]), plain(row["origin"]))  # fmt: skip
        else:
            table.add_row(
                plain(row["name"]), plain("broken", "red"), "-", "-", plain(f"{row['origin']}: {row['reason']}")
            )
    _stdout().print(table)
    return EXIT_OK


def _address(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not an address (e.g. 0x600000000000)") from None


@main.command("run", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--mode", type=click.Choice(["save", "load"]), required=True, help="capture and write, or restore")
@click.option("--archive", type=click.Path(path_type=Path), required=True, help="the archive directory")
@click.option("--region-base", callback=lambda c, p, v: None if v is None else _address(v), default=None,
              help="base address of the region; LOAD takes SAVE's unless given (then it relocates)")  # fmt: skip
@click.option("--region-size", type=click.IntRange(min=1 << 30), default=None, help="bytes to reserve (>= 1 GiB)")
@click.option("--warmup", type=click.Choice(["replay", "restore"]), default="replay",
              help="LOAD: repeat the program's warm-up, or skip it and restore the bytes it left")  # fmt: skip
@click.option("--rank", type=click.IntRange(min=0), default=0, help="this process's rank")
@click.option("--world-size", type=click.IntRange(1, 1024), default=1, show_default=True,
              help=f"SAVE: ranks in the archive, one process each (they share {SAVE_ID.name})")  # fmt: skip
@click.option("--builder", type=click.Choice(["python", "native"]), default="python",
              help="LOAD: build graphs via cuda-bindings, or via the hook from SAVE's launch plans")  # fmt: skip
@click.option("--build-threads", type=click.IntRange(1, 64), default=1, show_default=True,
              help="LOAD with --builder native: threads that build graphs (and instantiate them, unless in the "
              "background)")  # fmt: skip
@click.option("--instantiate", type=click.Choice(["now", "background"]), default="now", show_default=True,
              help="LOAD with --builder native: instantiate every graph before the program gets them, or on a "
              "thread while it goes on (a graph replayed first is instantiated then)")  # fmt: skip
@click.option("--overwrite", is_flag=True, help="SAVE: replace an archive already at --archive")
@click.option("--keep-aslr", is_flag=True, help="SAVE: keep address-space randomisation (fingerprints may differ)")
@click.option("--save-runs", type=click.IntRange(min=1, max=8), default=2, show_default=True,
              help="SAVE: run the program this many times, marking bytes the runs disagree on")  # fmt: skip
@click.option("--region-threads", type=click.Choice(["owner", "any"]), default="owner", show_default=True,
              help="which threads may allocate in the region: the first one, or any (NCCL's proxy thread); "
              "the trace comparisons still refuse any reordering")  # fmt: skip
@click.option("--jit-caches/--no-jit-caches", default=True, show_default=True,
              help="SAVE: record what the program compiles (a priming run first) in the archive; LOAD: install "
              "the archive's caches, in a directory of their own, before the program starts")  # fmt: skip
@click.option("--trust-cached-code", is_flag=True,
              help="LOAD: also install the caches' host code (shared objects, Python, pickles, build files): "
              "code taken from the archive then runs in the program. Off by default, like other tools' "
              "'trust remote code' switches; only for archives you made or trust")  # fmt: skip
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@guarded
def run(mode: str, archive: Path, region_base: int | None, region_size: int | None, warmup: str, rank: int,
        world_size: int, builder: str, build_threads: int, instantiate: str, overwrite: bool, keep_aslr: bool,
        save_runs: int, region_threads: str, jit_caches: bool, trust_cached_code: bool,
        command: tuple[str, ...]) -> int:  # fmt: skip
    """Run COMMAND (after --) with the native hook and a SAVE or LOAD session.

    The program opens the session with foundry.runtime.open_session(); the exit
    code is the program's. A SAVE runs it --save-runs times (fresh processes) and
    keeps the first run's archive, marked with the bytes the runs disagree on."""
    from foundry.runtime.launch import launcher

    if rank >= world_size and mode == "save":
        raise click.BadParameter(f"rank {rank} is not below the world size {world_size}", param_hint="--rank")
    if instantiate == "background" and builder != "native":
        raise click.BadParameter("background instantiation needs --builder native", param_hint="--instantiate")
    config = launcher.RunConfig(mode, archive, region_base, region_size, warmup, rank, world_size,
                                fixed_layout=not keep_aslr, instantiate=instantiate,
                                builder=builder, build_threads=build_threads, overwrite=overwrite,
                                region_threads=region_threads, jit_caches=jit_caches,
                                trust_cached_code=trust_cached_code)  # fmt: skip
    try:
        return launcher.run(config, list(command), save_runs=save_runs, log=lambda line: click.echo(line, err=True),
                            replace_process=True)  # fmt: skip
    except FileNotFoundError:
        raise FoundryError("command not found", found=command[0]) from None


if __name__ == "__main__":  # pragma: no cover
    main()

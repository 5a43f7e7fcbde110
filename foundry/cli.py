"""The ``foundry`` command.

Exit codes: 0 success (lint clean, diff identical, doctor: SAVE/LOAD can run);
1 findings (lint findings or failed expectations, archives that differ, verify
mismatches, doctor: a part SAVE/LOAD needs is missing); 2 usage or archive
errors. Every error, click's own usage errors included, is one line on stderr
(``foundry: error: ...``) naming the file and field; with ``--json`` it is one
JSON object on stdout instead (nothing else is written there). Never a
traceback. Text from archives is shown as text, never as rich markup, with its
control characters escaped (:mod:`foundry.text`).
"""

from __future__ import annotations

import atexit
import functools
import gc
import os
import struct
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from foundry import __version__
from foundry.archive.sample import SAMPLE_NAME
from foundry.env import SAVE_ID
from foundry.errors import FoundryError
from foundry.text import plain, printable

if TYPE_CHECKING:  # the rest is imported where a command needs it: `foundry run` starts a program quickly
    from rich.console import Console

    from foundry.archive.reader import Archive
    from foundry.backends.registry import BackendRegistry

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR, EXIT_INTERNAL = 0, 1, 2, 70

ARCHIVE_HELP = f"an archive directory, or {SAMPLE_NAME} for the bundled sample"


def _stdout(**options: Any) -> Console:
    """Rich console on stdout; 120 columns when piped (rich would assume 80). Rich is imported here,
    once there is something to print: a large archive's graphs are being read by then."""
    from rich.console import Console

    width = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 120
    settings = {"soft_wrap": False, "highlight": False, "width": width, "markup": False, **options}
    return Console(**settings)  # archives' text is never markup


def _emit_json(data: Any) -> None:
    import json  # here, as in _fail: only --json and refusals write JSON

    click.echo(json.dumps(data, indent=1, default=str))


def _fail(message: str, code: int, as_json: bool, detail: dict | None = None) -> None:
    """The one refusal: a JSON object on stdout with ``--json``, else one line on stderr."""
    if as_json:
        import json

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
        except ModuleNotFoundError as err:  # this Python lacks a dependency: not Foundry's fault to report
            _fail(f"this Python ({sys.executable}) has no module {err.name or err}, which this command needs: "
                  "install it there (Foundry's own dependencies: pip install . in a checkout)", EXIT_ERROR, as_json,
                  {"error": "ModuleNotFoundError", "message": str(err), "module": err.name})  # fmt: skip
        except Exception as err:  # noqa: BLE001 - the last guard: one line, no traceback, a distinct code
            _fail(f"internal error: {type(err).__name__}: {err} (please report this)", EXIT_INTERNAL, as_json)
        sys.exit(code or EXIT_OK)

    return run


def open_archive(text: str) -> Archive:
    """The archive a command-line argument names (a directory or ``@sample``)."""
    from foundry.archive.named import open_named

    return open_named(text)


def _wants_json(args: list[str]) -> bool:
    """Whether the command line asks for ``--json`` (before any ``--``: after it is a program's)."""
    head = args[: args.index("--")] if "--" in args else args
    return "--json" in head


def _usage_line(err: click.UsageError) -> str:
    """Click's usage error as one line: what is wrong, and where the usage is."""
    text = " ".join(err.format_message().split()).removesuffix(".")
    text = text[:1].lower() + text[1:]
    path = err.ctx.command_path if err.ctx is not None else "foundry"
    where = "" if path == "foundry" else f"{path}: "
    return f"{where}{text} (see `{path} --help`)"


@functools.cache  # registered once, however many commands a process runs (the tests run many)
def _freeze_heap_at_exit() -> None:
    """Keep the interpreter's collections at exit from walking every object of the command's
    imports (some 40 ms once the output is written) for garbage the exit need not collect:
    ``gc.freeze`` only moves the objects out of the collector's sight (reference counting still
    frees them, and atexit handlers still run)."""
    atexit.register(gc.freeze)


class FoundryGroup(click.Group):
    """The root group: every usage error one line (or one JSON object), like every other refusal,
    and a subcommand typed without its group pointed to its place."""

    def main(self, args: list[str] | None = None, prog_name: str | None = None,  # type: ignore[override]
             standalone_mode: bool = True, **extra: Any) -> Any:  # fmt: skip
        args = sys.argv[1:] if args is None else list(args)
        if not standalone_mode:  # a caller that handles click's exceptions itself
            return super().main(args, prog_name, standalone_mode=False, **extra)
        _freeze_heap_at_exit()
        try:
            code = super().main(args, prog_name, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as err:  # a group without its command: the help it asks for
            click.echo(err.ctx.get_help())
            sys.exit(EXIT_OK)
        except click.UsageError as err:
            _fail(_usage_line(err), EXIT_ERROR, _wants_json(args), {"error": "UsageError", "message": _usage_line(err)})
        except click.ClickException as err:
            _fail(err.format_message(), EXIT_ERROR, _wants_json(args))
        except click.exceptions.Abort:
            click.echo("foundry: interrupted", err=True)
            sys.exit(130)
        sys.exit(code if isinstance(code, int) else EXIT_OK)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[Any, Any, list[str]]:
        name = args[0] if args else ""
        if name not in self.commands:
            for group_name, group in sorted(self.commands.items()):
                if isinstance(group, click.Group) and name in group.commands:
                    raise click.UsageError(f"no command {name!r}; did you mean `foundry {group_name} {name}`?",
                                           ctx=ctx)  # fmt: skip
        return super().resolve_command(ctx, args)


def _version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from foundry.runtime.native.hook import hook_status

    click.echo(f"foundry, version {__version__}; {hook_status()}")
    ctx.exit(EXIT_OK)


def _renderer() -> None:
    """Import what prints reports (rich above all), while a large archive's graphs are read."""
    import foundry.inspect.render  # noqa: F401


def _registry() -> BackendRegistry:
    from foundry.backends.registry import BackendRegistry

    return BackendRegistry.discover()


json_option = click.option("--json", "as_json", is_flag=True, help="machine-readable output on stdout")
rank_option = click.option("--rank", type=click.IntRange(min=0), default=None, help="only this rank")


@click.group(cls=FoundryGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_version,
              help="Show the version and whether the native hook is built, and exit.")  # fmt: skip
def main() -> None:
    """Foundry: inspect, lint and diff archives of persisted CUDA graphs; SAVE and LOAD them (foundry run).

    Errors are one line on stderr and exit 2 (with --json: one JSON object on stdout).
    `foundry doctor` says whether SAVE/LOAD can run on this machine."""


# -- archive ------------------------------------------------------------------------


@main.group()
def archive() -> None:
    """Whole-archive commands: inspect, diff, verify, strip, jit-caches."""


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
    from foundry.inspect.summary import summarize

    summary = summarize(open_archive(path), _registry, rank=rank, workers=None,  # every core
                        meanwhile=None if as_json else _renderer)  # fmt: skip
    if as_json:
        _emit_json(summary.to_dict())
    else:
        from foundry.inspect.render import render_summary

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
@click.argument("path", metavar="ARCHIVE")
@click.option("--keep-warmup", is_flag=True, help="keep the warm-up bytes a LOAD --warmup restore needs")
@click.option("--caches-only", is_flag=True,
              help="drop only the JIT caches (and with them any host code): PATH still LOADs, compiling at "
              "start-up")  # fmt: skip
@json_option
@guarded
def archive_strip(path: str, keep_warmup: bool, caches_only: bool, as_json: bool) -> int:
    """Drop module images, warm-up bytes and JIT caches to make ARCHIVE small, in place; it then inspects
    but no longer LOADs (with --caches-only it still LOADs). @sample is refused (it belongs to the
    package): strip a copy."""
    from foundry.archive.named import open_named, writable_path
    from foundry.archive.strip import strip

    removed = strip(open_named(writable_path(path, "strip")), keep_warmup=keep_warmup, caches_only=caches_only)
    if as_json:
        _emit_json({"ok": True, **removed})
    else:
        click.echo(f"stripped {path}: {removed['files']} files, {removed['bytes'] / 2**20:.1f} MiB removed")
    return EXIT_OK


@archive.command("jit-caches")
@click.argument("path", metavar="ARCHIVE")
@click.option("--into", "root", type=click.Path(file_okay=False), required=True,
              help="a directory of your own: the caches go below it, one per archive and trust level")  # fmt: skip
@click.option("--trust-cached-code", is_flag=True, help="install the host code among them too, as a LOAD with "
              "--trust-cached-code does (SGLang's JIT kernels, Inductor's wrappers, Triton's launchers)")  # fmt: skip
@json_option
@guarded
def archive_jit_caches(path: str, root: str, trust_cached_code: bool, as_json: bool) -> int:
    """Install the JIT caches ARCHIVE carries below a directory of yours, as a LOAD installs them
    below the JIT root, and print the variables that point the compilers at them, as shell lines
    (eval "$(foundry archive jit-caches A --into D)"): an engine started without Foundry then runs the
    archive's builds (to compare decode speed at equal kernels, or to warm a node's caches). Refused by
    field where this environment's versions differ from the ones they were built with; the GPU's
    architecture is compared only by a LOAD, once CUDA is up."""
    import shlex

    from foundry.archive.jit_schema import JitState
    from foundry.env import JIT_ROOT
    from foundry.runtime.launch.jit import load_caches

    if not root:
        raise click.BadParameter("an empty path", param_hint="--into")
    arch = open_archive(path)
    if arch.catalog.jit is None:
        raise FoundryError("the archive carries no JIT caches (saved with --no-jit-caches)", path=path)
    if arch.catalog.jit.state is JitState.STRIPPED:
        raise FoundryError("the archive's JIT caches were stripped", path=path)
    environ = {**os.environ, JIT_ROOT.name: str(Path(root).absolute())}
    variables = load_caches(arch, trust_host_code=trust_cached_code, environ=environ,
                            log=lambda line: click.echo(printable(line), err=True))  # fmt: skip
    if as_json:
        _emit_json({"ok": True, "environment": variables})
    else:
        for name, value in variables.items():
            click.echo(f"export {name}={shlex.quote(value)}")
    return EXIT_OK


@archive.command("verify")
@click.argument("path", metavar="ARCHIVE")
@json_option
@guarded
def archive_verify(path: str, as_json: bool) -> int:
    """Read every file, check every hash, re-check every graph and recompute its
    fingerprint and launch plan; module images, warm-up bytes and JIT cache files must match
    their records.

    Exits 0 when everything matches, 1 when a fingerprint or launch plan differs
    from its record, 2 when a file is missing, damaged or altered (the first one found)."""
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


def _lint_help() -> str:
    from foundry.inspect.lint import RULES

    rules = "\n".join(textwrap.fill(f"{name}: {rule.description}", 76, initial_indent="  ", subsequent_indent="      ")
                      for name, rule in RULES.items())  # fmt: skip
    return (
        "Check graphs against built-in rules and --expect counts.\n\n"
        f"\b\nRules:\n{rules}\n\n"
        "KIND is a node kind (kernel, memcpy, memset, ...) or a backend kind (symm-allreduce, nccl-allreduce, "
        "deepep-dispatch, ...: `foundry backends list`); kernel:GLOB counts the kernels whose name matches "
        "GLOB, as `graph show` lists it or mangled (kernel:fused_moe_kernel=96, 'kernel:*RMSNorm*=4'; GLOB is "
        "printable ASCII without spaces or '=': match those with ? or *). "
        "Errors and failed expectations fail the run; "
        "warnings fail it only with --strict. Exits 0 clean, 1 findings, 2 usage or archive error."
    )


class _LintCommand(click.Command):
    """``graph lint``, whose help lists the rules: made when it is shown, so that other commands
    (``foundry run`` above all) do not import the rules."""

    def format_help_text(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self.help = _lint_help()
        super().format_help_text(ctx, formatter)


@graph.command("lint", cls=_LintCommand, short_help="Check graphs against built-in rules and --expect counts.")
@click.argument("path", metavar="ARCHIVE")
@rank_option
@click.option("--graph", "pattern", default=None, metavar="GLOB", help="only graphs whose name matches")
@click.option(
    "--expect",
    "expects",
    multiple=True,
    metavar="KIND=N",
    help="KIND (or kernel:GLOB) occurs N times in every selected graph (repeatable)",
)
@click.option("--total", is_flag=True, help="expectations count over the whole selection instead")
@click.option("--disable", "disabled", multiple=True, metavar="RULE", help="turn a built-in rule off (repeatable)")
@click.option("--strict", is_flag=True, help="warnings fail the run too")
@click.option("--quiet", "-q", is_flag=True, help="print only what fails (and the summary line)")
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
    quiet: bool,
    as_json: bool,
) -> int:
    from foundry.inspect.lint import Expectation, lint

    expectations = [Expectation.parse(e) for e in expects]
    report = lint(
        open_archive(path),
        _registry(),
        rank=rank,
        pattern=pattern,
        expectations=expectations,
        total=total,
        disabled=disabled,
        workers=None,  # every core, on a large archive
        meanwhile=None if as_json else _renderer,
    )
    if as_json:
        _emit_json(report.to_dict(strict=strict))
    else:
        from foundry.inspect.render import render_lint

        render_lint(_stdout(), report, strict=strict, quiet=quiet)
    return EXIT_FINDINGS if report.failed(strict=strict) else EXIT_OK


@graph.command("show")
@click.argument("path", metavar="ARCHIVE")
@click.argument("name", metavar="GRAPH")
@click.option("--rank", type=click.IntRange(min=0), default=0, show_default=True)
@json_option
@guarded
def graph_show(path: str, name: str, rank: int, as_json: bool) -> int:
    """The node table of one graph. Piped, every column is printed in full; in a
    terminal, long cells wrap to the terminal's width."""
    from foundry.inspect.choose import graph_entry
    from foundry.inspect.render import node_rows, render_nodes

    arch = open_archive(path)
    ir = arch.graph(rank, graph_entry(arch, rank, name))
    if as_json:
        _emit_json(
            {
                "graph": ir.name,
                "rank": rank,
                "nodes": node_rows(ir),
                "edges": [[e.src, e.dst, e.data.type] for e in ir.edges()],
            }
        )
    elif sys.stdout.isatty():
        render_nodes(_stdout(), ir)
    else:  # a file or a pipe: no width to fit, so nothing is folded or cut
        render_nodes(_stdout(width=1 << 16), ir, full=True)
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
    help="write here (atomically) instead of stdout; its directory must exist",
)
@click.option("--rank", type=click.IntRange(min=0), default=0, show_default=True)
@guarded
def graph_export(path: str, name: str, fmt: str, output: Path | None, rank: int) -> int:
    """Export one graph as Graphviz DOT or GraphML."""
    from foundry.archive.files import atomic_write
    from foundry.graphir.passes.export import export
    from foundry.inspect.choose import graph_entry

    if output is not None and not output.parent.is_dir():  # refused before the graph is read
        raise FoundryError("the directory to write into does not exist (create it first)", path=str(output.parent),
                           field="--output")  # fmt: skip
    arch = open_archive(path)
    text = export(arch.graph(rank, graph_entry(arch, rank, name)), fmt)
    if output is None:
        click.echo(text, nl=False)
    else:
        atomic_write(output, text.encode())
        click.echo(f"wrote {output}", err=True)
    return EXIT_OK


# -- backends -----------------------------------------------------------------------


@main.group()
def backends() -> None:
    """Registered backends (entry-point group foundry.backends): list."""


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


@main.command("doctor")
@json_option
@guarded
def doctor(as_json: bool) -> int:
    """Whether SAVE/LOAD (foundry run) can run on this machine: the native hook, CUDA headers,
    driver and GPU, torch, cuda-bindings, zstandard, SGLang and its plugin, backends. Each
    missing part is named with its fix. Exits 0 when SAVE/LOAD can run here, 1 when not."""
    from rich.text import Text

    from foundry.runtime.launch.doctor import assess, gather, ready, report

    checks = assess(gather())
    if as_json:
        _emit_json(report(checks))
        return EXIT_OK if ready(checks) else EXIT_FINDINGS
    out = _stdout()
    styles = {"ok": "green", "missing": "red", "warning": "yellow", "info": "dim"}
    for c in checks:
        out.print(Text.assemble((f"{c.status:8}", styles.get(c.status, "")), f" {c.name}: {printable(c.detail)}"),
                  soft_wrap=True)  # fmt: skip
        if c.fix and c.status != "ok":
            out.print(f"         fix: {printable(c.fix)}", soft_wrap=True)
    missing = [c.name for c in checks if c.needed and c.status == "missing"]
    verdict = ("SAVE/LOAD can run here", "green") if not missing else (
        f"SAVE/LOAD cannot run here: {len(missing)} part(s) missing ({', '.join(missing)}); inspect, lint, diff and "
        "the TUI work without them", "red")  # fmt: skip
    out.print(Text(verdict[0], style=verdict[1]), soft_wrap=True)
    return EXIT_OK if not missing else EXIT_FINDINGS


def _address(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not an address (e.g. 0x600000000000)") from None


_SIZE_UNITS = {"": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def _region_size(text: str) -> int:
    """Bytes as a decimal or ``0x`` number, or a decimal count of a binary unit (``104GiB``);
    at least 1 GiB, the smallest region the hook reserves, and below the GPU's 128 TiB."""
    number = text.strip().lower()
    unit = next((u for u in _SIZE_UNITS if u and number.endswith(u)), "")
    digits = number.removesuffix(unit).strip()
    try:
        size = int(digits, 10 if unit else 0) * _SIZE_UNITS[unit]  # a unit takes a decimal count
    except ValueError:
        raise click.BadParameter(f"{text[:40]!r} is not a size (e.g. 111669149696, 0x1a00000000 or 104GiB)") from None
    if size < 1 << 30:
        raise click.BadParameter(f"{text[:40]!r} is below 1 GiB, the smallest region")
    if size >= 1 << 47:
        raise click.BadParameter(f"{text[:40]!r} is 128 TiB or more, more address space than a GPU maps")
    return size


@main.command("run", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--mode", type=click.Choice(["save", "load"]), required=True, help="capture and write, or restore")
@click.option("--archive", "archive_arg", required=True, metavar="ARCHIVE",
              help=f"the archive directory (LOAD: also {SAMPLE_NAME}, which it refuses as not loadable)")  # fmt: skip
@click.option("--region-base", callback=lambda c, p, v: None if v is None else _address(v), default=None,
              help="base address of the region; LOAD takes SAVE's unless given (then it relocates)")  # fmt: skip
@click.option("--region-size", callback=lambda c, p, v: None if v is None else _region_size(v), default=None,
              metavar="SIZE", help="bytes to reserve, 1 GiB to below 128 TiB: 111669149696, 0x1a00000000, or with "
              "a unit (KiB, MiB, GiB, TiB): 104GiB")  # fmt: skip
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
@click.option("--jit-caches-from", "jit_seed_arg", default=None, metavar="ARCHIVE",
              help="SAVE: start the priming run from ARCHIVE's JIT caches, installed as a LOAD installs them, "
              "so this SAVE reuses its builds (a second SAVE to compare with the first: builds differ each "
              "time); with --trust-cached-code, or the host code among them (SGLang's JIT kernels, Inductor's "
              "outputs) is built again")  # fmt: skip
@click.option("--trust-cached-code", is_flag=True,
              help="LOAD, and SAVE with --jit-caches-from: also install the caches' host code (shared objects, "
              "Python, pickles, build files): code taken from the archive then runs in the program. Off by "
              "default, like other tools' 'trust remote code' switches; only for archives you made or "
              "trust")  # fmt: skip
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@guarded
def run(mode: str, archive_arg: str, region_base: int | None, region_size: int | None, warmup: str, rank: int,
        world_size: int, builder: str, build_threads: int, instantiate: str, overwrite: bool, keep_aslr: bool,
        save_runs: int, region_threads: str, jit_caches: bool, jit_seed_arg: str | None, trust_cached_code: bool,
        command: tuple[str, ...]) -> int:  # fmt: skip
    """Run COMMAND (after --) with the native hook and a SAVE or LOAD session.

    The program opens the session with foundry.runtime.open_session(); the exit
    code is the program's. A SAVE runs it --save-runs times (fresh processes) and
    keeps the first run's archive, marked with the bytes the runs disagree on. A
    LOAD checks the archive before the program starts (readable, complete, format
    versions, what can be compared without a GPU) and fails (exit 2) when the
    program never opened a session."""
    from foundry.archive.named import archive_path, writable_path
    from foundry.runtime.launch import launcher

    archive = archive_path(archive_arg) if mode == "load" else writable_path(archive_arg, "a SAVE")

    if rank >= world_size and mode == "save":
        raise click.BadParameter(f"rank {rank} is not below the world size {world_size}", param_hint="--rank")
    if instantiate == "background" and builder != "native":
        raise click.BadParameter("background instantiation needs --builder native", param_hint="--instantiate")
    if jit_seed_arg is not None and (mode != "save" or not jit_caches or world_size > 1):
        this = "a LOAD" if mode != "save" else "a SAVE with --no-jit-caches" if not jit_caches else "a SAVE of ranks"
        raise click.BadParameter(f"a SAVE of one process that records JIT caches starts from another archive's; "
                                 f"this is {this}", param_hint="--jit-caches-from")  # fmt: skip
    jit_seed = None if jit_seed_arg is None else archive_path(jit_seed_arg)
    config = launcher.RunConfig(mode, archive, region_base, region_size, warmup, rank, world_size,
                                fixed_layout=not keep_aslr, instantiate=instantiate,
                                builder=builder, build_threads=build_threads, overwrite=overwrite,
                                region_threads=region_threads, jit_caches=jit_caches,
                                trust_cached_code=trust_cached_code, jit_seed=jit_seed)  # fmt: skip
    try:
        return launcher.run(config, list(command), save_runs=save_runs, log=lambda line: click.echo(line, err=True),
                            replace_process=True)  # fmt: skip
    except FileNotFoundError:
        raise FoundryError("command not found", found=command[0]) from None


if __name__ == "__main__":  # pragma: no cover
    main()

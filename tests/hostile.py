"""Running the real ``foundry`` command on tampered archives, and judging its answer.

A refusal is one line on stderr and exit status 2; with ``--json`` it is one JSON
object on stdout (and nothing else there) and exit status 2. :func:`assert_refused`
checks exactly that, and that no control character reaches the terminal.

Commands run in real processes. Starting an interpreter and importing Foundry
costs about half a second, too much for fuzzing, so :class:`CommandServer` starts
one process that imports the CLI once and forks a child per command: each child
is a process of its own whose exit status, stdout, stderr and peak RSS are what
a shell would see (``wait4`` reports them), and one that hangs is killed at its
timeout and reported as such.

:func:`edit_document` edits a graph document as plain MessagePack data (below the
typed decoding, so it can write what the IR would never hold) and re-seals the
archive so every check before the one under test passes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from foundry.archive import Archive, ArchiveWriter
from foundry.archive.sample import sample_path
from foundry.archive.schema import CATALOG_FILE, WarmupBytes

from .archive_tools import edit_json, graph_file, reseal
from .conftest import FIXTURES

ROOT = Path(__file__).resolve().parent.parent
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # what may not reach a terminal (\t and \n aside)


@dataclass(frozen=True)
class Outcome:
    """What one command did: exit status, output, peak RSS (KiB), whether it was killed at its timeout."""

    argv: tuple[str, ...]
    rc: int
    stdout: str
    stderr: str
    maxrss_kib: int = 0
    timed_out: bool = False

    def __str__(self) -> str:
        head = f"foundry {' '.join(self.argv)} -> {self.rc}"
        return f"{head}\nstdout: {self.stdout[-2000:]}\nstderr: {self.stderr[-2000:]}"


_SERVER = r"""
import json, os, resource, signal, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
from foundry.cli import main as foundry_main
from foundry.tui.app import main as tui_main
protocol = os.fdopen(os.dup(1), "w")
for line in sys.stdin:
    request = json.loads(line)
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    pid = os.fork()
    if pid == 0:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        os.chdir(request["cwd"])
        sys.argv = [request["prog"], *request["argv"]]
        code = 70
        try:
            if request["prog"] == "foundry":
                foundry_main()
                code = 0
            else:
                code = tui_main(request["argv"])
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
        except BaseException:
            import traceback
            traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    deadline = time.monotonic() + request["timeout"]
    timed_out = False
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            done, status, usage = os.wait4(pid, 0)
            timed_out = True
            break
        time.sleep(0.002)
    rc = os.waitstatus_to_exitcode(status)
    texts = []
    for f in (out, err):
        f.seek(0)
        texts.append(f.read().decode("utf-8", "replace"))
        f.close()
    protocol.write(json.dumps({"rc": rc, "stdout": texts[0], "stderr": texts[1], "maxrss_kib": usage.ru_maxrss,
                               "timed_out": timed_out}) + "\n")
    protocol.flush()
"""


class CommandServer:
    """One process that has imported the CLI; :meth:`run` forks a child per command."""

    def __init__(self) -> None:
        env = {**os.environ, "COLUMNS": "120"}
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(ROOT)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip

    def run(self, *argv: str | os.PathLike, timeout: float = 60, cwd: Path | None = None,
            prog: str = "foundry") -> Outcome:  # fmt: skip
        """``foundry ARGV...`` (or ``foundry-tui`` with ``prog``) in a fresh child process."""
        args = [str(a) for a in argv]
        request = {"argv": args, "timeout": timeout, "cwd": str(cwd or ROOT), "prog": prog}
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        return Outcome(tuple(args), reply["rc"], reply["stdout"], reply["stderr"], reply["maxrss_kib"],
                       reply["timed_out"])  # fmt: skip

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


def run_foundry(*argv: str | os.PathLike, timeout: float = 120) -> Outcome:
    """``python -m foundry ARGV...`` as a fresh interpreter (peak RSS from ``RUSAGE_CHILDREN`` is not
    separable per call here; use :class:`CommandServer` for that)."""
    args = [str(a) for a in argv]
    proc = subprocess.run([sys.executable, "-m", "foundry", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, "COLUMNS": "120"})  # fmt: skip
    return Outcome(tuple(args), proc.returncode, proc.stdout, proc.stderr)


def assert_refused(outcome: Outcome, match: str | None = None) -> str:
    """A refusal as the CLI promises it; returns the error text (the line, or the JSON message)."""
    assert not outcome.timed_out, f"hung: {outcome}"
    assert outcome.rc == 2, str(outcome)
    assert "Traceback" not in outcome.stdout + outcome.stderr, str(outcome)
    if "--json" in outcome.argv:
        payload = json.loads(outcome.stdout)  # one JSON object and nothing else
        assert isinstance(payload, dict) and payload["ok"] is False, str(outcome)
        assert outcome.stderr == "", str(outcome)
        text = payload["error"]["message"]
        shown = json.dumps(payload)
    else:
        lines = outcome.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("foundry: error: "), str(outcome)
        assert outcome.stdout == "" or outcome.argv[:2] == ("graph", "export"), str(outcome)
        text = shown = lines[0]
    assert not CONTROL.search(shown), f"control characters reach the terminal: {shown!r}"
    assert "internal error" not in shown, str(outcome)
    if match is not None:
        assert re.search(match, shown), f"{match!r} not in {shown!r}"
    return text


def assert_clean_output(outcome: Outcome) -> None:
    """A command that did not refuse: exit 0 or 1, and nothing a terminal would execute."""
    assert not outcome.timed_out, f"hung: {outcome}"
    assert outcome.rc in (0, 1), str(outcome)
    assert not CONTROL.search(outcome.stdout + outcome.stderr), str(outcome)


def edit_document(root: Path, name: str, edit: Callable[[dict[str, Any]], None], *, rank: int = 0,
                  seal: bool = True) -> None:  # fmt: skip
    """Edit graph ``name``'s MessagePack document as plain data, write it back, re-seal (fingerprints
    are recomputed where the edited graph still decodes, so only the check under test can object)."""
    path = graph_file(root, name, rank)
    document = msgspec.msgpack.decode(path.read_bytes())
    edit(document)
    path.write_bytes(msgspec.msgpack.encode(document))
    if seal:
        reseal(root)


def first_kernel(document: dict[str, Any]) -> dict[str, Any]:
    return next(n for n in document["nodes"] if n["type"] == "kernel")


#: Markup that breaks a rich console, a screen clear, a window-title OSC sequence and a
#: right-to-left override: what a hostile archive puts in its names.
HOSTILE = "[/][/bold]\x1b[2J\x1b]0;all ok\x07\u202e"


def hostile_names(root: Path) -> Path:
    """A copy of the sample at ``root`` where every kind of string the archive holds carries
    :data:`HOSTILE`: catalog fields and model, a graph name and runner, kernel names, a
    region name and graph metadata; re-sealed, so every command reads all of it."""
    shutil.copytree(sample_path(), root)
    renamed = "decode" + HOSTILE

    def catalog(c: dict[str, Any]) -> None:
        c["tool_version"] += HOSTILE
        c["environment"]["gpu_name"] += HOSTILE
        c["model"] = {"model": HOSTILE, HOSTILE: "x"}

    def session(s: dict[str, Any]) -> None:
        s["graphs"][0].update(name=renamed, runner=HOSTILE)

    def document(d: dict[str, Any]) -> None:
        first_kernel(d)["kernel"]["name"] += HOSTILE
        d["regions"][0]["name"] += HOSTILE
        d["meta"][HOSTILE] = HOSTILE

    edit_document(root, "decode.bs2", document, seal=False)
    edit_document(root, "decode.bs1", lambda d: (document(d), d.update(name=renamed)), seal=False)
    edit_json(root / "rank0" / "session.json", session)
    edit_json(root / CATALOG_FILE, catalog, root=root, graphs=True)
    return root


WARMUP = bytes(range(256)) * 256  # 64 KiB the warm-up left in the region


def saved_archive(root: Path) -> Path:
    """A SAVE as the hook writes it, at ``root``: the graphs and region record of a real H200
    SAVE (``tests/fixtures/saveload-a``), three module images (state complete) and the
    warm-up bytes (``rank0/warmup.bin``)."""
    source = Archive.open(FIXTURES / "saveload-a")
    writer = ArchiveWriter(root, environment=source.catalog.environment, model={"model": "tiny-qwen3"})
    for i in range(3):
        writer.add_module(b"\x7fELF" + bytes([i]) * 4096, format="cubin")
    rank = writer.rank(0)
    for entry in source.entries(0):
        rank.add_graph(source.graph(0, entry), shape_key=entry.shape_key, runner=entry.runner)
    digest = rank.add_file("warmup.bin", WARMUP)
    region = source.session(0).region
    warm = WarmupBytes("warmup.bin", digest, region.warmup_offset - len(WARMUP), len(WARMUP), 3, 0)
    rank.set_region(msgspec.structs.replace(region, warmup_bytes=warm))
    rank.seal()
    writer.commit()
    return root

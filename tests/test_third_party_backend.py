"""A third-party backend package, installed for real with pip into a directory of
its own: listed by `foundry backends list`, counted by `lint --expect`, required by
LOAD when an archive records its state, and missed by name once it is gone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from foundry.archive import Archive

from .archive_tools import edit_json
from .conftest import FIXTURES

PACKAGE = Path(__file__).resolve().parent / "example_backend"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("site")
    build = tmp_path_factory.mktemp("build")
    shutil.copytree(PACKAGE, build / "pkg")
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(build / "pkg")]
    proc = subprocess.run([*cmd, "--no-build-isolation"], capture_output=True, text=True)
    if proc.returncode != 0:  # no setuptools in this environment: let pip fetch it
        proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert list(target.glob("foundry_example_backend-*.dist-info"))
    return target


def foundry(*args: str, site: Path | None = None) -> subprocess.CompletedProcess:
    paths = [str(site)] if site else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, str(ROOT)])}
    return subprocess.run([sys.executable, "-m", "foundry", *args], capture_output=True, text=True, env=env)


def test_listed_and_counted_once_installed(installed):
    rows = {r["name"]: r for r in json.loads(foundry("backends", "list", "--json", site=installed).stdout)}
    assert rows["example-gemm"]["status"] == "ok" and rows["example-gemm"]["kinds"] == ["example-gemm"]
    assert "foundry_example_backend" in rows["example-gemm"]["origin"]
    ir = Archive.open(FIXTURES / "saveload-a").graph(0, "decode.bs1")
    gemms = sum(1 for node in ir.kernels() if node.kernel.name.startswith("nvjet_"))
    assert gemms > 0
    lint = foundry("graph", "lint", str(FIXTURES / "saveload-a"), "--graph", "decode.bs1",
                   "--expect", f"example-gemm={gemms}", "--json", site=installed)  # fmt: skip
    report = json.loads(lint.stdout)
    (expectation,) = report["expectations"]
    assert expectation["kind"] == "example-gemm" and expectation["found"] == gemms and expectation["ok"], report
    wrong = foundry("graph", "lint", str(FIXTURES / "saveload-a"), "--graph", "decode.bs1",
                    "--expect", f"example-gemm={gemms + 1}", site=installed)  # fmt: skip
    assert wrong.returncode == 1


def test_gone_once_uninstalled():
    rows = {r["name"] for r in json.loads(foundry("backends", "list", "--json").stdout)}
    assert "example-gemm" not in rows
    lint = foundry("graph", "lint", str(FIXTURES / "saveload-a"), "--expect", "example-gemm=6")
    assert lint.returncode == 2 and "unknown kind 'example-gemm'" in lint.stderr


def load_refusal(archive: Path, site: Path | None) -> str:
    code = ("import sys\nfrom foundry.runtime.sessions.load import LoadSession\n"
            "from foundry.errors import FoundryError\n"
            f"try:\n    LoadSession({str(archive)!r})\nexcept FoundryError as e:\n    print(e)\n")  # fmt: skip
    paths = [str(site)] if site else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, str(ROOT)])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_an_archive_that_records_its_state_needs_it_at_load(installed, tmp_path):
    archive = tmp_path / "a"
    shutil.copytree(FIXTURES / "saveload-a", archive)
    state = {"backend": "example-gemm", "version": 1, "record": {"world_size": 1}}
    edit_json(archive / "rank0" / "session.json", lambda s: s.update(backends=[state]), root=archive)
    missing = load_refusal(archive, None)
    assert "archive needs backend 'example-gemm', which is not installed" in missing
    present = load_refusal(archive, installed)  # installed, but it only recognises: refused by what it lacks
    assert "backend 'example-gemm' cannot validate or relocate yet" in present


CLAIMS = """
from foundry.errors import DriftError
from foundry.runtime.sessions.load import LoadSession
session = LoadSession({archive!r})
graphs = [session.archive.graph(0, entry) for entry in session.record.graphs]
try:
    session._check_claims(graphs)  # what LOAD checks before any GPU work
    print("restored")
except DriftError as err:
    print(err.path, err.node, err)
"""


def test_a_graph_running_its_kernels_without_its_state_is_refused_at_load(installed):
    """The example backend claims cuBLAS's nvjet kernels and, like every backend that
    does not say otherwise, needs its recorded state at LOAD: the H200 SAVE runs
    nvjet kernels but records no example-gemm state, so once the backend is installed
    LOAD refuses it by name; without the backend nothing claims them."""
    code = CLAIMS.format(archive=str(FIXTURES / "saveload-a"))

    def run(site: Path | None) -> str:
        paths = [str(site)] if site else []
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, str(ROOT)])}
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    assert run(None) == "restored"
    refused = run(installed)
    graph, node, message = refused.split(" ", 2)
    first = next(n for n in Archive.open(FIXTURES / "saveload-a").graph(0, graph).kernels()
                 if n.kernel.name.startswith("nvjet_"))  # fmt: skip
    assert int(node) == first.id
    assert "runs example-gemm kernels, but SAVE recorded no 'example-gemm' state" in message

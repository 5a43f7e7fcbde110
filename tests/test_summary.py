"""``foundry archive inspect`` (foundry/inspect/summary.py): what a LOAD of the H200 SAVE
relies on."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from foundry.archive import Archive

from .archive_tools import edit_json
from .conftest import SAVE_A


def test_inspect_reports_what_a_load_relies_on():
    out = subprocess.run([sys.executable, "-m", "foundry", "archive", "inspect", str(SAVE_A), "--json"],
                         capture_output=True, text=True)  # fmt: skip
    data = json.loads(out.stdout)
    (facts,) = data["restore"]
    assert facts["region"]["base"] == "0x600000000000" and facts["region"]["warmup_allocations"] == 11
    assert facts["region"]["late_allocations"] == 0 and facts["images"] == 27 and facts["globals_unknown"] == []
    assert [g["graph"] for g in data["graphs"] if g["rng"]] == ["sample.bs8"]
    assert all(g["undefined_bytes"] > 0 for g in data["graphs"])
    assert facts["globals_per_process"] == []


def test_inspect_names_globals_that_hold_the_processs_host_addresses(archive_copy):
    # the H200 SAVE with one written global given host words, as NVSHMEM's device state gets them
    path = archive_copy("saveload-a")
    session = path / "rank0" / "session.json"

    def give_host_words(s: dict) -> None:
        s["format_version"] = 3
        wide = next(g for image in s["images"] for g in image["globals"] if g["size"] >= 16)
        wide["host_words"] = [8]

    edit_json(session, give_host_words, root=path)
    out = subprocess.run([sys.executable, "-m", "foundry", "archive", "inspect", str(path)],
                         capture_output=True, text=True, env={**os.environ, "COLUMNS": "400"})  # fmt: skip
    assert out.returncode == 0, out.stderr
    wide = next(g for i in Archive.open(path).session(0).images for g in i.globals if g.host_words)
    assert f"LOAD needs the application's own loaded copy): {wide.name}" in out.stdout

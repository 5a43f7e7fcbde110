"""The one distribution: pyproject.toml lists every package of foundry/ and of tui/
(shipped as foundry.tui), and the files the offline commands and the TUI need ship as
package data."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _packages(folder: Path, name: str) -> set[str]:
    return {".".join((name, *p.parent.relative_to(folder).parts)) for p in folder.rglob("__init__.py")}


def test_every_package_directory_is_listed():
    tools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert tools["package-dir"] == {"foundry.tui": "tui"}
    found = _packages(ROOT / "foundry", "foundry") | _packages(ROOT / "tui", "foundry.tui")
    assert set(tools["packages"]) == found and len(tools["packages"]) == len(found)
    assert not (ROOT / "foundry" / "tui").exists()  # the TUI lives beside the library, not in it


def test_the_tui_styles_and_the_sample_ship_as_package_data():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert data["foundry.tui"] == ["*.tcss"] and list((ROOT / "tui").glob("*.tcss"))
    shipped = {p.relative_to(ROOT / "foundry") for pattern in data["foundry"] for p in (ROOT / "foundry").glob(pattern)}
    sample = {p.relative_to(ROOT / "foundry") for p in (ROOT / "foundry" / "samples").rglob("*") if p.is_file()}
    assert sample and sample <= shipped


def test_the_tui_imports_as_foundry_tui_with_its_styles_beside_it():
    """Editable (tui/ of this checkout) or installed (foundry/tui/ in site-packages)."""
    import foundry.tui.app

    here = Path(foundry.tui.app.__file__).resolve().parent
    assert here == ROOT / "tui" or here.parts[-2:] == ("foundry", "tui")
    assert (here / foundry.tui.app.FoundryApp.CSS_PATH).is_file()

"""The package's import structure, read from the syntax tree of every module (imports
inside functions and under ``TYPE_CHECKING`` included): rooms import only downward
in the order docs/architecture.md describes, ``graphir`` imports nothing of Foundry
but itself and ``errors``, and no two modules import each other, directly or not."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parent.parent

#: The rooms, lowest first: a module may import its own room and the rooms below it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("foundry", "foundry.errors", "foundry.env", "foundry.text")),
    ("graphir", ("foundry.graphir",)),
    ("archive", ("foundry.archive",)),
    ("backends", ("foundry.backends",)),
    ("inspect", ("foundry.inspect",)),
    ("runtime", ("foundry.runtime",)),
    ("integrations", ("foundry.integrations",)),
    ("cli", ("foundry.cli", "foundry.__main__")),
    ("tui", ("foundry.tui",)),
)
#: Inside runtime/, the same rule between its sub-packages (the package itself re-exports the sessions).
RUNTIME_LAYERS: tuple[str, ...] = (
    "foundry.runtime.threads",
    "foundry.runtime.host_maps",
    "foundry.runtime.native",
    "foundry.runtime.code",
    "foundry.runtime.graphs",
    "foundry.runtime.sessions",
    "foundry.runtime.launch",
    "foundry.runtime",
)
#: Where each top-level source folder's modules live in the package.
SOURCES = {"foundry": ROOT / "foundry", "foundry.tui": ROOT / "tui"}


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((package, *parts))
            found[name.removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def _imported(name: str, path: Path) -> set[str]:
    """Every Foundry module ``name`` imports, wherever in the module the import is."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:  # `from pkg import module` imports the module
                submodule = f"{source}.{alias.name}"
                out.add(submodule if submodule in MODULES else source)
    return {m for m in out if m == "foundry" or m.startswith("foundry.")}


IMPORTS = {name: _imported(name, path) for name, path in MODULES.items()}


def _rank(name: str, layers: tuple[tuple[str, tuple[str, ...]], ...]) -> int:
    best = None
    for index, (_, prefixes) in enumerate(layers):
        for prefix in prefixes:
            exact = prefix in ("foundry",)
            if name == prefix or (not exact and name.startswith(prefix + ".")):
                length = len(prefix)
                if best is None or length > best[1]:
                    best = (index, length)
    assert best is not None, f"{name} belongs to no layer"
    return best[0]


def layer_of(name: str) -> int:
    return _rank(name, LAYERS)


def runtime_layer_of(name: str) -> int:
    return _rank(name, tuple((p, (p,)) for p in RUNTIME_LAYERS))


def test_every_module_belongs_to_a_layer():
    assert len(MODULES) > 100
    for name in MODULES:
        layer_of(name)
        if name.startswith("foundry.runtime"):
            runtime_layer_of(name)


def test_no_room_imports_a_room_above_it():
    upward = []
    for name, imported in IMPORTS.items():
        for target in imported:
            if target not in MODULES:
                upward.append(f"{name} imports {target}, which does not exist")
            elif layer_of(target) > layer_of(name):
                upward.append(f"{name} ({LAYERS[layer_of(name)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})")
            elif (name.startswith("foundry.runtime") and target.startswith("foundry.runtime")
                  and runtime_layer_of(target) > runtime_layer_of(name)):  # fmt: skip
                upward.append(f"{name} imports {target}, a runtime room above its own")
    assert upward == []


def test_graphir_imports_nothing_of_foundry_but_itself_and_errors():
    """Errors and the text they print (foundry.text, which errors itself uses) are the base room's."""
    outside = {
        f"{name} imports {target}"
        for name, imported in IMPORTS.items()
        if name.startswith("foundry.graphir")
        for target in imported
        if not (target.startswith("foundry.graphir") or target in ("foundry.errors", "foundry.text"))
    }
    assert outside == set()


def test_no_import_cycles_among_modules():
    graph = nx.DiGraph()
    graph.add_nodes_from(MODULES)
    graph.add_edges_from((name, target) for name, imported in IMPORTS.items() for target in imported if target != name)
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert cycles == []


def test_nothing_in_the_library_imports_the_tui():
    users = {name for name, imported in IMPORTS.items() if not name.startswith("foundry.tui")
             for target in imported if target.startswith("foundry.tui")}  # fmt: skip
    assert users == set()


@pytest.mark.parametrize(
    ("module", "text", "expected"),
    [
        ("foundry.graphir.demo", "from foundry.runtime.sessions.load import LoadSession", "upward"),
        ("foundry.graphir.demo", "def f():\n    from foundry.inspect import lint", "upward"),
        ("foundry.graphir.demo", "if TYPE_CHECKING:\n    import foundry.archive.reader", "upward"),
        ("foundry.runtime.native.demo", "from foundry.runtime.sessions import base", "runtime"),
        ("foundry.inspect.demo", "from ..graphir import graph", "ok"),
    ],
)
def test_the_checks_see_every_kind_of_import(tmp_path, module, text, expected):
    """The checks read imports the way Python resolves them: in functions, under
    TYPE_CHECKING, relative ones, and `from package import module`."""
    path = tmp_path / "demo.py"
    path.write_text(text + "\n")
    imported = _imported(module, path)
    assert imported, text
    upward = any(layer_of(t) > layer_of(module) for t in imported)
    inner = any(module.startswith("foundry.runtime") and t.startswith("foundry.runtime")
                and runtime_layer_of(t) > runtime_layer_of(module) for t in imported)  # fmt: skip
    assert (upward, inner) == (expected == "upward", expected == "runtime")


def test_the_architecture_page_names_every_module():
    """docs/architecture.md gives every module a sentence; a new one is added there too."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    files = [*(ROOT / "foundry").rglob("*.py"), *(ROOT / "tui").rglob("*.py"), *(ROOT / "native").rglob("*.[ch]")]
    missing = sorted(str(p.relative_to(ROOT)) for p in files if f"`{p.relative_to(ROOT)}`" not in page)
    assert missing == []
    assert "base (foundry, errors, env, text) < " + " < ".join(name for name, _ in LAYERS[1:]) in page
    assert "inside runtime/: " in page and " < ".join(p.rpartition(".")[2] for p in RUNTIME_LAYERS[:-1]) in page

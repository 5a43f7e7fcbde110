"""The ``FOUNDRY_*`` environment contract (foundry/env.py): one table of variables,
written by the launcher and read back, by real child processes started through the
launcher's environment, the same on every side: the contract itself, the session
options, the SGLang and vLLM plugins' configurations and the native hook's parsers."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foundry.archive import Archive
from foundry.env import (
    BUILDERS,
    INSTANTIATE_MODES,
    LOAD_CAPTURES,
    MODES,
    THREAD_POLICIES,
    VARIABLES,
    WARMUP_MODES,
    Kind,
    Reader,
    RunEnvironment,
    Written,
)
from foundry.errors import FoundryError
from foundry.runtime.launch import launcher

from .conftest import FIXTURES

ROOT = Path(__file__).resolve().parent.parent
HEADER = ROOT / "native" / "include" / "foundry_env.h"
SAVE_A = FIXTURES / "saveload-a"


def test_every_variable_is_listed_once_with_its_meaning():
    fields = list(RunEnvironment.__dataclass_fields__)
    assert list(VARIABLES) == fields
    names = [v.name for v in VARIABLES.values()]
    assert len(set(names)) == len(names) and all(re.fullmatch(r"FOUNDRY_[A-Z_]+", n) for n in names)
    for field, variable in VARIABLES.items():
        assert variable.name == "FOUNDRY_" + field.upper() and variable.meaning
        assert (variable.kind is Kind.CHOICE) == bool(variable.choices)
        assert RunEnvironment.__dataclass_fields__[field].default == variable.default


def _header_defaults() -> dict[str, int]:
    """The numbers the hook uses for unset variables, as the header spells them."""
    out = {}
    for name, text in re.findall(r"^#define (FOUNDRY_ENV_DEFAULT_[A-Z_]+) (.+)$", HEADER.read_text(), flags=re.M):
        shifted = re.fullmatch(r"\((\d+)ULL << (\d+)\)", text.strip())
        out[name] = int(shifted[1]) << int(shifted[2]) if shifted else int(text.strip().removesuffix("ULL"), 0)
    return out


def _header_defines() -> dict[str, str]:
    text = HEADER.read_text()
    return dict(re.findall(r'^#define (FOUNDRY_ENV_[A-Z_]+) "([^"]*)"', text, flags=re.M))


def test_the_header_names_the_variables_the_hook_reads_and_their_words():
    defines = _header_defines()
    names = {k.removeprefix("FOUNDRY_ENV_"): v for k, v in defines.items() if v.startswith("FOUNDRY_")}
    hooks = {field.upper(): v.name for field, v in VARIABLES.items() if Reader.HOOK in v.readers}
    assert names == hooks
    words = {k: v for k, v in defines.items() if not v.startswith("FOUNDRY_")}
    assert [words[f"FOUNDRY_ENV_MODE_{m.upper()}"] for m in MODES] == list(MODES)
    assert [words[f"FOUNDRY_ENV_THREADS_{t.upper()}"] for t in THREAD_POLICIES] == list(THREAD_POLICIES)
    assert words["FOUNDRY_ENV_FLAG_ON"] == "1" and words["FOUNDRY_ENV_CAPTURES_ALLOW"] == LOAD_CAPTURES.on


def _values() -> st.SearchStrategy[RunEnvironment]:
    paths = st.none() | st.sampled_from([Path("/srv/a"), Path("/tmp/x y"), Path("relative/dir")])
    numbers = st.none() | st.integers(0, (1 << 64) - 1)
    return st.builds(
        RunEnvironment,
        mode=st.sampled_from(MODES), archive=paths, rank=st.integers(0, 1 << 20), world_size=st.integers(0, 64),
        load_warmup=st.sampled_from(WARMUP_MODES), builder=st.sampled_from(BUILDERS),
        build_threads=st.integers(0, 64), instantiate=st.sampled_from(INSTANTIATE_MODES), relocate=st.booleans(),
        overwrite=st.booleans(), save_id=st.none() | st.text("abc.-_09", min_size=1, max_size=8),
        save_first_run=paths, layout_pad=st.integers(0, 9000), region_base=numbers, region_size=numbers,
        region_threads=st.sampled_from(THREAD_POLICIES), hook_echo=st.booleans(), hook_symbols=st.booleans(),
        load_captures=st.booleans(), import_base=numbers, hook_lib=paths, sglang_config=paths, sglang_report=paths,
        session_marker=paths, session_pid=st.none() | st.integers(0, 1 << 22),
        sglang_gc=st.sampled_from(("skip", "keep")),
    )  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(_values())
def test_what_is_written_reads_back_the_same(run):
    env = run.to_env()
    assert RunEnvironment.from_env(env) == run
    always = {v.name for v in VARIABLES.values() if v.written is Written.ALWAYS and v.default is not None}
    assert always <= set(env)


def test_bad_text_is_refused_naming_the_variable():
    cases = {"FOUNDRY_MODE": ("restore", "unknown mode"), "FOUNDRY_RANK": ("one", "FOUNDRY_RANK must be a rank number"),
             "FOUNDRY_BUILD_THREADS": ("-2", "must be a number"), "FOUNDRY_REGION_BASE": ("high", "not a number"),
             "FOUNDRY_BUILDER": ("fast", "unknown graph builder"),
             "FOUNDRY_REGION_THREADS": ("all", "unknown region threads policy")}  # fmt: skip
    for name, (text, message) in cases.items():
        with pytest.raises(FoundryError, match=message) as err:
            RunEnvironment.from_env({name: text})
        assert err.value.field == name and err.value.found == text
    with pytest.raises(FoundryError) as err:
        RunEnvironment(builder="fast")
    assert err.value.field == "FOUNDRY_BUILDER"


def test_per_run_variables_are_removed_unless_the_run_sets_them():
    inherited = {"FOUNDRY_LAYOUT_PAD": "....", "FOUNDRY_SAVE_FIRST_RUN": "/old", "FOUNDRY_SAVE_ID": "kept",
                 "FOUNDRY_REGION_BASE": "0x500000000000", "OTHER": "x"}  # fmt: skip
    env = RunEnvironment(mode="save", archive=Path("/a")).apply(inherited)
    assert "FOUNDRY_LAYOUT_PAD" not in env and "FOUNDRY_SAVE_FIRST_RUN" not in env
    assert env["FOUNDRY_SAVE_ID"] == "kept" and env["FOUNDRY_REGION_BASE"] == "0x500000000000" and env["OTHER"] == "x"
    again = RunEnvironment(mode="save", archive=Path("/a"), layout_pad=2, region_base=0x600000000000).apply(inherited)
    assert again["FOUNDRY_LAYOUT_PAD"] == ".." and again["FOUNDRY_REGION_BASE"] == "0x600000000000"


# -- literals ------------------------------------------------------------------------------

NAME = re.compile(r"FOUNDRY_[A-Z][A-Z0-9_]*")


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def python_literals(pattern: re.Pattern[str], roots: tuple[Path, ...]) -> dict[str, set[str]]:
    """Every match of ``pattern`` in a string literal (docstrings aside) of the modules
    under ``roots``, by file."""
    out: dict[str, set[str]] = {}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            tree = ast.parse(path.read_text())
            skip = _docstrings(tree)
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                    hits = set(pattern.findall(node.value))
                    if hits:
                        out.setdefault(str(path.relative_to(ROOT)), set()).update(hits)
    return out


def c_literals(pattern: re.Pattern[str], paths: list[Path]) -> dict[str, set[str]]:
    """Every match of ``pattern`` in a string literal of C sources, comments aside."""
    out: dict[str, set[str]] = {}
    token = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\])*"', re.S)
    for path in paths:
        for match in token.finditer(path.read_text()):
            text = match.group(0)
            if text.startswith('"') and pattern.search(text):
                out.setdefault(str(path.relative_to(ROOT)), set()).update(pattern.findall(text))
    return out


def test_variable_names_are_spelled_only_in_the_contract_and_the_header():
    python = python_literals(NAME, (ROOT / "foundry", ROOT / "tui"))
    assert set(python) == {"foundry/env.py"}
    assert python["foundry/env.py"] == {v.name for v in VARIABLES.values()}
    sources = sorted((ROOT / "native").rglob("*.[ch]"))
    native = c_literals(NAME, sources)
    assert set(native) == {"native/include/foundry_env.h"}
    calls = {str(p.relative_to(ROOT)) for p in sources if "getenv(" in p.read_text()}
    assert calls == {"native/src/config.c"}


def test_the_literal_checks_see_what_they_look_for(tmp_path):
    (tmp_path / "a.py").write_text('"""Mentions FOUNDRY_MODE."""\nx = "FOUNDRY_RANK"\ny = f"{x} and FOUNDRY_ARCHIVE"\n')
    (tmp_path / "b.c").write_text('/* FOUNDRY_MODE */\nconst char *s = "a" "FOUNDRY_RANK=%s";\n// "FOUNDRY_X"\n')
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert python_literals(NAME, (tmp_path,)) == {"a.py": {"FOUNDRY_RANK", "FOUNDRY_ARCHIVE"}}
        assert c_literals(NAME, [tmp_path / "b.c"]) == {"b.c": {"FOUNDRY_RANK"}}
    finally:
        ROOT = saved


# -- a real child, started through the launcher ----------------------------------------------

CHILD = r"""
import dataclasses, json, sys
from foundry.env import RunEnvironment
from foundry.errors import FoundryError
from foundry.integrations.sglang.config import load_config
from foundry.integrations.vllm.config import load_config as load_vllm_config
from foundry.runtime.launch import jit, rank_runs
from foundry.runtime.native.hook import Hook, library_path
from foundry.runtime.sessions.open import load_options, open_session

out = {"contract": {k: None if v is None else str(v) if not isinstance(v, (bool, int)) else v
                    for k, v in dataclasses.asdict(RunEnvironment.from_env()).items()}}
try:
    session = open_session()
    out["session"] = {k: str(getattr(session, k)) for k in
                      ("mode", "rank", "world_size", "overwrite", "path", "warmup_mode", "relocate", "builder",
                       "build_threads", "instantiate") if hasattr(session, k)}
    if hasattr(session, "archive"):
        out["session"]["archive"] = str(session.archive.root)
except FoundryError as err:
    out["session"] = {"refused": err.field}
out["options"] = load_options()
out["plugin"] = {k: getattr(load_config(), k) for k in ("mode", "archive", "region_base", "region_size", "warmup",
                                                        "from_launcher")}
out["vllm_plugin"] = {k: getattr(load_vllm_config(), k) for k in out["plugin"]}
out["launcher"] = {"hook_lib": str(library_path()), "save_id": rank_runs.save_id(), "jit_root": str(jit.jit_root())}
hook = Hook.attach()
out["hook"] = dataclasses.asdict(hook.config())
out["region"] = dataclasses.asdict(hook.region())
json.dump(out, sys.stdout)
"""


def _child(config: launcher.RunConfig, base: dict[str, str]) -> dict:
    env = launcher.environment(config, base_env=base)
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _checks(expected: RunEnvironment, seen: dict) -> dict[Reader | str, dict[str, tuple]]:
    """Per side, every variable it read: (what the launcher wrote, what that side parsed)."""
    e = expected
    contract = {v.name: (getattr(e, f), seen["contract"][f]) for f, v in VARIABLES.items()}
    for name, (want, got) in contract.items():  # paths came back as text
        if isinstance(want, Path):
            contract[name] = (str(want), got)
    session = seen["session"]
    sessions = {"FOUNDRY_MODE": (e.mode, session.get("mode", e.mode if "refused" in session else None))}
    if "archive" in session:  # a LOAD session opened its archive
        sessions.update(FOUNDRY_ARCHIVE=(str(e.archive), session["archive"]),
                        FOUNDRY_RANK=(str(e.rank), session["rank"]), relocating=(str(e.relocate), session["relocate"]),
                        builder=(e.builder, session["builder"]))  # fmt: skip
    if e.mode == "save":
        sessions.update(FOUNDRY_ARCHIVE=(str(e.archive), session["path"]), FOUNDRY_RANK=(str(e.rank), session["rank"]),
                        FOUNDRY_WORLD_SIZE=(str(e.world_size), session["world_size"]),
                        FOUNDRY_OVERWRITE=(str(e.overwrite), session["overwrite"]))  # fmt: skip
    options = seen["options"]
    sessions.update(FOUNDRY_LOAD_WARMUP=(e.load_warmup, options["warmup"]),
                    FOUNDRY_BUILDER=(e.builder, options["builder"]),
                    FOUNDRY_BUILD_THREADS=(e.build_threads, options["build_threads"]),
                    FOUNDRY_INSTANTIATE=(e.instantiate, options["instantiate"]),
                    FOUNDRY_RELOCATE=(e.relocate, options["relocate"]))  # fmt: skip

    def plugin_checks(plugin: dict) -> dict[str, tuple]:
        return {"FOUNDRY_MODE": (e.mode, plugin["mode"]), "FOUNDRY_ARCHIVE": (str(e.archive), plugin["archive"]),
                "FOUNDRY_REGION_BASE": (e.region_base, plugin["region_base"]),
                "FOUNDRY_REGION_SIZE": (e.region_size, plugin["region_size"]),
                "FOUNDRY_LOAD_WARMUP": (e.load_warmup, plugin["warmup"]),
                "launched": (True, plugin["from_launcher"])}  # fmt: skip

    sglang, vllm = plugin_checks(seen["plugin"]), plugin_checks(seen["vllm_plugin"])
    hook, region = seen["hook"], seen["region"]
    hooks = {"FOUNDRY_MODE": (e.mode, hook["mode"]), "FOUNDRY_RANK": (e.rank, hook["rank"]),
             "FOUNDRY_REGION_BASE": (e.region_base, hook["region_base"]),
             "FOUNDRY_REGION_SIZE": (e.region_size, hook["region_size"]),
             "FOUNDRY_REGION_THREADS": (e.region_threads, hook["region_threads"]),
             "FOUNDRY_IMPORT_BASE": (e.import_base, hook["import_base"]),
             "FOUNDRY_HOOK_ECHO": (e.hook_echo, hook["hook_echo"]),
             "FOUNDRY_HOOK_SYMBOLS": (e.hook_symbols, hook["hook_symbols"]),
             "FOUNDRY_LOAD_CAPTURES": (e.load_captures, hook["load_captures"]),
             "FOUNDRY_SESSION_PID": (e.session_pid or 0, hook["session_pid"]),
             "FOUNDRY_SESSION_MARKER": (e.session_marker is not None, hook["session_marker"]),
             "session checked": (False, hook["session_checked"]),  # the child is not the process named
             "region": ([e.mode, e.region_size], [region["mode"], region["size"]])}  # fmt: skip
    defaults = _header_defaults()
    for name, field in (("FOUNDRY_REGION_BASE", "REGION_BASE"), ("FOUNDRY_REGION_SIZE", "REGION_SIZE"),
                        ("FOUNDRY_IMPORT_BASE", "IMPORT_BASE")):  # fmt: skip
        if hooks[name][0] is None:  # unset: the hook uses its default
            hooks[name] = (defaults[f"FOUNDRY_ENV_DEFAULT_{field}"], hooks[name][1])
    if e.region_size is None:
        hooks["region"] = ([e.mode, defaults["FOUNDRY_ENV_DEFAULT_REGION_SIZE"]], hooks["region"][1])
    launchers = {"FOUNDRY_HOOK_LIB": (str(e.hook_lib), seen["launcher"]["hook_lib"]),
                 "FOUNDRY_SAVE_ID": (e.save_id or "", seen["launcher"]["save_id"]),
                 "FOUNDRY_JIT_ROOT": (str(e.jit_root), seen["launcher"]["jit_root"])}  # fmt: skip
    return {"contract": contract, Reader.SESSION: sessions, Reader.SGLANG: sglang, Reader.VLLM: vllm,
            Reader.HOOK: hooks, Reader.LAUNCHER: launchers}  # fmt: skip


def _user_settings(tmp_path: Path, hook_library: Path) -> dict[str, str]:
    """What a user sets around `foundry run`, beside what the launcher writes."""
    return {"PATH": "/usr/bin:/bin", "FOUNDRY_HOOK_LIB": str(hook_library), "FOUNDRY_HOOK_SYMBOLS": "1",
            "FOUNDRY_JIT_ROOT": str(tmp_path / "jit"),
            "FOUNDRY_LOAD_CAPTURES": "allow", "FOUNDRY_IMPORT_BASE": "0x710000000000",
            "FOUNDRY_SGLANG_REPORT": str(tmp_path / "report.json"), "FOUNDRY_VLLM_REPORT": str(tmp_path / "v.json"),
            "FOUNDRY_LAYOUT_PAD": "....",
            "FOUNDRY_SAVE_FIRST_RUN": "/an/earlier/run", "FOUNDRY_RELOCATE": "1"}  # fmt: skip


def test_a_child_started_through_the_launcher_parses_every_variable_alike_on_every_side(tmp_path, with_hook):
    record = Archive.open(SAVE_A).session(0).region
    user = _user_settings(tmp_path, with_hook)
    common = {"hook_symbols": True, "load_captures": True, "import_base": 0x710000000000, "hook_lib": with_hook,
              "sglang_report": tmp_path / "report.json", "vllm_report": tmp_path / "v.json",
              "hook_echo": True, "jit_root": tmp_path / "jit"}  # fmt: skip
    shifted = record.base + (16 << 30)
    runs = {
        "relocating load": (
            launcher.RunConfig("load", SAVE_A, region_base=shifted, builder="native", build_threads=3,
                               instantiate="background", region_threads="any"),
            RunEnvironment(mode="load", archive=SAVE_A.resolve(), relocate=True, region_base=shifted,
                           region_size=record.size, builder="native", build_threads=3, instantiate="background",
                           region_threads="any", **common),
        ),
        "load restoring the warm-up": (
            launcher.RunConfig("load", SAVE_A, warmup="restore", region_size=128 << 30,
                               session_marker=tmp_path / "session.json", session_pid=4242),
            RunEnvironment(mode="load", archive=SAVE_A.resolve(), load_warmup="restore", region_base=record.base,
                           region_size=128 << 30, session_marker=tmp_path / "session.json", session_pid=4242,
                           **common),
        ),
        "later run of a save of two ranks": (
            launcher._later_run(launcher.RunConfig("save", tmp_path / "a", rank=1, world_size=2,
                                                   region_base=0x500000000000), 2, "first.run2"),
            RunEnvironment(mode="save", archive=(tmp_path / ".a.run2").resolve(), rank=1, world_size=2,
                           overwrite=True, save_id="first.run2", save_first_run=(tmp_path / "a").resolve(),
                           layout_pad=launcher.LAYOUT_PAD + 48, region_base=0x500000000000, **common),
        ),
    }  # fmt: skip
    covered: dict[Reader | str, set[str]] = {}
    for what, (config, expected) in runs.items():
        seen = _child(config, user)
        for side, checks in _checks(expected, seen).items():
            wrong = {name: pair for name, pair in checks.items() if _norm(pair[0]) != _norm(pair[1])}
            assert wrong == {}, f"{what}: {side} parsed otherwise"
            covered.setdefault(side, set()).update(checks)
        if expected.load_warmup == "restore":  # the session got the mode: it refuses the archive for it
            assert seen["session"] == {"refused": "region.warmup_bytes"}
    assert covered["contract"] == {v.name for v in VARIABLES.values()}
    for variable in VARIABLES.values():  # every reader of every variable was asked what it parsed ...
        for reader in variable.readers:
            if (reader, variable.name) not in THROUGH_THE_CONTRACT:
                assert variable.name in covered[reader], (variable.name, reader)
    for (reader, name), (module, constant) in THROUGH_THE_CONTRACT.items():  # ... or used the contract's reader
        assert f"{constant}.read(" in (ROOT / module).read_text(), (reader, name)


#: Reads made with the contract's own reader (Variable.read), at moments a child cannot
#: reach on a CPU (a scheduler's hooks, SaveSession.finish): the contract's readback is theirs.
THROUGH_THE_CONTRACT = {
    (Reader.SGLANG, "FOUNDRY_OVERWRITE"): ("foundry/integrations/common/session.py", "OVERWRITE"),
    (Reader.SGLANG, "FOUNDRY_SAVE_FIRST_RUN"): ("foundry/integrations/common/session.py", "SAVE_FIRST_RUN"),
    (Reader.SGLANG, "FOUNDRY_SGLANG_REPORT"): ("foundry/integrations/sglang/plugin.py", "SGLANG_REPORT"),
    (Reader.SGLANG, "FOUNDRY_SGLANG_GC"): ("foundry/integrations/sglang/plugin.py", "SGLANG_GC"),
    (Reader.SGLANG, "FOUNDRY_SGLANG_CONFIG"): ("foundry/integrations/sglang/config.py", "SGLANG_CONFIG"),
    (Reader.SGLANG, "FOUNDRY_SAVE_ID"): ("foundry/integrations/sglang/plugin.py", "SAVE_ID"),
    (Reader.VLLM, "FOUNDRY_OVERWRITE"): ("foundry/integrations/common/session.py", "OVERWRITE"),
    (Reader.VLLM, "FOUNDRY_SAVE_FIRST_RUN"): ("foundry/integrations/common/session.py", "SAVE_FIRST_RUN"),
    (Reader.VLLM, "FOUNDRY_VLLM_REPORT"): ("foundry/integrations/vllm/plugin.py", "VLLM_REPORT"),
    (Reader.VLLM, "FOUNDRY_VLLM_CONFIG"): ("foundry/integrations/vllm/config.py", "VLLM_CONFIG"),
    (Reader.SESSION, "FOUNDRY_SAVE_ID"): ("foundry/runtime/sessions/save.py", "SAVE_ID"),
    (Reader.SESSION, "FOUNDRY_SAVE_REPLAY"): ("foundry/runtime/sessions/save.py", "SAVE_REPLAY"),
    (Reader.SESSION, "FOUNDRY_SESSION_MARKER"): ("foundry/runtime/sessions/marker.py", "SESSION_MARKER"),
}


def _norm(value: object) -> object:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def test_without_the_launcher_the_plugin_reads_its_configuration_file(tmp_path):
    config = tmp_path / "foundry.toml"
    config.write_text('mode = "load"\narchive = "/srv/a"\nregion_size = 68719476736\n')
    code = ("import dataclasses, json\nfrom foundry.env import RunEnvironment\n"
            "from foundry.integrations.sglang.config import load_config\n"
            "c = load_config()\nprint(json.dumps([c.mode, c.archive, c.region_size, c.from_launcher,"
            " str(RunEnvironment.from_env().sglang_config)]))")  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "FOUNDRY_SGLANG_CONFIG": str(config)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ["load", "/srv/a", 64 << 30, False, str(config)]

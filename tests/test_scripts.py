"""The shell scripts that drive GPU runs parse, refuse a call without arguments, and the GPU
script's command lines, in every section and variant, are ones its programs take (the
foundry commands and the SGLang and vLLM recipes checked by their own parsers; they run only on
the GPU machine, so a syntax error or a mistyped flag would show there first)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from foundry.cli import main as foundry_main

from .conftest import load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted([*ROOT.glob("scripts/*.sh"), *ROOT.glob("recipes/*/*.sh"), ROOT / ".ci" / "run"])


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_script_parses(script):
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("script", ["scripts/validate_on_gpu.sh", "recipes/deepep/build_deep_ep.sh"])
def test_script_without_arguments_says_its_usage(script):
    proc = subprocess.run(["bash", str(ROOT / script)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode != 0 and "usage:" in proc.stderr


# -- every command line the GPU script would run parses -------------------------------------------

SHIM = """#!/bin/bash
# records its arguments, NUL-separated, one file a call (ranks start two at once); makes what a step
# after it looks for: the directory after --archive, the file after --out
printf '%s\\0' "$@" > "$(mktemp "$SHIM_CALLS/call.XXXXXXXX")"
while [ $# -gt 0 ]; do
    case $1 in  # the program's own --out after foundry run's -- too
        --archive) [ -n "${2:-}" ] && mkdir -p "$2" ;;
        --out) [ -n "${2:-}" ] && mkdir -p "$(dirname "$2")" && : > "$2" ;;
    esac
    shift
done
exit 0
"""
#: The script's variants its comments name (PRESET, VPRESET, SG_EXTRA with SG_TAG, WAVE_SIZE).
VARIANTS = {
    "defaults": {},
    "moe": {"PRESET": "qwen3-30b-a3b", "VPRESET": "qwen3-30b-a3b"},
    "fi-prefill": {"SG_EXTRA": "--set attention_backend=flashinfer --set cuda_graph_backend_prefill=full "
                   "--set context_length=8208 --prefill-walk", "SG_TAG": "fi-prefill"},
    "bs512": {"SG_EXTRA": "--set max_running_requests=512 --set cuda_graph_bs_decode=[1,2,4,8,512] "
              "--set max_total_tokens=131072", "WAVE_SIZE": "512", "SG_TAG": "bs512"},
}  # fmt: skip
#: What the script reads from its caller's environment besides the variants (a developer's own left out).
SCRIPT_SETTINGS = ("PRESET", "VPRESET", "SG_EXTRA", "SG_TAG", "WAVE_SIZE", "RESUME", "RANKS_TIMEOUT", "VLLM_CACHE_ROOT",
                   "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")  # fmt: skip


def _sections() -> list[str]:
    """Every section the script's usage line names."""
    usage = re.search(r"usage: scripts/validate_on_gpu.sh RESULTS_DIR \[([^\]]+) \.\.\.\]",
                      (ROOT / "scripts" / "validate_on_gpu.sh").read_text())  # fmt: skip
    assert usage is not None
    return usage.group(1).split("|")


def _python_calls(tmp_path: Path, variant: dict[str, str]) -> list[list[str]]:
    """Every ``python3`` command line of every section, as the script would run it: ``python3``
    is a stand-in that records its arguments and makes the archives' directories and the outputs
    later steps look for (no GPU, engine or archive here). The script must go through every
    section without stopping early."""
    shim, calls = tmp_path / "bin" / "python3", tmp_path / "calls"
    shim.parent.mkdir()
    calls.mkdir()
    shim.write_text(SHIM)
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in SCRIPT_SETTINGS}
    env.update(variant, SHIM_CALLS=str(calls), PATH=f"{shim.parent}:{os.environ['PATH']}")
    subprocess.run(["bash", str(ROOT / "scripts" / "validate_on_gpu.sh"), str(tmp_path / "r"), *_sections()],
                   env=env, capture_output=True, text=True, timeout=300, cwd=ROOT, check=True)  # fmt: skip
    summary = (tmp_path / "r" / "summary.txt").read_text()
    assert "stopped after" not in summary, summary
    return [path.read_bytes().decode().split("\0")[:-1] for path in sorted(calls.iterdir())]


def _check_recipe(module, argv: list[str]) -> None:
    args = module.parse_args(argv)  # exits 2 on a flag, preset or value it does not take
    overrides = getattr(module, "SGLANG_RUN", module).overrides
    for option in ("set", "model_set", "draft_model_set"):
        for key, value in overrides(getattr(args, option, []), f"--{option}").items():
            assert not (isinstance(value, str) and value.startswith(("[", "{"))), f"{key}: not JSON: {value!r}"


def _check_foundry(argv: list[str], recipes: dict, monkeypatch) -> None:
    """``foundry run`` is invoked with the launcher stood in for, so its own checks run too (and
    the program after ``--`` is checked in turn); other commands are parsed only."""
    if argv[0] == "run":
        assert "--" in argv, argv  # else a mistyped option would be taken for the program
        started: list[list[str]] = []
        monkeypatch.setattr("foundry.runtime.launch.launcher.run",
                            lambda config, command, **_: started.append(command) or 0)  # fmt: skip
        result = CliRunner().invoke(foundry_main, argv)
        assert result.exit_code == 0, result.output
        assert started == [argv[argv.index("--") + 1 :]]
        return _check_program(started[0], recipes, monkeypatch)
    command, words = foundry_main, list(argv)
    while isinstance(command, click.Group):
        command = command.commands[words[0]]  # KeyError: no such command
        name, words = words[0], words[1:]
    command.make_context(name, words)  # click's usage errors: a flag it does not take


def _check_call(argv: list[str], recipes: dict, monkeypatch) -> None:
    if argv[:1] == ["-c"]:
        return
    if argv[:2] == ["-m", "foundry"]:
        return _check_foundry(argv[2:], recipes, monkeypatch)
    if argv[:2] == ["-m", "pytest"]:
        tests = [word for word in argv[2:] if word.startswith("tests/")]
        assert tests and all((ROOT / t).is_file() for t in tests), argv
        return
    script = argv[0]
    assert (ROOT / script).is_file(), f"no such script: {script}"
    if script in recipes:
        _check_recipe(recipes[script], argv[1:])


def _check_program(program: list[str], recipes: dict, monkeypatch) -> None:
    """What ``foundry run`` starts after ``--``: python3 and a script, or a shell's ``true``."""
    if program[0] in ("python3", "python"):
        _check_call(program[1:], recipes, monkeypatch)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_command_line_of_the_gpu_script_parses(tmp_path, monkeypatch, variant):
    """The recipes' own parsers check their command lines (the SGLang and vLLM recipes'; the
    torch ones need torch to import, so only their files are checked)."""
    recipes = {path: load_script(ROOT / path, f"checked_{path.replace('/', '_')[:-3]}")
               for path in ("recipes/sglang/run.py", "recipes/vllm/run.py")}  # fmt: skip
    calls = _python_calls(tmp_path, VARIANTS[variant])
    assert len(calls) > 150  # every section ran its steps
    started = {script: sum(script in call for call in calls) for script in recipes}
    assert all(count > 10 for count in started.values()), started
    for call in calls:
        try:
            _check_call(call, recipes, monkeypatch)
        except SystemExit as stop:  # argparse's refusal
            raise AssertionError(f"refused ({stop.code}): python3 {shlex.join(call)}") from None
        except (click.ClickException, KeyError) as err:
            raise AssertionError(f"{err}: python3 {shlex.join(call)}") from None

"""Compare recorded vLLM runs: identical output ids and logprobs, prompts told apart.

    python recipes/vllm/compare.py REFERENCE.json OTHER.json [...]

Exit 0 when every run equals the reference (its 16 prompts, and the wave where
either run walked it; the reference's 16 outputs pairwise different, so the
comparison can tell prompts apart), 1 otherwise. The comparison is
recipes/sglang/compare.py's; the tables are vLLM's: where runs recorded vLLM's
start-up lines, its graph capture seconds (whole seconds, as vLLM logs them; the
plugin's own figure beside it, to the millisecond), how many times less graph
time each run spent than the reference, torch.compile's and the engine's
initialisation seconds, and the seconds until the engine took requests and of
its first batch; then, for each LOAD, how many restored graphs vLLM replayed.
"""

from __future__ import annotations

import importlib.util
import sys
from functools import partial
from pathlib import Path

_spec = importlib.util.spec_from_file_location("recipe_sglang_compare", Path(__file__).resolve().parent.parent
                                               / "sglang" / "compare.py")  # fmt: skip
SHARED = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(SHARED)
differences = SHARED.differences


def graph_seconds(run: dict) -> float | None:
    """A run's graph phase: the plugin's measure where a session ran, else vLLM's own line."""
    split = (run.get("foundry") or {}).get("vllm_seconds") or {}
    if split.get("capture_model_s"):
        return float(split["capture_model_s"])
    startup = run.get("startup") or {}
    return startup.get("graph_capture_s")


def startup_table(paths: list[str], runs: list[dict]) -> list[str]:
    """One line per run that recorded vLLM's start-up figures (see the module docstring)."""
    timed = [(p, r) for p, r in zip(paths, runs, strict=True) if r.get("startup") or r.get("foundry")]
    if not timed:
        return []
    reference = graph_seconds(timed[0][1])
    lines = ["start-up (s): graph capture (vLLM's line; the plugin's), vs the first; torch.compile, init engine; "
             "ready, first batch"]  # fmt: skip
    for path, run in timed:
        startup = run.get("startup") or {}
        seconds = graph_seconds(run)
        split = (run.get("foundry") or {}).get("vllm_seconds") or {}
        ratio = f"{reference / seconds:.1f}x less" if reference and seconds else "-"
        logged = startup.get("graph_capture_s")
        plugin = f"; plugin {split['capture_model_s']:.3f}" if split.get("capture_model_s") else ""
        lines.append(
            f"  graphs {'-' if logged is None else f'{logged:.0f}'}{plugin} ({ratio}); "
            f"compile {startup.get('torch_compile_s', 0):.1f}, init {startup.get('init_engine_s', 0):.1f}; "
            f"ready {run.get('ready_s', 0):.1f}, first batch {(run.get('batch_s') or [0])[0]:.2f}  {path}"
        )
        if split:
            # foundry_s counts the session's start in Worker.init_device too, outside the graph phase
            lines.append(f"           Foundry in the worker {split.get('foundry_s', 0):.3f} (its start included; "
                         f"the graphs {split.get('graphs_s', 0):.3f})")  # fmt: skip
    return lines


replay_lines = partial(SHARED.replay_lines, graphs="vllm_graphs")


def main(argv: list[str]) -> int:
    """Compare recorded vLLM runs (see the module docstring)."""
    return SHARED.compare(argv, (startup_table, replay_lines), "recipes/vllm/run.py", __doc__.strip().splitlines()[2])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

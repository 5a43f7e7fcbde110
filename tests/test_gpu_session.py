"""SAVE/LOAD sessions on a GPU: fresh processes under `foundry run`.

A module built here with nvcc holds a ``__device__`` global the program sets
before capture; the tests check that LOAD binds to the live copy, restores the
global into a freshly loaded archived copy, or refuses by name — and that each
kind of drift is refused before any replay, naming its field.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .archive_tools import edit_json
from .conftest import nvcc_cubin

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
# ``ops`` is a table of device function pointers, which the module loader fills with code
# addresses that differ with every load (as NCCL's ncclDevFuncTable): never the application's
KERNEL = r"""
__device__ int scale;
__device__ float twice(float v) { return 2.0f * v; }
typedef float (*op_t)(float);
__device__ op_t ops[2] = {twice, twice};
extern "C" __global__ void scaled(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = ops[i % 2](x[i]) * 0.5f * scale;
}
"""


@pytest.fixture(scope="module")
def cubin(tmp_path_factory) -> Path:
    return nvcc_cubin(KERNEL, tmp_path_factory.mktemp("module"), "scaled")


def foundry_run(mode: str, archive: Path, cubin: Path, *args: str, extra: tuple[str, ...] = (),
                env: dict[str, str] | None = None) -> dict:  # fmt: skip
    return probe_run("session_probe.py", mode, archive, (str(cubin), *args), extra, env)


def probe_run(probe: str, mode: str, archive: Path, args: tuple[str, ...], extra: tuple[str, ...],
              env: dict[str, str] | None = None) -> dict:  # fmt: skip
    """A child probe of tests/ under `foundry run` (mode off: run plainly), with ``env`` added to
    this environment; the last JSON line it printed."""
    cmd = [sys.executable, str(ROOT / "tests" / probe), *args]
    if mode != "off":
        cmd = [sys.executable, "-m", "foundry", "run", "--mode", mode, "--archive", str(archive), *extra, "--", *cmd]
    env = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"rc {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1])


@pytest.fixture(scope="module")
def saved(cubin, tmp_path_factory) -> Path:
    archive = tmp_path_factory.mktemp("saved") / "archive"
    result = foundry_run("save", archive, cubin)
    assert result["scale_seen"] == 3.0, result
    assert result["report"]["written_globals"] == ["scale"]
    return archive


def test_load_binds_to_the_live_module_and_does_not_capture(saved, cubin):
    result = foundry_run("load", saved, cubin)
    assert result["scale_seen"] == 3.0 and result["same_storage"], result
    report = result["report"]
    assert report["counters"]["stream_captures"] == 0
    assert report["counters"]["graph_instantiates"] == report["graphs"] == 1
    assert report["bound_live"] == 1 and report["loaded_images"] == 0


@pytest.mark.parametrize(
    "extra",
    [(), ("--builder", "native"), ("--builder", "native", "--instantiate", "background")],
    ids=["python", "native-plans", "background"],
)
def test_the_restored_graph_is_instantiated_with_the_programs_flags(saved, cubin, extra):
    """torch instantiates its graphs with flags (auto-free on launch at least); a LOAD's graph
    gets what SAVE saw torch's graph report."""
    from foundry.archive import Archive

    entry = Archive.open(saved).entries(0)[0]
    assert entry.instantiate_flags & 0x1  # CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH
    plain = foundry_run("off", saved, cubin)
    loaded = foundry_run("load", saved, cubin, extra=extra)
    assert loaded["scale_seen"] == 3.0 and plain["exec_flags"] == loaded["exec_flags"] == entry.instantiate_flags


@pytest.mark.parametrize("extra", [(), ("--builder", "native")], ids=["python", "native-plans"])
def test_a_freshly_loaded_function_gets_the_cache_preference_the_program_set(cubin, tmp_path, extra):
    """The driver cannot report a function's cache preference: SAVE keeps what the hook saw
    the program set, and a LOAD that loads the image itself sets it again."""
    from foundry.archive import Archive

    archive = tmp_path / "archive"
    saved = foundry_run("save", archive, cubin, "--cache-config", extra=("--save-runs", "1"))
    assert saved["scale_seen"] == 3.0 and saved["cache_config"] == 1, saved  # CU_FUNC_CACHE_PREFER_SHARED
    ir = Archive.open(archive).graph(0, "scaled")
    assert [(a.name, a.value) for n in ir.kernels() for a in n.func_attrs] == [("cache_config", 1)]
    loaded = foundry_run("load", archive, cubin, "--skip-module", extra=extra)
    assert loaded["report"]["loaded_images"] == 1 and loaded["scale_seen"] == 3.0, loaded
    assert loaded["cache_config"] == 1  # set by the LOAD on the function it loaded


def test_a_save_replaying_its_graphs_rebuilt_in_its_own_process_gives_the_same_and_the_same_archive(
    saved, cubin, tmp_path
):
    """FOUNDRY_SAVE_REPLAY=rebuilt: the program replays each graph built from its IR on the
    memory and functions its capture used (to tell a graph's speed apart from its process's).
    The second graph is captured into the pool the first one's capture holds (torch refuses
    a capture into a pool whose graphs are all gone)."""
    from foundry.archive import Archive

    archive = tmp_path / "archive"
    result = foundry_run("save", archive, cubin, "--two-graphs", extra=("--save-runs", "1"),
                         env={"FOUNDRY_SAVE_REPLAY": "rebuilt"})  # fmt: skip
    assert result["rebuilt"] and result["scale_seen"] == 3.0 and result["same_storage"], result
    assert result["copied_seen"] == 3.0, result
    entry = next(e for e in Archive.open(archive).entries(0) if e.name == "scaled")
    assert result["exec_flags"] == entry.instantiate_flags != 0
    assert result["report"]["replay"] == "rebuilt" and result["report"]["rebuilt_differences"] == {}  # read back alike
    loaded = foundry_run("load", archive, cubin, "--two-graphs")  # the archive is the one a plain SAVE writes
    assert loaded["scale_seen"] == loaded["copied_seen"] == 3.0, loaded
    assert loaded["report"]["counters"]["stream_captures"] == 0, loaded


def test_a_load_that_captures_again_fails_instead(saved, cubin):
    result = foundry_run("load", saved, cubin, "--capture-again")
    assert result["scale_seen"] == 3.0, result
    assert result["captured_again"] != "captured" and "not permitted" in result["captured_again"].lower(), result
    assert result["counters_after"]["refused"] >= 1


@pytest.mark.parametrize("threads", ["1", "4"])
def test_the_native_builder_restores_the_same_graph_from_its_plan(saved, cubin, threads):
    result = foundry_run("load", saved, cubin, extra=("--builder", "native", "--build-threads", threads))
    assert result["scale_seen"] == 3.0 and result["report"]["builder"] == "native-plans", result
    assert result["report"]["build_threads"] == int(threads)
    assert result["report"]["counters"]["graph_instantiates"] == 1
    assert result["report"]["counters"]["stream_captures"] == 0


def test_a_save_seals_its_region_once_the_archive_is_written(cubin, tmp_path):
    """What the program allocates after finish() (a server's requests) is its own: in
    the trace as sealed, not reported as an allocation made after capturing began."""
    result = foundry_run("save", tmp_path / "a", cubin, "--allocate-after", extra=("--save-runs", "1"))
    assert result["scale_seen"] == 3.0, result
    assert result["phase_after"] == "sealed" and result["late_events"] == [], result


def test_background_instantiation_restores_the_same_graph(saved, cubin):
    """LOAD returns the graph built but not instantiated; the replay or the background
    thread instantiates it once, and finish() counts it."""
    result = foundry_run("load", saved, cubin, extra=("--builder", "native", "--instantiate", "background"))
    report = result["report"]
    assert result["scale_seen"] == 3.0 and report["instantiate"] == "background", result
    assert report["counters"]["graph_instantiates"] == 1 and report["counters"]["stream_captures"] == 0
    assert report["counters"].get("native_instantiate_us", 0) == 0  # the builder left it to the thread or replay
    assert report["instantiated_s"] >= report["restore_s"]


def test_the_native_builder_packs_the_ir_when_the_region_moves(saved, cubin):
    shifted = hex(0x600000000000 + (16 << 30))
    result = foundry_run("load", saved, cubin, extra=("--builder", "native", "--region-base", shifted))
    assert result["scale_seen"] == 3.0 and result["report"]["builder"] == "native", result
    assert result["report"]["relocated_by"] == 16 << 30


def test_a_load_at_a_base_16_gib_higher_relocates(saved, cubin):
    shifted = hex(0x600000000000 + (16 << 30))
    result = foundry_run("load", saved, cubin, extra=("--region-base", shifted))
    assert result["report"]["relocated_by"] == 16 << 30, result
    assert result["scale_seen"] == 3.0 and result["same_storage"]


def test_a_fresh_copy_of_the_image_gets_the_global_restored(saved, cubin):
    result = foundry_run("load", saved, cubin, "--skip-module")
    assert result["report"]["loaded_images"] == 1 and result["report"]["restored_globals"] == ["scale"]
    assert result["scale_seen"] == 3.0  # never the image's initial 0


def test_a_load_from_plans_loads_a_fresh_image_from_the_module_checks_bytes(saved, cubin):
    """The image the program did not load itself comes from the bytes the session's
    module check read and hashed, not from a second read; its global is still restored."""
    result = foundry_run("load", saved, cubin, "--skip-module", extra=("--builder", "native"))
    report = result["report"]
    assert report["builder"] == "native-plans" and report["loaded_images"] == report["images_from_check"] == 1, report
    assert report["restored_globals"] == ["scale"] and result["scale_seen"] == 3.0


def test_a_live_module_whose_global_differs_is_refused_by_name(saved, cubin):
    result = foundry_run("load", saved, cubin, "--scale", "7")
    assert result["error"]["field"] == "scale"
    assert "differs from SAVE's" in result["error"]["message"]


def test_a_changed_allocation_sequence_is_refused_naming_the_allocation(saved, cubin):
    result = foundry_run("load", saved, cubin, "--extra-alloc")
    assert result["error"]["field"] == "region.trace"
    assert "diverges from SAVE's warm-up trace" in result["error"]["message"]


def test_a_taken_region_base_is_refused(saved, cubin):
    result = foundry_run("load", saved, cubin, "--take-base")
    assert result["error"]["field"] == "region.base"


def test_an_archive_from_another_gpu_is_refused(saved, cubin, tmp_path):
    other = tmp_path / "other-gpu"
    shutil.copytree(saved, other)
    edit_json(other / "foundry-archive.json", lambda c: c["environment"].update(gpu_name="NVIDIA B200"), root=other)
    result = foundry_run("load", other, cubin)
    assert result["error"]["field"] == "environment.gpu_name"
    assert result["error"]["expected"] == "NVIDIA B200"


def test_save_and_save2_agree_and_diff_says_identical(saved, cubin, tmp_path):
    again = tmp_path / "save2"
    assert foundry_run("save", again, cubin)["scale_seen"] == 3.0
    proc = subprocess.run([sys.executable, "-m", "foundry", "archive", "diff", str(saved), str(again)],
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("extra", [(), ("--symm",)], ids=["plain", "symmetric-memory"])
def test_the_recipe_decodes_identically_after_load(tmp_path, extra):
    """The Qwen3-shaped recipe at two batch sizes: baseline vs SAVE vs fresh-process LOAD
    (graphs built through cuda-bindings, through the native builder, and at a region
    base 16 GiB higher); with ``--symm`` its projections are summed through symmetric
    memory (tensor parallelism at world size 1), which LOAD validates and relocates."""
    recipe = [sys.executable, str(ROOT / "recipes" / "torch" / "run.py"), "--batches", "1,8", *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    reports = []
    shifted = hex(0x600000000000 + (16 << 30))
    runs = (("baseline", []), ("save", ["save"]), ("load", ["load"]), ("load-native", ["load", "--builder", "native"]),
            ("load-background", ["load", "--builder", "native", "--instantiate", "background"]),
            ("load-shifted", ["load", "--region-base", shifted]))  # fmt: skip
    for name, prefix in runs:
        out = tmp_path / f"{name}.json"
        cmd = [*recipe, "--out", str(out)]
        if prefix:
            cmd = [sys.executable, "-m", "foundry", "run", "--mode", prefix[0], *prefix[1:], "--archive",
                   str(tmp_path / "a"), "--", *cmd]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=400)
        assert proc.returncode == 0, proc.stderr[-3000:]
        reports.append(out)
    proc = subprocess.run([sys.executable, str(ROOT / "recipes" / "torch" / "compare.py"), *map(str, reports)],
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stdout
    assert "identical" in proc.stdout and "DIFFERENT" not in proc.stdout


def _symm_run(tmp_path, name: str, *foundry_args: str, move_buffer: bool = False,
              recipe_args: tuple[str, ...] = ()) -> tuple[int, dict | None]:  # fmt: skip
    code, report, _ = _symm_process(tmp_path, name, *foundry_args, move_buffer=move_buffer, recipe_args=recipe_args)
    return code, report


def _symm_process(tmp_path, name: str, *foundry_args: str, move_buffer: bool = False,
                  recipe_args: tuple[str, ...] = ()) -> tuple[int, dict | None, str]:  # fmt: skip
    out = tmp_path / f"{name}.json"
    cmd = [sys.executable, str(ROOT / "recipes" / "torch" / "symm_allreduce.py"), "--out", str(out), *recipe_args]
    if move_buffer:
        cmd.append("--move-buffer")
    if foundry_args:
        cmd = [sys.executable, "-m", "foundry", "run", *foundry_args, "--", *cmd]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    return proc.returncode, json.loads(out.read_text()) if out.is_file() else None, proc.stderr


def test_symmetric_memory_relocates_to_a_moved_buffer_at_a_shifted_base(tmp_path):
    """Matmul + one-shot + two-shot all-reduce (world size 1): SAVE, then a fresh LOAD whose
    symmetric buffer lives elsewhere and whose region base is 16 GiB higher."""
    archive = tmp_path / "a"
    shifted = hex(0x600000000000 + (16 << 30))
    code, base = _symm_run(tmp_path, "baseline")
    assert code == 0
    code, saved = _symm_run(tmp_path, "save", "--mode", "save", "--archive", str(archive))
    assert code == 0 and saved["session"]["graphs"] == 1
    load_args = ("--mode", "load", "--archive", str(archive), "--region-base", shifted)
    code, loaded = _symm_run(tmp_path, "load", *load_args, move_buffer=True)
    assert code == 0, loaded
    assert loaded["buffer_address"] != saved["buffer_address"] and loaded["session"]["relocated_by"] == 16 << 30
    for key in ("one_shot_sha256", "buffer_sha256"):
        assert base[key] == saved[key] == loaded[key]
    # negative control: the same LOAD with one relocation skipped (a symm operand dropped from the manifest)
    skipped = tmp_path / "skipped"
    shutil.copytree(archive, skipped)

    def drop_one(ir):
        victim = next(o for o in ir.operands if o.region == "symm.buffer")
        ir.set_operands(o for o in ir.operands if o != victim)

    from .archive_tools import edit_graph

    edit_graph(skipped, "symm.allreduce", drop_one)
    code, wrong = _symm_run(tmp_path, "skipped", "--mode", "load", "--archive", str(skipped), "--region-base", shifted,
                            move_buffer=True)  # fmt: skip
    assert (
        code != 0
        or wrong["buffer_sha256"] != base["buffer_sha256"]
        or wrong["one_shot_sha256"] != base["one_shot_sha256"]
    )


@pytest.mark.parametrize(("recipe_args", "message"), [
    (("--buffer-rows", "1024"), "smaller than SAVE's"),  # a 512 KiB buffer against SAVE's 8 MiB
    (("--buffer-rows", "16384", "--buffer-dtype", "float32"), "differs from SAVE's in dtype"),
])  # fmt: skip
def test_a_live_symmetric_buffer_that_drifted_is_refused_before_replay(tmp_path, recipe_args, message):
    archive = tmp_path / "a"
    code, saved = _symm_run(tmp_path, "save", "--mode", "save", "--archive", str(archive),
                            recipe_args=("--buffer-rows", "16384"))  # fmt: skip
    assert code == 0 and saved["session"]["graphs"] == 1
    # --warmup restore: the drifted program's warm-up never runs, so the refusal is LOAD's, before any replay
    code, loaded, stderr = _symm_process(tmp_path, "load", "--mode", "load", "--warmup", "restore", "--archive",
                                         str(archive), recipe_args=recipe_args)  # fmt: skip
    assert code != 0 and loaded is None
    assert message in stderr and "torch-symm-mem" in stderr, stderr[-2000:]


def late_run(mode: str, archive: Path, *args: str, extra: tuple[str, ...] = ()) -> dict:
    return probe_run("late_probe.py", mode, archive, args, extra)


@pytest.fixture(scope="module")
def saved_late(tmp_path_factory) -> tuple[Path, dict]:
    """A SAVE whose warm-ups allocate between captures (a table per shape, made on
    its first use), its warm-up bytes taken at finish()."""
    archive = tmp_path_factory.mktemp("late") / "archive"
    result = late_run("save", archive, "--bytes-until", "finish")
    assert "error" not in result, result
    return archive, result


def test_allocations_between_captures_are_saved_and_placed_there_again_at_load(saved_late):
    archive, saved = saved_late
    assert saved["report"]["late_allocations"] >= 3, saved["report"]  # the tables of bs 32, 16 and 8
    assert saved["phases"].get("late", 0) >= 3
    plain = late_run("off", archive)  # mode off: torch's own capture
    loaded = late_run("load", archive)
    assert "error" not in loaded, loaded
    assert loaded["outputs"] == saved["outputs"] == plain["outputs"]
    assert len(set(saved["outputs"].values())) == len(saved["outputs"])  # the shapes are told apart
    report = loaded["report"]
    assert report["counters"]["stream_captures"] == 0
    assert report["late_allocations"] == saved["report"]["late_allocations"]


def test_a_load_restoring_the_warmup_bytes_maps_the_late_allocations_too(saved_late):
    archive, saved = saved_late
    loaded = late_run("load", archive, extra=("--warmup", "restore"))
    assert "error" not in loaded, loaded
    assert loaded["outputs"] == saved["outputs"]
    assert loaded["report"]["late_allocations"] == 0  # nothing to repeat: the bytes are restored
    assert loaded["phases"].get("late", 0) == 0


def test_a_late_allocation_that_departs_from_saves_is_refused_naming_both(saved_late):
    archive, _ = saved_late
    result = late_run("load", archive, "--grow", "16")
    assert result.get("field") == "region.trace", result
    assert "made between captures, diverges from SAVE's trace" in result["error"], result
    assert "SAVE's #" in result["error"] and "bytes at offset" in result["error"], result


@pytest.fixture(scope="module")
def saved_own(tmp_path_factory) -> tuple[Path, dict]:
    """A SAVE whose program creates each shape's table itself between captures, outside
    its warm-ups, its warm-up bytes taken at finish()."""
    archive = tmp_path_factory.mktemp("own") / "archive"
    result = late_run("save", archive, "--bytes-until", "finish", "--own-tables")
    assert "error" not in result, result
    return archive, result


def test_the_programs_own_allocations_between_captures_land_at_saves_offsets_in_both_load_modes(saved_own):
    from foundry.archive import Archive

    archive, saved = saved_own
    trace = Archive.open(archive).session(0).region.trace
    between = [a for a in trace if a.phase == "between"]
    assert len(between) >= 3, trace  # the tables of bs 32, 16 and 8, made outside the warm-ups
    for extra in ((), ("--warmup", "restore")):
        loaded = late_run("load", archive, "--own-tables", extra=extra)
        assert "error" not in loaded, (extra, loaded)
        assert loaded["outputs"] == saved["outputs"], extra
        assert loaded["report"]["counters"]["stream_captures"] == 0
    assert loaded["report"]["late_allocations"] == len(between)  # the restoring LOAD made exactly those again
    assert loaded["report"]["restored_again"] == len(between)  # and got SAVE's bytes in them


def test_a_load_skipping_the_warmups_whose_own_allocation_departs_is_refused(saved_own):
    archive, _ = saved_own
    result = late_run("load", archive, "--own-tables", "--grow", "16", extra=("--warmup", "restore"))
    assert result.get("field") == "region.trace", result
    assert "made between captures, diverges from SAVE's trace" in result["error"], result


def test_warmup_bytes_taken_at_the_first_capture_are_dropped_when_memory_came_later(tmp_path):
    saved = late_run("save", tmp_path / "archive", "--bytes-until", "capture")
    assert "error" not in saved, saved
    assert saved["report"]["warmup_bytes"].startswith("dropped: "), saved["report"]
    refused = late_run("load", tmp_path / "archive", extra=("--warmup", "restore"))
    assert refused.get("field") == "region.warmup_bytes", refused

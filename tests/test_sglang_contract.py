"""Contract tests against the real SGLang wheel (``sglang==0.5.17``): its sources are
parsed with ``ast`` (importing SGLang needs the GPU build of torch), and every hook
point the plugin patches must exist there with the parameters the table expects.

The wheel is downloaded from PyPI once into ``$XDG_CACHE_HOME/foundry-tests`` (or
taken from ``FOUNDRY_SGLANG_WHEEL``); without it these tests fail rather than skip."""

from __future__ import annotations

import ast
import hashlib
import os
import re
import subprocess
import sys
import zipfile
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from foundry.archive.outputs import RECORD_TYPES
from foundry.integrations.sglang.hookpoints import CHECKED_VERSIONS, HOOK_POINTS, TP_HOOK_POINTS
from foundry.integrations.sglang.server_args import SERVER_ARGS

from .conftest import load_script


def _download(version: str) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "foundry-tests"
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                           "--python-version", "3.11", "--platform", "manylinux_2_34_x86_64", "-d", str(cache),
                           f"sglang=={version}"], capture_output=True, text=True)  # fmt: skip
    found = sorted(cache.glob(f"sglang-{version}-*.whl"))
    if not found:
        pytest.fail(f"could not fetch the sglang {version} wheel (set FOUNDRY_SGLANG_WHEEL): {proc.stderr[-500:]}")
    return found[0]


@pytest.fixture(scope="module", params=CHECKED_VERSIONS)
def wheel(request) -> zipfile.ZipFile:
    given = os.environ.get("FOUNDRY_SGLANG_WHEEL")
    path = Path(given) if given else _download(request.param)
    with zipfile.ZipFile(path) as archive:
        yield archive


def _module(wheel: zipfile.ZipFile, dotted: str) -> ast.Module:
    return ast.parse(wheel.read(dotted.replace(".", "/") + ".py"))


def _find(tree: ast.Module, names: list[str]) -> ast.AST | None:
    scope: ast.AST = tree
    for name in names:
        scope = next((n for n in ast.iter_child_nodes(scope)
                      if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name),
                     None)  # fmt: skip
        if scope is None:
            return None
    return scope


def test_the_wheel_is_the_checked_version(wheel):
    source = wheel.read("sglang/_version.py").decode()
    assert any(f"'{v}'" in source or f'"{v}"' in source for v in CHECKED_VERSIONS), source


@pytest.mark.parametrize(
    "point", HOOK_POINTS + TP_HOOK_POINTS, ids=lambda p: p.target.rsplit(".", 2)[-2] + "." + p.target.rsplit(".", 1)[-1]
)
def test_every_hook_point_exists_with_its_parameters(wheel, point):
    tree = _module(wheel, point.module)
    if point.defined_in is not None:  # a function the module imports by name: patched where it calls it
        imported = {(node.module, alias.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    for alias in node.names if alias.asname is None}  # fmt: skip
        assert (point.defined_in, point.attribute) in imported, f"{point.module} no longer imports {point.attribute}"
        tree = _module(wheel, point.defined_in)
        found = _find(tree, [point.attribute])
    else:
        found = _find(tree, point.target.removeprefix(point.module + ".").split("."))
    assert isinstance(found, ast.FunctionDef), f"{point.target} is not in sglang's sources"
    args = found.args
    assert tuple(a.arg for a in (*args.posonlyargs, *args.args)) == point.parameters


def test_plugins_load_from_the_group_foundry_registers_in(wheel):
    source = wheel.read("sglang/srt/plugins/__init__.py").decode()
    assert 'GENERAL_PLUGINS_GROUP = "sglang.srt.plugins"' in source
    assert [ep.value for ep in entry_points(group="sglang.srt.plugins") if ep.name == "foundry"] == [
        "foundry.integrations.sglang.plugin:register"
    ]
    load = _find(ast.parse(source), ["load_plugins"])
    calls = {ast.unparse(n.func) for n in ast.walk(load) if isinstance(n, ast.Call)}
    assert "func" in calls  # each plugin's entry point is called (it patches; SGLang's registry stays unused)
    from foundry.integrations.sglang import plugin  # the table the plugin patches with is the one checked here

    assert all(callable(getattr(plugin, p.handler, None)) for p in HOOK_POINTS + TP_HOOK_POINTS)


def _imported_names(tree: ast.Module, package: str) -> set[tuple[str, str]]:
    """(module, name) of every ``from module import name`` in a module of ``package``."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            base = package.rsplit(".", node.level - 1)[0] + "." if node.level else ""
            found |= {(base + node.module, alias.name) for alias in node.names if alias.asname is None}
    return found


def test_every_module_calling_a_patched_function_by_its_imported_name_is_in_the_table(wheel):
    """A function the plugin patches where modules import it by name must be patched in each
    module that calls it (SGLang's registry would have followed every copy; the plugin
    patches those the table names)."""
    modules = {n[:-3].replace("/", "."): n for n in wheel.namelist() if n.startswith("sglang/") and n.endswith(".py")}
    for defined_in, name in {(p.defined_in, p.attribute) for p in HOOK_POINTS if p.defined_in}:
        callers = set()
        for module, path in modules.items():
            tree = ast.parse(wheel.read(path))
            package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
            if (defined_in, name) not in _imported_names(tree, package.removesuffix(".__init__")):
                continue
            if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name
                   for n in ast.walk(tree)):  # fmt: skip
                callers.add(module)
        patched = {p.module for p in HOOK_POINTS if p.defined_in == defined_in and p.attribute == name}
        assert callers == patched, f"{defined_in}.{name} is called by name in {sorted(callers)}"


def test_server_arguments_the_plugin_compares_are_server_args_fields(wheel):
    server_args = _find(_module(wheel, "sglang.srt.server_args"), ["ServerArgs"])
    fields = {n.target.id for n in ast.iter_child_nodes(server_args) if isinstance(n, ast.AnnAssign)}
    assert set(SERVER_ARGS) <= fields, sorted(set(SERVER_ARGS) - fields)


def test_flashinfer_allreduce_fusion_is_a_server_arg_sglang_turns_on_for_the_moe_preset_only(wheel):
    """The plugin refuses FlashInfer's fused all-reduce at tp above 1 by this field; SGLang's
    own pass enables it for Qwen3-MoE (the MoE preset) and not for dense Qwen3 (qwen3-8b), and
    the flag the refusal names turns it off."""
    server_args = _find(_module(wheel, "sglang.srt.server_args"), ["ServerArgs"])
    fields = {n.target.id for n in ast.iter_child_nodes(server_args) if isinstance(n, ast.AnnAssign)}
    assert {"flashinfer_allreduce_fusion_backend", "enforce_disable_flashinfer_allreduce_fusion", "enable_symm_mem",
            "enable_torch_symm_mem", "enable_mscclpp"} <= fields  # fmt: skip
    overrides = _module(wheel, "sglang.srt.arg_groups.overrides")
    archs = next(n.value for n in ast.iter_child_nodes(overrides) if isinstance(n, ast.Assign)
                 and getattr(n.targets[0], "id", "") == "_FLASHINFER_ALLREDUCE_FUSION_ARCHS")  # fmt: skip
    named = {c.value for c in ast.walk(archs) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    assert "Qwen3MoeForCausalLM" in named and "Qwen3ForCausalLM" not in named
    enable = _find(overrides, ["_flashinfer_allreduce_fusion_auto_enable"])
    assert "tp_size" in ast.unparse(enable)


def test_allowlisted_output_records_are_dataclasses_there(wheel):
    for name, path in RECORD_TYPES.items():
        if not name.startswith("sglang."):
            continue
        module, qualname = path.split(":")
        found = _find(_module(wheel, module), qualname.split("."))
        assert isinstance(found, ast.ClassDef), path
        decorators = {d.id if isinstance(d, ast.Name) else getattr(d, "attr", "") for d in found.decorator_list}
        assert "dataclass" in decorators, path


def test_the_full_backend_keeps_graphs_and_outputs_where_the_plugin_puts_them(wheel):
    backend = _find(_module(wheel, "sglang.srt.model_executor.runner_backend.full_cuda_graph_backend"),
                    ["FullCudaGraphBackend", "__init__"])  # fmt: skip
    targets = [t for n in ast.walk(backend) if isinstance(n, ast.Assign) for t in n.targets]
    targets += [n.target for n in ast.walk(backend) if isinstance(n, ast.AnnAssign)]
    assigned = {t.attr for t in targets if isinstance(t, ast.Attribute)}
    assert {"_graphs", "_outputs", "_device_module", "_tp_group"} <= assigned


def _recipe(name: str):
    """A module of recipes/sglang (SGLang itself is imported only when a run starts)."""
    return load_script(Path(__file__).resolve().parent.parent / "recipes" / "sglang" / f"{name}.py",
                       f"sglang_recipe_{name}")  # fmt: skip


def test_the_recipe_reads_sglangs_own_startup_line(wheel):
    """The recipe parses the line SGLang's Engine logs, formatted here with the
    format string taken from the wheel's source."""
    method = _find(_module(wheel, "sglang.srt.entrypoints.engine"), ["Engine", "_set_startup_time"])
    assert method is not None
    call = next(n for n in ast.walk(method) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "info")
    template = ast.literal_eval(call.args[0])
    line = "[2026-11-29 14:20:00] " + template % (1.25, 0.5, 41.75, "decode=2.70, prefill=0.00", 44.5)
    timings = _recipe("run").parse_startup(line)
    assert timings == {"load_weight": 1.25, "kv_cache_allocation": 0.5, "scheduler_e2e": 41.75,
                       "cuda_graph": {"decode": 2.7, "prefill": 0.0}, "tokenizer_e2e": 44.5}  # fmt: skip
    assert _recipe("run").parse_startup("Capturing batches (bs=8)") is None


def test_the_comparison_reports_graph_time_against_the_reference():
    table = _recipe("compare").startup_table(
        ["base.json", "load.json", "other.json"],
        [{"startup": {"scheduler_e2e": 40.0, "cuda_graph": {"decode": 3.0, "prefill": 0.0}}, "wall_s": 150.72},
         {"startup": {"scheduler_e2e": 37.1, "cuda_graph": {"decode": 0.1}}, "wall_s": 68.6, "ready_s": 21.04,
          "batch_s": [45.25, 0.3], "foundry": {"sglang_seconds": {"warmup_forwards_s": 0.06, "graphs_s": 0.04}}},
         {"startup": None}],
    )  # fmt: skip
    assert len(table) == 4 and "30.0x less" in table[2] and "load.json" in table[2] and "1.0x less" in table[1]
    assert "(decode 3.00)" in table[1]  # phases that took no time are left out
    assert "; run 150.7 " in table[1] and "; run 68.6, ready 21.0, first batch 45.2 " in table[2]  # where JIT went
    assert "warm-up forwards 0.06, Foundry's graphs 0.04" in table[3]


def test_the_comparison_says_in_one_line_when_a_report_is_missing(tmp_path):
    script = [sys.executable, str(Path(__file__).parent.parent / "recipes" / "sglang" / "compare.py")]
    proc = subprocess.run([*script, str(tmp_path / "absent.json"), str(tmp_path / "b.json")],
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "absent.json" in proc.stderr
    plugin_report = tmp_path / "plugin.json"  # the plugin's own report is not a run report
    plugin_report.write_text('{"mode": "load", "graphs": 4}')
    proc = subprocess.run([*script, str(plugin_report), str(plugin_report)], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no outputs" in proc.stderr


def test_custom_allreduce_v2_is_what_the_backend_reads(wheel):
    """SGLang's CUDA default is the JIT all-reduce; its kernel parameter is the struct the
    ``custom-allreduce`` backend decodes, its workspace slab the layout it checks, and
    graph inputs land in rows of ``graph_params`` after capture."""
    from foundry.backends.custom_allreduce_abi import fields

    environ = wheel.read("sglang/srt/environ.py").decode()
    assert "SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2 = EnvBool(True)" in environ
    source = wheel.read("sglang/kernels/jit/csrc/distributed/custom_all_reduce.cuh").decode()
    body = re.search(r"struct AllReduceParams \{(.*?)\};", source, re.S).group(1)
    members = []
    for line in body.splitlines():
        declared = re.match(r"\s*(.+?)\s*(\w+)(\[kWorldSize\])?;", line.split("//")[0])
        if declared:
            pointer = "*" in declared.group(1)
            size = 8 if pointer else {"uint32_t": 4, "int64_t": 8}[declared.group(1)]
            members.append((declared.group(2), bool(declared.group(3)), pointer, size))
    ours = [(f.name.split("[")[0], "[" in f.name, f.pointer, f.size) for f in fields(1)]
    assert members == ours
    assert "void all_reduce_kernel(const __grid_constant__ AllReduceParams<kWorldSize> params)" in source
    v2 = _module(wheel, "sglang.srt.distributed.device_communicators.custom_all_reduce_v2")
    text = ast.unparse(_find(v2, ["CustomAllReduceV2", "_init_workspace"]))
    assert "push_num_bufs = 2 * self.world_size" in text and "pull_ws_offset = push_ws_bytes" in text
    assert "pull_sem_offset = push_ws_bytes + pull_ws_bytes" in text
    assert "_SEMAPHORE_BYTES * cfg.num_pull_blocks" in text
    rows = ast.unparse(_find(v2, ["CustomAllReduceV2", "register_peer_mapped_inputs"]))
    assert "self.graph_params[self._graph_counter:self._graph_counter + count].copy_(rows)" in rows


@pytest.mark.parametrize("point", [p for p in HOOK_POINTS + TP_HOOK_POINTS if p.body_sha256], ids=lambda p: p.attribute)
def test_the_bodies_the_plugin_stands_in_for_are_the_checked_ones(wheel, point):
    """The handler re-does what SGLang's body does (there: registering through the cudaIpc
    path alone): a changed body must be read again before its digest is."""
    source = wheel.read(point.module.replace(".", "/") + ".py").decode()
    found = _find(ast.parse(source), point.target.removeprefix(point.module + ".").split("."))
    assert hashlib.sha256(ast.get_source_segment(source, found).encode()).hexdigest() == point.body_sha256


def test_the_custom_all_reduce_holds_what_the_tensor_parallel_plugin_reads(wheel):
    """The attributes ``tensor_parallel`` reads of a ``CustomAllReduceV2`` and its
    configuration, the workspace made through the function it patches, the registration's
    cudaIpc path it calls, and the one custom all-reduce of a TP server (the TP group's)."""
    v2 = _module(wheel, "sglang.srt.distributed.device_communicators.custom_all_reduce_v2")
    cls = _find(v2, ["CustomAllReduceV2"])
    assigned = {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                and isinstance(n.value, ast.Name) and n.value.id == "self"}  # fmt: skip
    assert {"rank", "world_size", "disabled", "_symm_tensor", "max_push_size", "max_pull_size", "config",
            "graph_params", "_graph_inputs", "_graph_counter", "mc_base_ptr"} <= assigned  # fmt: skip
    init = ast.unparse(_find(v2, ["CustomAllReduceV2", "_init_workspace"]))
    assert "self._symm_tensor, symm_mem = _allocate_symmetric_memory(total_bytes" in init
    allocate = ast.unparse(_find(v2, ["_allocate_symmetric_memory"]))
    assert "return (tensor, symm_mem)" in allocate
    assert _find(v2, ["CustomAllReduceV2", "_register_graph_inputs_ipc"]) is not None
    configs = _module(wheel, "sglang.srt.distributed.device_communicators.configs.custom_all_reduce_v2")
    fields = {n.target.id for n in ast.walk(_find(configs, ["AllReduceConfig"])) if isinstance(n, ast.AnnAssign)}
    assert {"num_push_blocks", "num_pull_blocks", "num_mc_blocks"} <= fields
    with_custom = set()  # groups made with SGLang's custom all-reduce (the others pass False)
    for node in ast.walk(_module(wheel, "sglang.srt.distributed.parallel_state")):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                ast.unparse(node.value.func) == "init_model_parallel_group":  # fmt: skip
            given = {k.arg: ast.unparse(k.value) for k in node.value.keywords}
            if given.get("use_custom_allreduce") != "False":
                with_custom.add(ast.unparse(node.targets[0]))
    # the TP group; the others span more than one GPU only with context parallelism, MoE data
    # parallelism or prefill multiplexing (a second custom all-reduce in a scheduler is refused)
    assert with_custom == {"_TP", "_DCP", "_ATTN_CP", "_MOE_DP", "_PDMUX_PREFILL_TP_GROUP"}

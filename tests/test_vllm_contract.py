"""Contract tests against the sources of the pinned vLLM release (``vllm==0.25.1``):
its sdist is parsed with ``ast`` (importing vLLM needs the CUDA build of torch), and
every hook point, every name the plugin imports from vLLM, every attribute it reads
and every configuration field it compares must be there as the plugin expects.

The sdist (38 MB) is downloaded from PyPI once into ``$XDG_CACHE_HOME/foundry-tests``
and checked against its sha256, or taken from ``FOUNDRY_VLLM_SDIST`` (the ``.tar.gz``
or the directory it unpacks to); without it these tests fail rather than skip."""

from __future__ import annotations

import ast
import hashlib
import os
import re
import tarfile
import types
import urllib.request
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from foundry.archive.jit_caches import SPECS, Cache
from foundry.integrations.vllm import engine_config, plugin
from foundry.integrations.vllm.engine_config import CONFIG_FIELDS
from foundry.integrations.vllm.hookpoints import CHECKED_VERSIONS, HOOK_POINTS

from .test_vllm_recipe import recipe

ROOT = Path(__file__).resolve().parent.parent

#: The sdist of every checked version: its address on PyPI's file host and its sha256.
SDISTS = {
    "0.25.1": (
        "https://files.pythonhosted.org/packages/bf/ce/542315fe84e23a73b919d64794350233d4f1c70b2544ba0afd5348005aff/"
        "vllm-0.25.1.tar.gz",
        "ddbdec3f1c0f21afa70b7eb6ddf3faa29d26b1302ee4b5d5e00ec3af41b0c2e4",
    ),
}


class Sources:
    """The ``vllm/`` Python sources of one release, read once from its sdist."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files
        self.trees: dict[str, ast.Module] = {}

    @classmethod
    def open(cls, path: Path) -> Sources:
        if path.is_dir():
            return cls({str(p.relative_to(path)): p.read_text() for p in (path / "vllm").rglob("*.py")})
        files = {}
        with tarfile.open(path) as archive:
            for member in archive:
                parts = member.name.split("/", 1)
                if member.isfile() and len(parts) == 2 and parts[1].startswith("vllm/") and parts[1].endswith(".py"):
                    files[parts[1]] = archive.extractfile(member).read().decode()
        return cls(files)

    def text(self, module: str) -> str:
        base = module.replace(".", "/")
        for candidate in (f"{base}.py", f"{base}/__init__.py"):
            if candidate in self.files:
                return self.files[candidate]
        raise AssertionError(f"{module} is not in vLLM's sources")

    def tree(self, module: str) -> ast.Module:
        if module not in self.trees:
            self.trees[module] = ast.parse(self.text(module))
        return self.trees[module]


def _download(version: str) -> Path:
    url, sha256 = SDISTS[version]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "foundry-tests"
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"vllm-{version}.tar.gz"
    if not path.is_file():
        partial = path.with_suffix(f".part{os.getpid()}")
        try:
            with urllib.request.urlopen(url, timeout=120) as response, open(partial, "wb") as out:
                while block := response.read(1 << 20):
                    out.write(block)
        except OSError as err:
            partial.unlink(missing_ok=True)
            pytest.fail(f"could not fetch the vllm {version} sdist (set FOUNDRY_VLLM_SDIST): {err}")
        partial.replace(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != sha256:
        path.unlink()
        pytest.fail(f"the vllm {version} sdist has sha256 {digest}, not {sha256}; removed, fetch it again")
    return path


@pytest.fixture(scope="module", params=CHECKED_VERSIONS)
def vllm(request) -> Sources:
    given = os.environ.get("FOUNDRY_VLLM_SDIST")
    return Sources.open(Path(given) if given else _download(request.param))


def _find(tree: ast.AST, names: list[str]) -> ast.AST | None:
    scope: ast.AST | None = tree
    for name in names:
        scope = next((n for n in ast.iter_child_nodes(scope)
                      if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name),
                     None)  # fmt: skip
        if scope is None:
            return None
    return scope


def _assigned(function: ast.AST) -> set[str]:
    """``self.X`` names a function assigns."""
    targets = [t for n in ast.walk(function) if isinstance(n, ast.Assign) for t in n.targets]
    targets += [n.target for n in ast.walk(function) if isinstance(n, ast.AnnAssign)]
    return {t.attr for t in targets if isinstance(t, ast.Attribute)}


def _fields(cls: ast.ClassDef) -> set[str]:
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def _calls(function: ast.AST) -> set[str]:
    """Names of what a function calls (``f(...)`` and ``x.f(...)`` alike)."""
    return {getattr(n.func, "attr", getattr(n.func, "id", "")) for n in ast.walk(function) if isinstance(n, ast.Call)}


def test_the_sdist_is_the_checked_version(vllm):
    source = vllm.text("vllm._version")
    assert any(f"version = '{v}'" in source for v in CHECKED_VERSIONS), source


@pytest.mark.parametrize("point", HOOK_POINTS, ids=lambda p: p.target.removeprefix(p.module + "."))
def test_every_hook_point_exists_with_its_parameters(vllm, point):
    found = _find(vllm.tree(point.module), point.target.removeprefix(point.module + ".").split("."))
    assert isinstance(found, ast.FunctionDef), f"{point.target} is not in vLLM's sources"
    args = found.args
    assert tuple(a.arg for a in (*args.posonlyargs, *args.args)) == point.parameters
    assert callable(getattr(plugin, point.handler, None))


@pytest.mark.parametrize("point", [p for p in HOOK_POINTS if p.body_sha256], ids=lambda p: p.attribute)
def test_the_bodies_the_plugin_stands_in_for_are_the_checked_ones(vllm, point):
    """The handler re-does what vLLM's body does with the session in place of the
    capture: a changed body must be read again before its digest is."""
    source = vllm.text(point.module)
    found = _find(ast.parse(source), point.target.removeprefix(point.module + ".").split("."))
    body = ast.get_source_segment(source, found)
    assert hashlib.sha256(body.encode()).hexdigest() == point.body_sha256


def test_plugins_load_from_the_group_foundry_registers_in_and_their_errors_are_not_swallowed(vllm):
    tree = vllm.tree("vllm.plugins")
    assert 'DEFAULT_PLUGINS_GROUP = "vllm.general_plugins"' in vllm.text("vllm.plugins")
    assert [ep.value for ep in entry_points(group="vllm.general_plugins") if ep.name == "foundry"] == [
        "foundry.integrations.vllm.plugin:register"
    ]
    # importing a plugin is inside a try that logs and goes on; calling it is not
    loader = _find(tree, ["load_plugins_by_group"])
    guarded = [n for n in ast.walk(loader) if isinstance(n, ast.Try)]
    assert any("load" in _calls(ast.Module(body=t.body, type_ignores=[])) for t in guarded)
    general = _find(tree, ["load_general_plugins"])
    assert not [n for n in ast.walk(general) if isinstance(n, ast.Try)] and "func" in _calls(general)


def test_every_process_vllm_starts_loads_the_plugins(vllm):
    for module, names in (("vllm.engine.arg_utils", ["EngineArgs", "__post_init__"]),
                          ("vllm.v1.engine.core", ["EngineCore", "__init__"]),
                          ("vllm.v1.worker.worker_base", ["WorkerWrapperBase", "init_worker"])):  # fmt: skip
        assert "load_general_plugins" in _calls(_find(vllm.tree(module), names)), names


def test_the_names_the_plugin_imports_from_vllm_exist(vllm):
    imported = [(n.module, a.name) for n in ast.walk(ast.parse(Path(plugin.__file__).read_text()))
                if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("vllm") for a in n.names]  # fmt: skip
    assert len(imported) >= 10
    for module, name in imported:
        tree = vllm.tree(module)
        top = {n.name for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef)}
        top |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        top |= {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        top |= {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
        assert name in top, f"{module}.{name}"


def test_the_wrapper_the_plugin_patches_is_the_one_cuda_platforms_use(vllm):
    """Pieces are wrapped in the class the platform names (wrap_with_cudagraph_if_needed)."""
    method = _find(vllm.tree("vllm.platforms.cuda"), ["CudaPlatformBase", "get_static_graph_wrapper_cls"])
    returned = [n.value.value for n in ast.walk(method) if isinstance(n, ast.Return)]
    wrapper = next(p for p in HOOK_POINTS if p.attribute == "__call__")
    assert returned == [wrapper.owner]
    backends = _find(vllm.tree("vllm.compilation.backends"), ["wrap_with_cudagraph_if_needed"])
    assert "get_static_graph_wrapper_cls" in _calls(backends)


def test_the_attributes_the_hooks_read_are_where_vllm_keeps_them(vllm):
    wrapper = _find(vllm.tree("vllm.compilation.cuda_graph"), ["CUDAGraphWrapper", "__init__"])
    assert {"runnable", "runtime_mode", "cudagraph_options", "concrete_cudagraph_entries"} <= _assigned(wrapper)
    graphs = vllm.tree("vllm.compilation.cuda_graph")
    assert {"batch_descriptor", "cudagraph", "output", "input_addresses"} <= _fields(_find(graphs, ["CUDAGraphEntry"]))
    assert "weak_ref_output" in _fields(_find(graphs, ["CUDAGraphOptions"]))
    piece = _find(vllm.tree("vllm.compilation.piecewise_backend"), ["PiecewiseBackend", "__init__"])
    assert "piecewise_compile_index" in _assigned(piece)
    v2 = vllm.tree("vllm.v1.worker.gpu.cudagraph_utils")
    assert {"device", "graphs", "_capture_descs", "_graphs_captured"} <= _assigned(_find(v2, ["CudaGraphManager",
                                                                                             "__init__"]))  # fmt: skip
    assert "hidden_states" in _assigned(_find(v2, ["ModelCudaGraphManager", "__init__"]))
    assert {"cg_mode", "num_tokens", "num_reqs", "uniform_token_count", "num_active_loras"} <= _fields(
        _find(v2, ["BatchExecutionDescriptor"]))  # fmt: skip
    assert {"warmup", "captured"} <= _fields(_find(v2, ["AttentionStatePair"]))
    context = vllm.tree("vllm.forward_context")
    assert {"num_tokens", "num_reqs", "uniform", "has_lora", "num_active_loras"} <= _fields(
        _find(context, ["BatchDescriptor"]))  # fmt: skip
    assert {"cudagraph_runtime_mode", "batch_descriptor"} <= _fields(_find(context, ["ForwardContext"]))
    worker = vllm.tree("vllm.v1.worker.gpu_worker")
    base = _find(vllm.tree("vllm.v1.worker.worker_base"), ["WorkerBase", "__init__"])
    assert {"vllm_config", "rank", "local_rank"} <= _assigned(base)
    assert {"use_v2_model_runner", "available_kv_cache_memory_bytes"} <= _assigned(_find(worker, ["Worker"]))
    for module in ("vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner"):
        assert "vllm_config" in _assigned(_find(vllm.tree(module), ["GPUModelRunner", "__init__"])), module
    counters = _fields(_find(vllm.tree("vllm.compilation.counter"), ["CompilationCounter"]))
    assert {*plugin.COMPILE_COUNTERS, "num_cudagraph_captured"} <= counters


def test_the_configuration_fields_compared_for_drift_exist(vllm):
    classes = {"model_config": ("vllm.config.model", "ModelConfig"), "cache_config": ("vllm.config.cache",
               "CacheConfig"), "scheduler_config": ("vllm.config.scheduler", "SchedulerConfig"),
               "parallel_config": ("vllm.config.parallel", "ParallelConfig"),
               "compilation_config": ("vllm.config.compilation", "CompilationConfig"),
               "attention_config": ("vllm.config.attention", "AttentionConfig"),
               "load_config": ("vllm.config.load", "LoadConfig"), "": ("vllm.config.vllm", "VllmConfig")}  # fmt: skip
    top = _fields(_find(vllm.tree("vllm.config.vllm"), ["VllmConfig"]))
    for section, names in CONFIG_FIELDS:
        module, name = classes[section]
        fields = _fields(_find(vllm.tree(module), [name]))
        assert set(names) <= fields, (section, sorted(set(names) - fields))
        assert not section or section in top
    for name in ("cache_dir", "local_cache_dir"):  # torch.compile's cache, recorded beside them
        assert name in _fields(_find(vllm.tree("vllm.config.compilation"), ["CompilationConfig"]))
    refused = {"ec_transfer_config"}  # refused by check_supported, not compared
    assert refused <= top and engine_config.check_supported.__doc__


def test_the_kv_budget_the_worker_returns_is_the_one_the_engine_sizes_the_cache_with(vllm):
    core = _find(vllm.tree("vllm.v1.engine.core"), ["EngineCore", "_initialize_kv_caches"])
    assert "determine_available_memory" in _calls(core) and "get_kv_cache_configs" in _calls(core)


def test_torch_compiles_cache_is_where_the_plugin_records_it(vllm):
    """vLLM keys the cache directory by a hash of its configuration and code (the
    files' paths among them), and points Inductor's and Triton's caches into it."""
    backends = vllm.text("vllm.compilation.backends")
    assert 'os.path.join(\n                envs.VLLM_CACHE_ROOT, "torch_compile_cache", hash_key\n' in backends
    assert "self.compilation_config.cache_dir = cache_dir" in backends
    assert "hash_content.append(filepath)" in backends
    adaptor = ast.get_source_segment(vllm.text("vllm.compilation.compiler_interface"), _find(
        vllm.tree("vllm.compilation.compiler_interface"), ["InductorAdaptor", "initialize_cache"]))  # fmt: skip
    assert 'os.environ["TORCHINDUCTOR_CACHE_DIR"]' in adaptor and 'os.environ["TRITON_CACHE_DIR"]' in adaptor


@pytest.mark.parametrize(
    "environ",
    [
        {"HOME": "/h"},
        {"HOME": ""},
        {"HOME": "/h", "XDG_CACHE_HOME": "~/x"},
        {"HOME": "/h", "XDG_CACHE_HOME": "/x", "VLLM_CACHE_ROOT": "~/v"},
    ],
)
def test_vllms_cache_root_is_resolved_as_vllm_resolves_it(vllm, environ):
    """vLLM's own ``get_default_cache_root`` and ``VLLM_CACHE_ROOT`` entry (vllm/envs.py), run
    against ``environ`` through a stand-in ``os``, find the directory Foundry's resolution finds."""
    tree = vllm.tree("vllm.envs")
    default_root = _find(tree, ["get_default_cache_root"])
    table = next(n.value for n in tree.body if isinstance(n, ast.AnnAssign) and n.target.id == "environment_variables")
    entry = next(v for k, v in zip(table.keys, table.values, strict=True) if ast.literal_eval(k) == "VLLM_CACHE_ROOT")
    path = types.SimpleNamespace(
        join=os.path.join, expanduser=lambda p: (environ["HOME"].rstrip("/") + p[1:] or "/") if p[:1] == "~" else p
    )
    namespace = {"os": types.SimpleNamespace(getenv=environ.get, path=path)}
    exec(compile(ast.Module([default_root], []), "vllm/envs.py", "exec"), namespace)
    found = eval(compile(ast.Expression(entry), "vllm/envs.py", "eval"), namespace)()
    assert Path(found) == SPECS[Cache.VLLM].resolve(environ).path


def test_the_children_vllm_starts_follow_the_start_method_the_plugin_sets(vllm):
    envs = vllm.text("vllm.envs")
    assert '"VLLM_WORKER_MULTIPROC_METHOD", "fork", ["spawn", "fork"]' in envs
    assert list(plugin.CHILDREN) == ["VLLM_WORKER_MULTIPROC_METHOD"]
    # neither that setting nor a run's own cache root changes torch.compile's cache key
    ignored = ast.literal_eval(next(n.value for n in ast.walk(_find(vllm.tree("vllm.envs"), ["compile_factors"]))
                                    if isinstance(n, ast.AnnAssign) and n.target.id == "ignored_factors"))  # fmt: skip
    assert {"VLLM_WORKER_MULTIPROC_METHOD", "VLLM_CACHE_ROOT"} <= ignored
    system = _find(vllm.tree("vllm.utils.system_utils"), ["get_mp_context"])
    assert "get_context" in _calls(system)


def test_the_default_capture_sizes_are_the_recipes(vllm):
    """The recipe walks the batch through every default capture size; its rule is
    vLLM's (VllmConfig._set_cudagraph_sizes), which must not have changed."""
    method = ast.get_source_segment(
        vllm.text("vllm.config.vllm"), _find(vllm.tree("vllm.config.vllm"), ["VllmConfig", "_set_cudagraph_sizes"])
    )
    squashed = re.sub(r"\s+", " ", method)
    for piece in (
        "min( self.scheduler_config.max_num_seqs * decode_query_len * 2, 512 )",
        "min(max_num_tokens, max_cudagraph_capture_size)",
        "[1, 2, 4] if i <= max_cudagraph_capture_size",
        "range(8, min(max_cudagraph_capture_size + 1, 256), 8)",
        "range(256, max_cudagraph_capture_size + 1, 16)",
        "cudagraph_capture_sizes.append(max_num_tokens)",
    ):
        assert piece in squashed, piece
    run = recipe("run")
    sizes = run.capture_sizes(max_num_seqs=256, max_num_batched_tokens=8192)
    assert len(sizes) == 51 and sizes[:4] == [1, 2, 4, 8] and sizes[-1] == 512
    assert run.capture_sizes(max_num_seqs=8, max_num_batched_tokens=8192) == [1, 2, 4, 8, 16]
    assert run.capture_sizes(max_num_seqs=256, max_num_batched_tokens=300)[-3:] == [272, 288, 300]


def test_the_recipe_reads_vllms_own_startup_lines(vllm):
    """The recipe parses the lines vLLM logs, formatted here with the format strings
    taken from the release's sources."""

    def template(module: str, start: str, end: str = "") -> str:
        texts = [
            n.value for n in ast.walk(vllm.tree(module)) if isinstance(n, ast.Constant) and isinstance(n.value, str)
        ]
        found = [t for t in texts if t.startswith(start) and t.endswith(end)]
        assert found, start
        return found[0]

    capture = template("vllm.v1.worker.gpu.model_runner", "Graph capturing finished in")
    assert capture == template("vllm.v1.worker.gpu_model_runner", "Graph capturing finished in")  # both runners
    engine = template(
        "vllm.v1.engine.core", "init engine (profile, create kv cache, warmup model) took", "(compilation: %.2f s)"
    )
    compiled = template("vllm.compilation.monitor", "torch.compile took")
    run = recipe("run")
    lines = [
        f"(EngineCore pid=7) INFO 12-01 14:00:00 [gpu_model_runner.py:6708] {capture % (41, 0.52)}",
        f"INFO 12-01 14:00:01 [core.py:328] {engine % (63.25, 18.5)}",
        f"INFO [monitor.py:20] {compiled % 18.25}",
    ]
    found: dict = {}
    for line in lines:
        found.update(run.parse_startup(line) or {})
    assert found == {"graph_capture_s": 41.0, "graph_memory_gib": 0.52, "init_engine_s": 63.25,
                     "compilation_s": 18.5, "torch_compile_s": 18.25}  # fmt: skip
    assert run.parse_startup("Capturing CUDA graphs (PIECEWISE): 100%") is None


def test_the_sources_are_read_from_a_directory_too(vllm, tmp_path):
    """FOUNDRY_VLLM_SDIST may name the unpacked sdist: the same files are read."""
    (tmp_path / "vllm" / "plugins").mkdir(parents=True)
    (tmp_path / "vllm" / "plugins" / "__init__.py").write_text(vllm.text("vllm.plugins"))
    assert Sources.open(tmp_path).text("vllm.plugins") == vllm.text("vllm.plugins")

"""The vLLM plugin's own logic on the CPU: configuration, version refusal, failing
closed in a real process, patching every hook point or none, graph names, drift by
field, and the hooks' bookkeeping.

vLLM is not installed here (importing it needs the CUDA build of torch): where a
hook needs vLLM's runtime (its forward context, CUDA graph wrappers and entries,
its graph managers) or a GPU session, small stand-ins take their place, and each
test says so. The registration tests run the real plugin in a real child process
against a stand-in vLLM distribution whose modules hold the hook points' classes."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from foundry.errors import DriftError, FoundryError
from foundry.integrations.common import patching
from foundry.integrations.common.hookpoints import HookPoint
from foundry.integrations.vllm import engine_config, graphs, plugin
from foundry.integrations.vllm.config import PluginConfig, load_config
from foundry.integrations.vllm.hookpoints import CHECKED_VERSIONS, HOOK_POINTS, check_version

from .engine_stubs import fake_engine

# -- configuration ---------------------------------------------------------------------


def test_the_launcher_or_a_toml_file_configures_the_plugin(tmp_path):
    assert load_config({}) == PluginConfig()
    launched = load_config({"FOUNDRY_MODE": "save", "FOUNDRY_ARCHIVE": "/srv/a", "FOUNDRY_REGION_SIZE": str(96 << 30)})
    assert launched == PluginConfig("save", "/srv/a", None, 96 << 30, from_launcher=True)
    good = tmp_path / "foundry.toml"
    good.write_text('mode = "load"\narchive = "/srv/a"\nregion_base = 0x600000000000\n')
    assert load_config({"FOUNDRY_VLLM_CONFIG": str(good)}) == PluginConfig("load", "/srv/a", 0x600000000000)
    assert load_config({"FOUNDRY_SGLANG_CONFIG": str(good)}) == PluginConfig()  # the other engine's file
    for text, message in (("mode = load", "not TOML"), ('mode = "save"\n', "needs an archive"),
                          ('mode = "save"\narchive = "/a"\nport = 1\n', "invalid plugin configuration"),
                          ('mode = "load"\narchive = "/a"\nfrom_launcher = true\n', "unknown setting")):  # fmt: skip
        bad = tmp_path / "bad.toml"
        bad.write_text(text)
        with pytest.raises(FoundryError, match=message):
            load_config({"FOUNDRY_VLLM_CONFIG": str(bad)})


def test_only_checked_vllm_versions_are_accepted():
    check_version(CHECKED_VERSIONS[0])
    with pytest.raises(FoundryError, match="this vLLM version was not checked against") as err:
        check_version("0.26.0")
    assert err.value.field == "vllm.version" and err.value.found == "0.26.0"


# -- registration in a real process --------------------------------------------------------

REGISTER = "from foundry.integrations.vllm.plugin import register; register(); print('went on')"


def _fake_vllm(root: Path, version: str, *, leave_out: str | None = None) -> Path:
    return fake_engine(root, "vllm", version, HOOK_POINTS, leave_out=leave_out)


def _register(env: dict[str, str], code: str = REGISTER) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", **env})  # fmt: skip


def test_a_plugin_that_cannot_run_stops_the_process_with_the_reason(tmp_path):
    # vLLM calls the entry point outside any try (it swallows only import errors): the
    # plugin's SystemExit ends the process, with its reason. Here vLLM itself is absent.
    load = {"FOUNDRY_MODE": "load", "FOUNDRY_ARCHIVE": str(tmp_path)}
    proc = _register(load)
    assert proc.returncode == 1 and "went on" not in proc.stdout
    assert "foundry: the vLLM plugin cannot run" in proc.stderr and "vllm.version" in proc.stderr
    restore = _register({**load, "FOUNDRY_LOAD_WARMUP": "restore"})
    assert restore.returncode == 1 and "restoring their bytes is not supported yet" in restore.stderr
    off = _register({})
    assert off.returncode == 0 and "went on" in off.stdout and off.stderr == ""  # off: nothing checked, nothing said


def test_an_unknown_vllm_version_is_refused_before_anything_is_patched(tmp_path):
    root = _fake_vllm(tmp_path / "site", "0.26.0")
    code = ("import json, sys\nfrom foundry.integrations.vllm.plugin import register\n"
            "try:\n    register()\nexcept SystemExit as stop:\n    print(stop.code, file=sys.stderr)\n"
            "import vllm.v1.worker.gpu_worker as w\n"
            "print(json.dumps(hasattr(w.Worker.init_device, '__wrapped__')))\n")  # fmt: skip
    proc = _register({"FOUNDRY_MODE": "save", "FOUNDRY_ARCHIVE": str(tmp_path / "a"), "PYTHONPATH": str(root)}, code)
    assert proc.returncode == 0, proc.stderr
    assert "this vLLM version was not checked" in proc.stderr and "0.26.0" in proc.stderr
    assert json.loads(proc.stdout) is False


def test_a_checked_vllm_gets_every_hook_and_the_process_says_it_is_active(tmp_path):
    root = _fake_vllm(tmp_path / "site", CHECKED_VERSIONS[0])
    code = ("import json, os\nfrom foundry.integrations.common.patching import check_patched\n"
            "from foundry.integrations.vllm import plugin\nplugin.register(); plugin.register()\n"
            "check_patched(plugin.HOOK_POINTS, 'vllm')\n"
            "import vllm.v1.worker.gpu_worker as w\n"
            "print(json.dumps([os.getpid(), os.environ.get('VLLM_WORKER_MULTIPROC_METHOD'),"
            " w.Worker().determine_available_memory(),"
            " w.Worker.determine_available_memory.__wrapped__.__name__]))\n")  # fmt: skip
    proc = _register({"FOUNDRY_MODE": "load", "FOUNDRY_ARCHIVE": str(tmp_path / "a"), "PYTHONPATH": str(root)}, code)
    assert proc.returncode == 0, proc.stderr
    # patched once (a second register leaves the hooks alone), children spawned; with no
    # session in this process a hook hands the call to vLLM
    pid, *seen = json.loads(proc.stdout)
    assert seen == ["spawn", "original", "determine_available_memory"]
    active = f"foundry: vLLM plugin active (pid {pid}): mode load, archive {tmp_path / 'a'}"
    assert proc.stderr.splitlines() == [active, active]


def test_a_hook_point_vllm_lacks_stops_the_process_and_patches_nothing(tmp_path):
    missing = next(p.target for p in HOOK_POINTS if p.attribute == "__call__")
    root = _fake_vllm(tmp_path / "site", CHECKED_VERSIONS[0], leave_out=missing)
    code = ("import json, sys\nfrom foundry.integrations.vllm.plugin import register\n"
            "try:\n    register()\nexcept SystemExit as stop:\n    print(stop.code, file=sys.stderr)\n"
            "import vllm.v1.worker.gpu_worker as w\n"
            "print(json.dumps(hasattr(w.Worker.init_device, '__wrapped__')))\n")  # fmt: skip
    proc = _register({"FOUNDRY_MODE": "save", "FOUNDRY_ARCHIVE": str(tmp_path / "a"), "PYTHONPATH": str(root)}, code)
    assert proc.returncode == 0, proc.stderr
    assert "foundry: the vLLM plugin cannot run" in proc.stderr and "vllm.hooks" in proc.stderr
    assert missing in proc.stderr and json.loads(proc.stdout) is False


def test_without_foundry_run_the_plugin_prepares_the_engines_children(with_hook, tmp_path):
    # vLLM starts its engine core (and workers) as spawned children of this process:
    # they inherit the hook and the session's description
    root = _fake_vllm(tmp_path / "site", CHECKED_VERSIONS[0])
    config = tmp_path / "foundry.toml"
    config.write_text(f'mode = "save"\narchive = "{tmp_path / "a"}"\n')
    code = (
        "import json, os\nfrom foundry.integrations.vllm.plugin import register\nregister()\n"
        "print(json.dumps(dict(os.environ)))"
    )
    proc = _register({"FOUNDRY_VLLM_CONFIG": str(config), "PYTHONPATH": str(root),
                      "FOUNDRY_HOOK_LIB": str(with_hook)}, code)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    child = json.loads(proc.stdout)
    assert child["LD_PRELOAD"].split(":")[0] == str(with_hook)
    assert child["FOUNDRY_MODE"] == "save" and child["FOUNDRY_ARCHIVE"] == str(tmp_path / "a")
    assert child["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn" and child["PYTHONHASHSEED"] == "0"


# -- patching (a real module of this test's own) --------------------------------------------


def test_patching_runs_handlers_before_around_and_after_and_keeps_the_original(tmp_path, monkeypatch):
    (tmp_path / "engine_demo.py").write_text(
        textwrap.dedent("""
        class Engine:
            def start(self, n):
                return n + 1
            def size(self, n):
                return n * 2
            def run(self, n):
                return n - 1
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    handlers = types.SimpleNamespace(__name__="handlers", before=lambda engine, n: seen.append(("before", n)),
                                     around=lambda original, engine, n: original(engine, n) * 10,
                                     after=lambda result, engine, n: None if n == 0 else result + 100)  # fmt: skip
    points = [HookPoint(f"engine_demo.Engine.{name}", "engine_demo", ("self", "n"), "test", hook, handler)
              for name, hook, handler in (("start", "BEFORE", "before"), ("size", "AROUND", "around"),
                                          ("run", "AFTER", "after"))]  # fmt: skip
    with pytest.raises(FoundryError, match="one of the plugin's hooks is not in place"):
        patching.check_patched(points, "vllm")
    patching.install(points, handlers, "vllm")
    patching.install(points, handlers, "vllm")  # a second install wraps nothing twice
    import engine_demo

    engine = engine_demo.Engine()
    assert (engine.start(3), engine.size(3), engine.run(3), engine.run(0)) == (4, 60, 102, -1)
    assert seen == [("before", 3)]
    assert engine_demo.Engine.size.__wrapped__(engine, 3) == 6
    patching.check_patched(points, "vllm")
    broken = [*points, HookPoint("engine_demo.Engine.stop", "engine_demo", ("self",), "test", "BEFORE", "before")]
    with pytest.raises(FoundryError, match="does not exist") as err:
        patching.install(broken, handlers, "vllm")
    assert err.value.field == "vllm.hooks" and err.value.found == "engine_demo.Engine.stop"
    with pytest.raises(FoundryError, match="unknown hook type"):
        HookPoint("engine_demo.Engine.run", "engine_demo", ("self",), "test", "INSTEAD", "after")


# -- names, configuration, inputs ----------------------------------------------------------


def test_graph_names_follow_mode_descriptor_and_piece():
    v1 = collections.namedtuple("BatchDescriptor", "num_tokens num_reqs uniform has_lora num_active_loras")
    v2 = collections.namedtuple("BatchExecutionDescriptor", "cg_mode num_tokens num_reqs uniform_token_count "
                                "num_active_loras")  # fmt: skip
    assert graphs.graph_name("FULL", v1(8, 8, True, False, 0)) == "full.t8.r8.u"
    assert graphs.graph_name("PIECEWISE", v1(512, None, False, False, 0), piece=3) == "piecewise.t512.p3"
    assert graphs.graph_name("FULL", v2("FULL", 8, 8, 1, 0)) == "full.t8.r8.u1"
    assert graphs.graph_name("PIECEWISE", v1(64, None, False, True, 2), piece=0) == "piecewise.t64.lora2.p0"


def _configs(**changes):
    """vLLM's configuration objects as a worker sees them (stand-ins: vLLM is not installed)."""
    mode = enum.Enum("CUDAGraphMode", "NONE PIECEWISE FULL FULL_AND_PIECEWISE")
    sections = {
        "model_config": {"model": "/m", "dtype": "bfloat16", "max_model_len": 2048, "enforce_eager": False},
        "cache_config": {"block_size": 16, "gpu_memory_utilization": 0.3, "enable_prefix_caching": False},
        "scheduler_config": {"max_num_seqs": 8, "max_num_batched_tokens": 8192},
        "parallel_config": {"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "data_parallel_size": 1},
        "compilation_config": {"mode": 3, "cudagraph_mode": mode.FULL_AND_PIECEWISE, "cudagraph_capture_sizes":
                               [1, 2, 4, 8, 16], "max_cudagraph_capture_size": 16, "pass_config": {"fuse": True}},
        "attention_config": {"backend": None}, "load_config": {"load_format": "dummy"},
    }  # fmt: skip
    top = {"speculative_config": None, "lora_config": None, "kv_transfer_config": None, "ec_transfer_config": None}
    for key, value in changes.items():
        section, _, name = key.rpartition(".")
        (sections[section] if section else top)[name] = value
    return types.SimpleNamespace(**{k: types.SimpleNamespace(**v) for k, v in sections.items()}, **top), mode


def test_the_configuration_that_shapes_memory_and_kernels_is_compared_by_field():
    config, mode = _configs()
    saved = engine_config.config_fingerprint(config, "0.25.1")
    named = {engine_config.field_name(s, n) for s, names in engine_config.CONFIG_FIELDS for n in names}
    assert set(saved) == named | {"vllm.version"}
    assert saved["vllm.compilation_config.cudagraph_mode"] == '"FULL_AND_PIECEWISE"'  # by name, never a repr
    check_fields = plugin.check_fields
    check_fields(saved, engine_config.config_fingerprint(_configs()[0], "0.25.1"))
    for key, value in (("cache_config.gpu_memory_utilization", 0.35), ("scheduler_config.max_num_seqs", 16),
                       ("compilation_config.cudagraph_capture_sizes", [1, 2, 4]),
                       ("compilation_config.cudagraph_mode", mode.PIECEWISE),
                       ("attention_config.backend", "TRITON_ATTN")):  # fmt: skip
        live = engine_config.config_fingerprint(_configs(**{key: value})[0], "0.25.1")
        with pytest.raises(DriftError, match=f"differs from SAVE's in vllm.{key}") as err:
            check_fields(saved, live)
        assert err.value.field == f"vllm.{key}"
    with pytest.raises(DriftError, match=r"vllm\.version"):
        check_fields(saved, engine_config.config_fingerprint(config, "0.25.2"))
    with pytest.raises(DriftError, match=r"in vllm\.model_runner"):
        check_fields({**saved, plugin.RUNNER: "v2"}, {plugin.RUNNER: "v1"})


def test_engines_the_plugin_cannot_persist_are_refused_by_field():
    engine_config.check_supported(_configs()[0])
    _, mode = _configs()
    refused = {
        "vllm.parallel_config.tensor_parallel_size": {"parallel_config.tensor_parallel_size": 2},
        "vllm.model_config.enforce_eager": {"model_config.enforce_eager": True},
        "vllm.model_config.enable_sleep_mode": {"model_config.enable_sleep_mode": True},
        "vllm.speculative_config": {"speculative_config": object()},
        "vllm.lora_config": {"lora_config": object()},
        "vllm.compilation_config.cudagraph_mode": {"compilation_config.cudagraph_mode": mode.NONE},
        "vllm.compilation_config.use_inductor_graph_partition": {"compilation_config.use_inductor_graph_partition":
                                                                 True},
    }  # fmt: skip
    for field_name, changes in refused.items():
        with pytest.raises(FoundryError) as err:
            engine_config.check_supported(_configs(**changes)[0])
        assert err.value.field == field_name


@dataclasses.dataclass
class DeviceTensor:
    """A CUDA tensor's identity (a stand-in: no GPU here)."""

    address: int
    shape: tuple[int, ...] = (8, 4096)
    dtype: str = "torch.bfloat16"
    is_cuda: bool = True

    def data_ptr(self) -> int:
        return self.address

    def stride(self) -> tuple[int, ...]:
        return (self.shape[-1], 1) if len(self.shape) == 2 else (1,)


def test_a_restored_graph_must_read_the_inputs_save_captured_it_over():
    x, w = DeviceTensor(0x600000200000), DeviceTensor(0x600000000000, (4096, 4096))
    recorded = graphs.graph_inputs((x, w, 8, "host"), {"positions": DeviceTensor(0x600000400000, (8,))})
    assert recorded["args"][3] is None  # objects are not compared
    graphs.check_inputs("piecewise.t8.p1", recorded, graphs.graph_inputs((x, w, 8, object()), {
        "positions": DeviceTensor(0x600000400000, (8,))}))  # fmt: skip
    moved = graphs.graph_inputs(
        (DeviceTensor(0x600000280000), w, 8, None), {"positions": DeviceTensor(0x600000400000, (8,))}
    )
    with pytest.raises(DriftError, match=r"graph piecewise\.t8\.p1 would read another input than at SAVE") as err:
        graphs.check_inputs("piecewise.t8.p1", recorded, moved)
    assert err.value.field == "vllm.graphs.piecewise.t8.p1.args[0]"
    assert err.value.expected.startswith("0x600000200000 bfloat16[8, 4096]") and "0x600000280000" in err.value.found
    with pytest.raises(DriftError) as err:
        graphs.check_inputs("piecewise.t8.p1", recorded, graphs.graph_inputs((x, w, 16, None), {
            "positions": DeviceTensor(0x600000400000, (8,))}))  # fmt: skip
    assert err.value.field == "vllm.graphs.piecewise.t8.p1.args[2]"
    with pytest.raises(DriftError, match="other arguments"):
        graphs.check_inputs("piecewise.t8.p1", recorded, graphs.graph_inputs((x, w), {}))
    with pytest.raises(DriftError, match="records no inputs"):
        graphs.check_inputs("piecewise.t8.p1", None, recorded)


# -- the hooks, with vLLM's runtime stood in for ---------------------------------------------

Mode = enum.Enum("CUDAGraphMode", "NONE PIECEWISE FULL")
Descriptor = collections.namedtuple("BatchDescriptor", "num_tokens num_reqs uniform has_lora num_active_loras",
                                    defaults=(None, False, False, 0))  # fmt: skip
V2Descriptor = collections.namedtuple("BatchExecutionDescriptor", "cg_mode num_tokens num_reqs uniform_token_count "
                                      "num_active_loras", defaults=(None, None, 0))  # fmt: skip


@dataclasses.dataclass
class Entry:  # vLLM's CUDAGraphEntry
    batch_descriptor: object
    cudagraph: object = None
    output: object = None
    input_addresses: list | None = None


@dataclasses.dataclass(frozen=True)
class Weak:  # what vLLM's weak_ref_tensors returns: the same memory, not owned
    of: object


@pytest.fixture
def fake_vllm(monkeypatch):
    """vLLM's runtime names the hooks use (vLLM cannot be imported without the CUDA build
    of torch), with a forward context the test sets."""
    context = types.SimpleNamespace(cudagraph_runtime_mode=Mode.NONE, batch_descriptor=None)
    calls: list[str] = []
    offloader = types.SimpleNamespace(sync_prev_onload=lambda: calls.append("sync"),
                                      join_after_forward=lambda: calls.append("join"))  # fmt: skip
    names = types.SimpleNamespace(
        inference_mode=contextlib.nullcontext, is_breakable_cudagraph_enabled=lambda: False,
        compilation_counter=types.SimpleNamespace(num_cudagraph_captured=0, num_inductor_compiles=3),
        CUDAGraphEntry=Entry, validate_cudagraph_capturing_enabled=lambda: calls.append("validate"),
        CUDAGraphMode=Mode, graph_capture=lambda device: contextlib.nullcontext(),
        get_forward_context=lambda: context, is_forward_context_available=lambda: True,
        get_offloader=lambda: offloader, weak_ref_tensors=Weak,
        AttentionStatePair=collections.namedtuple("AttentionStatePair", "warmup captured"),
    )  # fmt: skip
    monkeypatch.setattr(plugin, "_vllm", lambda: names)
    names.context, names.calls = context, calls
    return names


class FakeSession:
    """The session's side of a worker (a stand-in: SAVE captures and LOAD restores on a
    GPU). SAVE runs the step as a capture would and keeps what it returned; LOAD hands
    back a restored graph with SAVE's outputs description rebuilt."""

    def __init__(self, mode: str, saved: dict | None = None) -> None:
        self.mode, self.saved, self.model = mode, saved or {}, {}
        self.asked: list[str] = []
        self.archive = types.SimpleNamespace(catalog=types.SimpleNamespace(model={}))
        self.record = types.SimpleNamespace(graphs=[types.SimpleNamespace(name=n) for n in self.saved])
        self.hook = types.SimpleNamespace(passthrough=self._passthrough)
        self.passthrough = 0

    @contextlib.contextmanager
    def _passthrough(self):
        self.passthrough += 1
        yield

    def graph(self, name, fn, *, shape_key=None, runner=None):
        from foundry.runtime.sessions.base import RestoredGraph

        self.asked.append(name)
        if self.mode == "save":
            self.saved[name] = fn()
            return types.SimpleNamespace(outputs=self.saved[name])
        outputs = {graphs.OUT: ("restored", name), graphs.INPUTS: self.saved[name][graphs.INPUTS]}
        return RestoredGraph(None, outputs)

    def finish(self):
        return {"mode": self.mode, "counters": {"stream_captures": 0}}


class Piece:
    """A compiled piece of the model (vLLM's PiecewiseBackend, as the wrapper's runnable)."""

    def __init__(self, index: int) -> None:
        self.piecewise_compile_index, self.runs = index, 0

    def __call__(self, x, *rest):
        self.runs += 1
        return DeviceTensor(x.address + 0x1000 * (self.piecewise_compile_index + 1))


def _wrapper(index: int, last: bool):
    return types.SimpleNamespace(runnable=Piece(index), runtime_mode=Mode.PIECEWISE, concrete_cudagraph_entries={},
                                 cudagraph_options=types.SimpleNamespace(weak_ref_output=last))  # fmt: skip


def _forward(wrappers, x, original):
    """The pieces of one forward, each output the next piece's input (eager attention between them elided)."""
    for wrapper in wrappers:
        x = plugin._wrapper_call(original, wrapper, x, 8)
    return x


def test_save_captures_each_piece_through_the_session_and_installs_it_where_vllm_keeps_graphs(fake_vllm, monkeypatch):
    session = FakeSession("save")
    state = plugin.WorkerState(PluginConfig("save", "/a"), session, 0, "v2", graph_phase=True)
    monkeypatch.setattr(plugin, "_state", state)
    replays = []
    original = lambda wrapper, *a, **k: replays.append(wrapper.runnable.piecewise_compile_index)  # noqa: E731
    wrappers = [_wrapper(i, last=i == 2) for i in range(3)]
    fake_vllm.context.cudagraph_runtime_mode, fake_vllm.context.batch_descriptor = Mode.PIECEWISE, Descriptor(8)
    out = _forward(wrappers, DeviceTensor(0x600000200000), original)
    assert session.asked == ["piecewise.t8.p0", "piecewise.t8.p1", "piecewise.t8.p2"] == state.graphs
    assert isinstance(out, Weak) and out.of.address == 0x600000200000 + 0x1000 + 0x2000 + 0x3000  # the last piece's
    entries = [w.concrete_cudagraph_entries[Descriptor(8)] for w in wrappers]
    assert all(e.cudagraph.outputs is None for e in entries)  # only weak references outlive the forward
    assert entries[0].output == Weak(DeviceTensor(0x600000201000)) and entries[0].input_addresses == [0x600000200000]
    assert session.saved["piecewise.t8.p1"][graphs.INPUTS]["args"] == [DeviceTensor(0x600000201000), 8]
    assert fake_vllm.compilation_counter.num_cudagraph_captured == 3 and replays == []
    assert fake_vllm.calls[:4] == ["validate", "sync", "join", "validate"]
    _forward(wrappers, DeviceTensor(0x600000200000), original)  # graphs in place: vLLM replays them
    assert replays == [0, 1, 2] and len(session.asked) == 3
    fake_vllm.context.cudagraph_runtime_mode = Mode.FULL  # another mode's forward: each piece is vLLM's to run
    _forward(wrappers, DeviceTensor(0x600000200000), original)
    assert replays == [0, 1, 2, 0, 1, 2]
    state.graph_phase = False
    fake_vllm.context.cudagraph_runtime_mode, fake_vllm.context.batch_descriptor = Mode.PIECEWISE, Descriptor(16)
    with pytest.raises(FoundryError, match="outside capture_model"):
        _forward(wrappers, DeviceTensor(0x600000200000), original)


def test_load_installs_restored_pieces_and_refuses_one_whose_inputs_moved(fake_vllm, monkeypatch, capsys):
    saving = FakeSession("save")
    monkeypatch.setattr(plugin, "_state", plugin.WorkerState(PluginConfig("save", "/a"), saving, 0, "v2",
                                                             graph_phase=True))  # fmt: skip
    fake_vllm.context.cudagraph_runtime_mode, fake_vllm.context.batch_descriptor = Mode.PIECEWISE, Descriptor(8)
    _forward([_wrapper(i, last=i == 1) for i in range(2)], DeviceTensor(0x600000200000), None)
    loading = FakeSession("load", saving.saved)
    monkeypatch.setattr(plugin, "_state", plugin.WorkerState(PluginConfig("load", "/a"), loading, 0, "v2",
                                                             graph_phase=True))  # fmt: skip
    wrappers = [_wrapper(i, last=i == 1) for i in range(2)]
    restored = plugin._wrapper_call(None, wrappers[0], DeviceTensor(0x600000200000), 8)
    assert restored == ("restored", "piecewise.t8.p0") and wrappers[0].runnable.runs == 0  # nothing ran
    assert wrappers[0].concrete_cudagraph_entries[Descriptor(8)].cudagraph.first_replay is not None
    # the next piece gets the restored output, not the address SAVE's second piece read: refused
    with pytest.raises(DriftError) as err:
        plugin._wrapper_call(None, wrappers[1], DeviceTensor(0x600000209000), 8)
    assert err.value.field == "vllm.graphs.piecewise.t8.p1.args[0]"
    assert capsys.readouterr().err.strip() == f"foundry: worker (rank 0) load refused: {err.value}"


def test_v2s_capture_loop_runs_piecewise_first_then_captures_full_graphs_through_the_session(fake_vllm, monkeypatch):
    # V2's CudaGraphManager and its forward factory stand in for vLLM's (no GPU here)
    session = FakeSession("save")
    monkeypatch.setattr(plugin, "_state", plugin.WorkerState(PluginConfig("save", "/a"), session, 0, "v2",
                                                             graph_phase=True))  # fmt: skip
    hidden = DeviceTensor(0x600001000000, (512, 4096))
    full = [V2Descriptor(Mode.FULL, n, n, 1) for n in (8, 4)]
    piecewise = [V2Descriptor(Mode.PIECEWISE, n) for n in (16, 8)]
    manager = types.SimpleNamespace(device="cuda:0", graphs={}, _graphs_captured=False, hidden_states=hidden,
                                    _capture_descs={Mode.FULL: full, Mode.PIECEWISE: piecewise})  # fmt: skip
    ran: list[tuple] = []

    def create_forward_fn(desc, warmup):
        return (lambda mode: ran.append((desc.num_tokens, desc.cg_mode.name, warmup, mode.name))), f"state {warmup}"

    states = plugin._manager_capture(None, manager, create_forward_fn)
    assert ran == [(16, "PIECEWISE", True, "NONE"), (16, "PIECEWISE", True, "PIECEWISE"),
                   (8, "PIECEWISE", True, "NONE"), (8, "PIECEWISE", True, "PIECEWISE"),
                   (8, "FULL", True, "NONE"), (8, "FULL", False, "NONE"),
                   (4, "FULL", True, "NONE"), (4, "FULL", False, "NONE")]  # fmt: skip
    assert session.asked == ["full.t8.r8.u1", "full.t4.r4.u1"] and list(manager.graphs) == full
    assert manager._graphs_captured and states[full[0]] == ("state True", "state False")
    assert states[piecewise[0]] == ("state True", "state True")
    assert session.saved["full.t8.r8.u1"][graphs.INPUTS]["kwargs"] == {"hidden_states": hidden}
    assert manager.graphs[full[0]].outputs is None
    monkeypatch.setattr(plugin, "_state", None)  # no session in this process: vLLM's own loop
    assert plugin._manager_capture(lambda *a: "vllm's", manager, create_forward_fn) == "vllm's"


def test_the_graph_phase_ends_in_the_archive_or_in_the_check_that_every_graph_was_restored(fake_vllm, monkeypatch,
                                                                                            tmp_path):  # fmt: skip
    # The runner, its configuration and the session stand in for vLLM's and the GPU's.
    compilation = types.SimpleNamespace(cudagraph_mode=Mode.FULL, cudagraph_capture_sizes=[1, 2], cache_dir=
                                        "/c/torch_compile_cache/0123456789", local_cache_dir="/c/x/rank_0_0/backbone",
                                        max_cudagraph_capture_size=2)  # fmt: skip
    runner = types.SimpleNamespace(vllm_config=types.SimpleNamespace(
        compilation_config=compilation, model_config=types.SimpleNamespace(hf_config={"layers": 2})))  # fmt: skip
    monkeypatch.setenv("FOUNDRY_VLLM_REPORT", str(tmp_path / "report.json"))
    session = FakeSession("save")
    state = plugin.WorkerState(PluginConfig("save", "/a"), session, 0, "v1")
    monkeypatch.setattr(plugin, "_state", state)

    def capture_model(runner):
        assert plugin._state.graph_phase
        fake_vllm.context.cudagraph_runtime_mode, fake_vllm.context.batch_descriptor = Mode.FULL, Descriptor(2, 2, True)
        model = types.SimpleNamespace(runnable=lambda x: DeviceTensor(0x600000500000), runtime_mode=Mode.FULL,
                                      concrete_cudagraph_entries={},
                                      cudagraph_options=types.SimpleNamespace(weak_ref_output=True))  # fmt: skip
        plugin._wrapper_call(None, model, DeviceTensor(0x600000200000))
        return 1 << 20

    assert plugin._capture_model(capture_model, runner) == 1 << 20
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["vllm_graphs"] == ["full.t2.r2.u"] and report["vllm_model_runner"] == "v1"
    assert report["vllm_compile"]["cache_dir"] == compilation.cache_dir and report["vllm_compile"][
        "num_inductor_compiles"] == 3  # fmt: skip
    assert session.model[plugin.COMPILE_CACHE_KEY] == "0123456789"
    assert session.model["vllm.resolved.cudagraph_capture_sizes"] == "[1, 2]"
    assert report["vllm_seconds"]["capture_model_s"] >= report["vllm_seconds"]["graphs_s"] > 0
    with pytest.raises(FoundryError, match="capture_model ran twice"):
        plugin._capture_model(capture_model, runner)
    # LOAD: the archive holds one more graph than the worker asked for
    loading = FakeSession("load", {**session.saved, "full.t1.r1.u": session.saved["full.t2.r2.u"]})
    loading.archive.catalog.model = dict(session.model)
    monkeypatch.setattr(plugin, "_state", plugin.WorkerState(PluginConfig("load", "/a"), loading, 0, "v1"))
    with pytest.raises(DriftError, match="did not ask for every archived graph") as err:
        plugin._capture_model(capture_model, runner)
    assert err.value.field == "vllm.graphs" and err.value.found == ["full.t1.r1.u"]
    # LOAD with another compile cache key (another configuration or vLLM build compiled the model)
    compilation.cache_dir = "/c/torch_compile_cache/fedcba9876"
    monkeypatch.setattr(plugin, "_state", plugin.WorkerState(PluginConfig("load", "/a"), loading, 0, "v1"))
    with pytest.raises(DriftError, match=r"in vllm\.compile_cache_key"):
        plugin._capture_model(capture_model, runner)


def test_the_kv_budget_is_recorded_at_save_and_pinned_at_load(monkeypatch, capsys):
    # the worker stands in for vLLM's (its profiling needs a GPU)
    save = FakeSession("save")
    worker = types.SimpleNamespace(available_kv_cache_memory_bytes=0)
    monkeypatch.setattr(plugin, "_state", plugin.WorkerState(PluginConfig("save", "/a"), save, 0, "v2"))
    assert plugin._kv_budget(lambda w: 30 << 30, worker) == 30 << 30 and save.model[plugin.KV_BUDGET] == str(30 << 30)
    load = FakeSession("load")
    load.archive.catalog.model = {plugin.KV_BUDGET: str(30 << 30)}
    monkeypatch.setattr(plugin, "_state", plugin.WorkerState(PluginConfig("load", "/a"), load, 0, "v2"))
    assert plugin._kv_budget(lambda w: 31 << 30, worker) == 30 << 30 == worker.available_kv_cache_memory_bytes
    with pytest.raises(DriftError, match="less GPU memory is free") as err:
        plugin._kv_budget(lambda w: 29 << 30, worker)
    assert err.value.field == plugin.KV_BUDGET
    assert capsys.readouterr().err.strip() == f"foundry: worker (rank 0) load refused: {err.value}"
    monkeypatch.setattr(plugin, "_state", None)
    assert plugin._kv_budget(lambda w: 29 << 30, worker) == 29 << 30  # no session: vLLM's own


def test_v1s_graph_memory_estimate_is_vllms_own_capture_passed_through(fake_vllm, monkeypatch):
    session = FakeSession("load")
    state = plugin.WorkerState(PluginConfig("load", "/a"), session, 0, "v1")
    monkeypatch.setattr(plugin, "_state", state)
    captured = []

    def profile(runner):  # vLLM's estimate captures through the wrapper itself
        wrapper = _wrapper(0, last=True)
        fake_vllm.context.cudagraph_runtime_mode, fake_vllm.context.batch_descriptor = Mode.PIECEWISE, Descriptor(8)
        plugin._wrapper_call(lambda w, *a: captured.append((session.passthrough, state.profiling)), wrapper,
                             DeviceTensor(1), 8)  # fmt: skip
        return 512 << 20

    assert plugin._profile_graph_memory(profile, object()) == 512 << 20
    assert captured == [(1, True)] and session.asked == [] and not state.profiling


def test_a_second_worker_in_one_process_is_refused(monkeypatch):
    monkeypatch.setenv("FOUNDRY_MODE", "load")
    monkeypatch.setenv("FOUNDRY_ARCHIVE", "/srv/a")
    monkeypatch.setattr(plugin, "_state", plugin.WorkerState(PluginConfig("load", "/a"), FakeSession("load"), 0, "v1"))
    with pytest.raises(FoundryError, match="a second worker in one process") as err:
        plugin._on_worker_start(types.SimpleNamespace())
    assert err.value.field == "vllm.workers"
    monkeypatch.delenv("FOUNDRY_MODE")
    monkeypatch.setattr(plugin, "_state", None)
    assert plugin._on_worker_start(types.SimpleNamespace()) is None  # off: vLLM's own start


def test_os_environ_is_left_alone_by_the_tests():
    assert "VLLM_WORKER_MULTIPROC_METHOD" not in os.environ  # the registration ran in child processes only


def test_a_worker_starts_its_session_with_the_configuration_it_compares(fake_vllm, monkeypatch, capsys):
    # vLLM's worker and modules stand in (vLLM is not installed), and so does the session
    # start (a GPU's): what the worker hands it is checked
    started = []
    monkeypatch.setattr(plugin.patching, "check_patched", lambda points, engine: None)
    monkeypatch.setattr(plugin, "installed_version", lambda: "0.25.1")
    monkeypatch.setattr(plugin.shared, "start_session", lambda config, **kw: started.append(kw) or FakeSession("save"))
    monkeypatch.setattr(plugin, "_state", None)
    monkeypatch.setenv("FOUNDRY_MODE", "save")
    monkeypatch.setenv("FOUNDRY_ARCHIVE", "/srv/a")
    config, _ = _configs()
    config.model_config.hf_config = {"num_hidden_layers": 2}
    tp2, _ = _configs(**{"parallel_config.tensor_parallel_size": 2})
    with pytest.raises(FoundryError) as err:
        plugin._on_worker_start(types.SimpleNamespace(vllm_config=tp2, use_v2_model_runner=True, rank=0, local_rank=0))
    assert err.value.field == "vllm.parallel_config.tensor_parallel_size" and started == []  # refused before it
    capsys.readouterr()
    plugin._on_worker_start(types.SimpleNamespace(vllm_config=config, use_v2_model_runner=False, rank=0, local_rank=0))
    live = started[0]["live"]
    assert live[plugin.RUNNER] == "v1" and live["vllm.cache_config.gpu_memory_utilization"] == "0.3"
    assert live[plugin.MODEL_CONFIG] == plugin.config_digest({"num_hidden_layers": 2})
    assert started[0]["device"] == 0 and started[0]["keep_warmup_bytes"] is False
    assert capsys.readouterr().err == "foundry: worker (rank 0) active: mode save, archive /srv/a, model runner v1\n"
    assert plugin._state.runner == "v1" and plugin._state.config.mode == "save"

"""Serve a Qwen3-shaped model (dummy weights) with real vLLM and record greedy outputs.

    python recipes/vllm/run.py --out base.json                                # plain vLLM
    foundry run --mode save --archive A -- python recipes/vllm/run.py --out save.json
    foundry run --mode load --archive A -- python recipes/vllm/run.py --out load.json
    python recipes/vllm/compare.py base.json save.json load.json

``--preset`` picks the model and the engine (dummy weights always; the model shapes
are recipes/sglang/run.py's):

- ``tiny`` (default): a 2-layer Qwen3, ``max_num_seqs`` 8: capture sizes 1, 2, 4, 8, 16;
- ``qwen3-8b``: Qwen3-8B's shape (36 layers, hidden 4096) on Model Runner V2,
  ``max_num_seqs`` 256: vLLM's default capture sizes, 51 of them from 1 to 512, each
  with a piecewise graph per piece of the model (one or more per layer), and full
  decode graphs for the 35 sizes up to 256;
- ``qwen3-30b-a3b``: Qwen3-30B-A3B's MoE shape (48 layers, 128 experts, top 8; about
  57 GiB in bf16) on the V1 runner, ``gpu_memory_utilization`` 0.7. Its region must
  hold the weights and the KV cache: ``foundry run --region-size 0x1a00000000`` (104 GiB).

vLLM's own defaults otherwise: ``cudagraph_mode`` ``FULL_AND_PIECEWISE``, torch.compile
on, the default attention backend. Prefix caching is off, so that a prompt's prefill
is scheduled as long as it is. 16 prompts given as token ids (lengths 1-64) in
batches of 1, 2, 4, 8 and 1, 32 greedy tokens each with their logprobs, through
``vllm.LLM`` (``--entry llm``) or vLLM's OpenAI-compatible server (``--entry http``,
``vllm serve``, its ``/v1/completions``). ``--wave`` then walks the batch through
every capture size: one prompt per size, alone, as long as the size and asking for
one token (its prefill runs that size's piecewise graphs), then ``max_num_seqs``
prompts of 16 tokens at once, prompt i asking for i + 1 tokens (the decode batch
shrinks by one every step and passes every full graph's size). The report keeps the
outputs, the Foundry plugin's report (``FOUNDRY_VLLM_REPORT``) when a session ran,
vLLM's own start-up lines (graph capture seconds and memory, torch.compile's
seconds, the engine's initialisation), the seconds until the engine took requests
and each batch's seconds.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, NamedTuple

HERE = Path(__file__).resolve().parent


def _sibling(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"recipe_{path.parent.name}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SGLANG_RUN = _sibling(HERE.parent / "sglang" / "run.py")  # the model shapes, prompts and KEY=VALUE reading

ENGINE = {"load_format": "dummy", "skip_tokenizer_init": True, "dtype": "bfloat16", "seed": 0, "max_num_seqs": 8,
          "max_model_len": 2048, "max_num_batched_tokens": 8192, "gpu_memory_utilization": 0.3,
          "enable_prefix_caching": False}  # fmt: skip
PRESETS = {
    "tiny": ({}, {}),
    "qwen3-8b": (SGLANG_RUN.QWEN3_8B, {"max_num_seqs": 256, "max_model_len": 4096, "gpu_memory_utilization": 0.35}),
    "qwen3-30b-a3b": (SGLANG_RUN.QWEN3_30B_A3B, {"max_num_seqs": 256, "max_model_len": 4096,
                                                 "gpu_memory_utilization": 0.7}),
}  # fmt: skip
BATCHES = SGLANG_RUN.BATCHES
NEW_TOKENS = SGLANG_RUN.NEW_TOKENS
# processes vLLM starts are spawned under the plugin; plain runs spawn too, so start-up compares fairly
ENVIRONMENT = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn", "HF_HUB_OFFLINE": "1", "VLLM_USE_FLASHINFER_SAMPLER": "0"}


def capture_sizes(max_num_seqs: int, max_num_batched_tokens: int) -> list[int]:
    """vLLM's default capture sizes (``VllmConfig._set_cudagraph_sizes``, no speculative
    decoding): 1, 2, 4, every 8 up to 248, every 16 from 256, up to min(2 x
    max_num_seqs, 512, max_num_batched_tokens), and that last bound itself."""
    largest = min(max_num_batched_tokens, min(max_num_seqs * 2, 512))
    sizes = [i for i in (1, 2, 4) if i <= largest]
    if largest >= 8:
        sizes += range(8, min(largest + 1, 256), 8)
    if largest >= 256:
        sizes += range(256, largest + 1, 16)
    if max_num_batched_tokens <= largest:
        sizes.append(max_num_batched_tokens)
    return sorted(set(sizes))


def walk_prompts(sizes: list[int]) -> list[list[int]]:
    """One prompt per capture size, as many distinct token ids long."""
    return [[3 + (17 * n + 3 * j) % 1000 for j in range(n)] for n in sizes]


def decode_wave(count: int) -> list[list[int]]:
    """``count`` prompts of 16 token ids each."""
    return [[3 + (11 * i + 5 * j) % 1000 for j in range(16)] for i in range(count)]


# vLLM's start-up lines (vllm/v1/worker/gpu*/model_runner.py, vllm/v1/engine/core.py,
# vllm/compilation/monitor.py), logged by the engine core's process
STARTUP_LINES = (
    re.compile(r"Graph capturing finished in (?P<graph_capture_s>[\d.]+) secs, took (?P<graph_memory_gib>[\d.]+) GiB"),
    re.compile(r"init engine \(profile, create kv cache, warmup model\) took (?P<init_engine_s>[\d.]+) s"
               r"(?: \(compilation: (?P<compilation_s>[\d.]+) s)?"),
    re.compile(r"torch\.compile took (?P<torch_compile_s>[\d.]+) s in total"),
)  # fmt: skip


def parse_startup(line: str) -> dict[str, float] | None:
    """The start-up figures one of vLLM's lines holds, or None for another line."""
    for pattern in STARTUP_LINES:
        found = pattern.search(line)
        if found is not None:
            return {k: float(v) for k, v in found.groupdict().items() if v is not None}
    return None


class Startup:
    """vLLM's start-up figures, gathered from its log lines as they pass."""

    def __init__(self) -> None:
        self.figures: dict[str, float] = {}

    def line(self, text: str) -> None:
        try:
            found = parse_startup(text)
        except ValueError:  # a line like vLLM's that is not: passed through, not parsed
            found = None
        self.figures.update(found or {})


class LogTee:
    """This process's and its children's stdout and stderr through one pipe: every line
    is echoed to the real stdout and handed to ``on_line`` (vLLM's engine core is a
    child process and logs there)."""

    def __init__(self, on_line: Any) -> None:
        self.on_line = on_line

    def __enter__(self) -> LogTee:
        sys.stdout.flush()
        sys.stderr.flush()
        self.saved = (os.dup(1), os.dup(2))
        read, write = os.pipe()
        os.dup2(write, 1)
        os.dup2(write, 2)
        os.close(write)
        self.pump = threading.Thread(target=self._pump, args=(read,), daemon=True)
        self.pump.start()
        return self

    def _pump(self, fd: int) -> None:
        with os.fdopen(fd, errors="replace") as stream:
            for text in stream:
                os.write(self.saved[0], text.encode())
                self.on_line(text)

    def __exit__(self, *exc: object) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self.saved[0], 1)
        os.dup2(self.saved[1], 2)
        self.pump.join(timeout=30)  # children still holding the pipe keep it open
        for fd in self.saved:
            os.close(fd)


class Served(NamedTuple):
    outputs: list[dict]
    wave: list[dict] | None  # --wave: the walk's and the decode wave's outputs, in that order
    ready_at: float  # time.time() when the engine took requests
    batch_s: list[float]  # each batch's seconds, from its request to its answer


def run_llm(model: Path, engine: dict, wave: bool, startup: Startup) -> Served:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    with LogTee(startup.line):
        llm = LLM(model=str(model), **engine)
        ready_at = time.time()
        resolved = list(llm.llm_engine.vllm_config.compilation_config.cudagraph_capture_sizes or [])
        expected = capture_sizes(engine["max_num_seqs"], engine["max_num_batched_tokens"])
        if "compilation_config" not in engine and resolved != expected:
            raise SystemExit(f"vLLM resolved the capture sizes {resolved}, not the default {expected}")

        def generate(ids: list[list[int]], new_tokens: list[int] | int = NEW_TOKENS) -> list[dict]:
            counts = new_tokens if isinstance(new_tokens, list) else [new_tokens] * len(ids)
            params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=0, detokenize=False)
                      for n in counts]  # fmt: skip
            answers = llm.generate([TokensPrompt(prompt_token_ids=p) for p in ids], params, use_tqdm=False)
            return [_llm_output(answer.outputs[0]) for answer in answers]

        try:
            outputs, batch_s = _batches(generate)
            walked = _wave(generate, engine) if wave else None
        finally:
            llm.llm_engine.engine_core.shutdown()
    return Served(outputs, walked, ready_at, batch_s)


def _llm_output(completion: Any) -> dict:
    ids = list(completion.token_ids)
    return {"output_ids": ids, "logprobs": [step[token].logprob for step, token in zip(completion.logprobs, ids,
                                                                                        strict=True)]}  # fmt: skip


def server_args(engine: dict) -> list[str]:
    """``vllm serve``'s flags for ``engine``'s settings: ``True`` as ``--flag``, ``False`` as
    ``--no-flag`` (vLLM's boolean options take both), dicts and lists as JSON."""
    args = []
    for key, value in engine.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is False:
            args.append("--no-" + key.replace("_", "-"))
        elif isinstance(value, dict | list):
            args += [flag, json.dumps(value)]
        elif value is not None:
            args += [flag, str(value)]
    return args


def run_http(model: Path, port: int, engine: dict, wave: bool, startup: Startup) -> Served:
    args = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model), "--port", str(port),
            "--return-tokens-as-token-ids", *server_args(engine)]  # fmt: skip
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    echo = threading.Thread(target=_echo, args=(process.stdout, startup), daemon=True)
    echo.start()
    try:
        SGLANG_RUN._wait(port, process)
        ready_at = time.time()

        def complete(ids: list[int], new_tokens: int) -> dict:
            body = json.dumps({"model": str(model), "prompt": ids, "max_tokens": new_tokens, "temperature": 0,
                               "ignore_eos": True, "logprobs": 0, "return_token_ids": True}).encode()  # fmt: skip
            request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                             {"Content-Type": "application/json"})  # fmt: skip
            with urllib.request.urlopen(request, timeout=600) as response:
                choice = json.loads(response.read())["choices"][0]
            return {"output_ids": choice["token_ids"], "logprobs": choice["logprobs"]["token_logprobs"]}

        def generate(ids: list[list[int]], new_tokens: list[int] | int = NEW_TOKENS) -> list[dict]:
            counts = new_tokens if isinstance(new_tokens, list) else [new_tokens] * len(ids)
            with concurrent.futures.ThreadPoolExecutor(max_workers=len(ids)) as pool:  # one batch on the server
                return list(pool.map(complete, ids, counts))

        outputs, batch_s = _batches(generate)
        return Served(outputs, _wave(generate, engine) if wave else None, ready_at, batch_s)
    finally:
        process.terminate()
        process.wait(timeout=60)
        echo.join(timeout=10)


def _echo(stream: Any, startup: Startup) -> None:
    """Pass the server's output through, keeping its start-up figures; it keeps draining
    whatever a line holds (a server whose pipe fills up stops)."""
    for text in stream:
        sys.stdout.write(text)
        startup.line(text)


def _batches(generate: Any) -> tuple[list[dict], list[float]]:
    """Every prompt's output ids and logprobs, and each batch's seconds."""
    outputs, batch_s, todo = [], [], SGLANG_RUN.prompts()
    for size in BATCHES:
        batch, todo = todo[:size], todo[size:]
        begun = time.perf_counter()
        outputs.extend(generate(batch))
        batch_s.append(time.perf_counter() - begun)
    return outputs, batch_s


def _wave(generate: Any, engine: dict) -> list[dict]:
    """Every capture size's prefill alone, then the decode wave (see the module docstring)."""
    walked = []
    for prompt in walk_prompts(capture_sizes(engine["max_num_seqs"], engine["max_num_batched_tokens"])):
        walked.extend(generate([prompt], 1))
    count = engine["max_num_seqs"]
    return walked + generate(decode_wave(count), [i + 1 for i in range(count)])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (exit 2 naming what is wrong): nothing runs yet."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny", help="model shape and engine (see above)")
    parser.add_argument("--wave", action="store_true", help="also walk the batch through every capture size")
    parser.add_argument("--entry", choices=["llm", "http"], default="llm")
    parser.add_argument("--port", type=int, default=30918)
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="where the model's config.json is written (the same path in SAVE and LOAD: the model "
                        "is a setting LOAD compares; default: one per preset in the temporary directory)")  # fmt: skip
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override an engine argument (drift tests: LOAD with another one)")  # fmt: skip
    parser.add_argument("--model-set", action="append", default=[], metavar="KEY=VALUE",
                        help="override an entry of the model's config.json")  # fmt: skip
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for key, value in ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    model_preset, engine_preset = PRESETS[args.preset]
    engine = {**ENGINE, **engine_preset, **SGLANG_RUN.overrides(args.set, "--set")}
    name = "tiny-qwen3" if args.preset == "tiny" else args.preset
    model = args.model_dir or Path(tempfile.gettempdir()) / f"foundry-vllm-{name}"
    model.mkdir(parents=True, exist_ok=True)
    config = {**SGLANG_RUN.CONFIG, **model_preset, **SGLANG_RUN.overrides(args.model_set, "--model-set")}
    (model / "config.json").write_text(json.dumps(config))
    work = Path(tempfile.mkdtemp(prefix="foundry-vllm-"))
    os.environ.setdefault("FOUNDRY_VLLM_REPORT", str(work / "foundry-report.json"))
    report_path = Path(os.environ["FOUNDRY_VLLM_REPORT"])
    Path(f"{report_path}.replays").unlink(missing_ok=True)  # this run's alone
    startup = Startup()
    started = time.time()
    served = (run_llm(model, engine, args.wave, startup) if args.entry == "llm"
              else run_http(model, args.port, engine, args.wave, startup))  # fmt: skip
    record = {"entry": args.entry, "preset": args.preset, "engine": engine, "outputs": served.outputs,
              "wave": served.wave, "wall_s": time.time() - started, "ready_s": served.ready_at - started,
              "batch_s": served.batch_s, "startup": startup.figures or None,
              "capture_sizes": capture_sizes(engine["max_num_seqs"], engine["max_num_batched_tokens"]),
              "foundry": json.loads(report_path.read_text()) if report_path.is_file() else None}  # fmt: skip
    replays = Path(f"{report_path}.replays")
    if record["foundry"] is not None and replays.is_file():  # LOAD: the restored graphs vLLM replayed
        record["foundry"]["replayed"] = sorted(set(replays.read_text().split()))
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":  # vLLM spawns processes: the guard is required
    sys.exit(main())

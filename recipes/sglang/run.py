"""Serve a Qwen3-shaped model (dummy weights) with real SGLang and record greedy outputs.

    python recipes/sglang/run.py --out base.json                                # baseline
    foundry run --mode save --archive A -- python recipes/sglang/run.py --out save.json
    foundry run --mode load --archive A -- python recipes/sglang/run.py --out load.json
    python recipes/sglang/compare.py base.json save.json load.json

``--preset`` picks the model and the server (dummy weights always):

- ``tiny`` (default): a 2-layer Qwen3, decode graphs ``full`` for batch sizes 1, 2, 4, 8;
- ``qwen3-8b``: Qwen3-8B's shape (36 layers, hidden 4096), ``max_running_requests``
  256 and SGLang's default decode graph set (36 batch sizes, 1-256);
- ``qwen3-30b-a3b``: Qwen3-30B-A3B's MoE shape (48 layers, 128 experts, top 8; about
  57 GiB in bf16), ``mem_fraction_static`` 0.6 and the default decode graph set, so
  SGLang's fused-MoE Triton kernels are inside the graphs. Its region must hold the
  weights and the KV pool: ``foundry run --region-size 0x1a00000000`` (104 GiB).
- ``standalone``: the tiny Qwen3 with a standalone draft model (``STANDALONE``, 3
  steps, top-1, 4 draft tokens): the draft is the target's own config in a directory
  of its own (``<model-dir>-draft``), so SGLang's seeded dummy weights make it the
  same model and greedy drafts are accepted. SGLang's default graph sets for its
  three runners (``target_verify``, ``draft_decode``, ``draft_extend``: batch sizes
  up to the 48 requests SGLang runs with speculative decoding by default).
  ``--draft-model-set KEY=VALUE`` changes the draft's config.json (drift: another
  draft model).
- ``ngram``: the tiny Qwen3 with n-gram drafts (``NGRAM``: no draft model, only the
  target's ``target_verify`` graphs), SGLang's default graph set.
- ``qwen3-next``: a hybrid Qwen3-Next (4 layers: three gated delta-net layers, then
  full attention; 8 experts, top 2; hidden 256): decode graphs for batch sizes 1, 2,
  4, 8 read the linear-attention state pool.
- ``qwen3-next-mtp``: the same model drafting with its own MTP head (``NEXTN``, 3
  steps, top-1; the draft model path is the target's), SGLang's default graph sets.
  With dummy weights the MTP head's drafts are rarely accepted.

Prefill graphs are off in every preset (``--set cuda_graph_backend_prefill=full`` asks for
full ones). 16 prompts given as input ids (lengths 1-64) in batches of 1, 2, 4, 8 and 1,
32 greedy tokens each with their logprobs, through ``sglang.Engine`` (``--entry
engine``) or an HTTP server (``--entry http``, ``python -m sglang.launch_server``).
``--wave`` then sends 256 prompts of 16 tokens at once (``--wave-size N``: N of them, for
decode sets above bs 256), prompt i asking for i + 1 new tokens, so that the running batch
walks down through every decode graph's size.
``--prefill-walk`` then sends, one request at a time, a prompt as long as each prefill
graph SGLang resolved (``server_args.cuda_graph_config.prefill.bs``; each prompt begins
with an id no other prompt of the run begins with, so the radix cache shares no
prefix), each asking for 2 new tokens, so that every prefill graph's size runs once
(``--entry engine`` only; the server's ``context_length`` must exceed the largest size
by 2: the presets' 2048 does not for SGLang's default sizes up to 8192, so pass
``--set context_length=8208``, in every run of a comparison).
``--tpot 1,8,64,256`` then decodes, for each size, that many prompts of 16 tokens for
128 new tokens at once, each size announced on stderr (``tpot batch N``) so that
``recipes/sglang/tpot.py`` can read SGLang's decode log lines of that batch (run it
with ``--set decode_log_interval=1 --set log_level=info``). The
Foundry plugin's report (``FOUNDRY_SGLANG_REPORT``) is included when a session ran,
and SGLang's own start-up timings (``Engine``'s, or parsed from the HTTP server's
"Engine startup timings" line), the seconds until the server took requests and each
batch's seconds. Under speculative decoding each output also keeps the counts
SGLang reports in its ``meta_info`` (verify steps, drafts proposed and accepted),
which ``recipes/sglang/compare.py`` compares and sums into an accept rate.
"""

from __future__ import annotations

import argparse
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
from typing import NamedTuple, NoReturn

CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 256, "intermediate_size": 512,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 1024,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "torch_dtype": "bfloat16",
    "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False, "bos_token_id": 1, "eos_token_id": 2,
}  # fmt: skip
SERVER = {"load_format": "dummy", "skip_tokenizer_init": True, "attention_backend": "triton",
          "sampling_backend": "pytorch", "cuda_graph_bs_decode": [1, 2, 4, 8], "cuda_graph_backend_decode": "full",
          "cuda_graph_backend_prefill": "disabled", "mem_fraction_static": 0.2, "max_total_tokens": 16384,
          "max_running_requests": 8, "context_length": 2048, "disable_radix_cache": True, "random_seed": 0}  # fmt: skip
QWEN3_8B = {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
            "max_position_embeddings": 40960}  # fmt: skip
QWEN3_30B_A3B = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
                 "intermediate_size": 6144, "num_hidden_layers": 48, "num_attention_heads": 32,
                 "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
                 "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "decoder_sparse_step": 1,
                 "norm_topk_prob": True, "mlp_only_layers": []}  # fmt: skip
# a small Qwen3-Next: layers 0-2 gated delta-net (linear attention), layer 3 full attention, MoE everywhere
QWEN3_NEXT = {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": 256,
              "intermediate_size": 512, "num_hidden_layers": 4, "full_attention_interval": 4,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "partial_rotary_factor": 0.25,
              "rope_theta": 10000000.0, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 64,
              "linear_value_head_dim": 64, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
              "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
              "shared_expert_intermediate_size": 128, "decoder_sparse_step": 1, "norm_topk_prob": True,
              "mlp_only_layers": []}  # fmt: skip
# the default decode graph set: no cuda_graph_bs_decode, so SGLang resolves it from max_running_requests
DEFAULT_GRAPHS = {"cuda_graph_bs_decode": None, "max_running_requests": 256}
# speculative decoding at SGLang's default graph sets: its default of 48 running requests sizes them
SPEC_GRAPHS = {"cuda_graph_bs_decode": None, "max_running_requests": None}
DRAFT_STEPS = {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}
PRESETS = {
    "tiny": ({}, {}),
    "qwen3-8b": (QWEN3_8B, {**DEFAULT_GRAPHS, "mem_fraction_static": 0.3, "max_total_tokens": 65536}),
    "qwen3-30b-a3b": (QWEN3_30B_A3B, {**DEFAULT_GRAPHS, "mem_fraction_static": 0.6, "max_total_tokens": 65536}),
    "standalone": ({}, {**SPEC_GRAPHS, **DRAFT_STEPS, "speculative_algorithm": "STANDALONE"}),
    "ngram": ({}, {**SPEC_GRAPHS, "speculative_algorithm": "NGRAM"}),
    "qwen3-next": (QWEN3_NEXT, {}),
    "qwen3-next-mtp": (QWEN3_NEXT, {**SPEC_GRAPHS, **DRAFT_STEPS, "speculative_algorithm": "NEXTN"}),
}
# where a preset's draft model lives: a directory of its own with the target's config ("copy": a standalone
# draft, the same seeded dummy weights), or the target's own directory ("target": its MTP head)
DRAFTS = {"standalone": "copy", "qwen3-next-mtp": "target"}
# what SGLang's meta_info reports of speculative decoding, per request (TokenizerManager)
SPEC_FIELDS = ("spec_verify_ct", "spec_num_correct_drafts", "spec_num_proposed_drafts")
BATCHES = (1, 2, 4, 8, 1)
NEW_TOKENS = 32


def prompts() -> list[list[int]]:
    """16 prompts of lengths 1-64, distinct token ids (no EOS, id 2)."""
    lengths = [1, 64, 3, 17, 5, 33, 8, 2, 40, 12, 64, 7, 25, 4, 50, 9]
    return [[3 + (7 * i + 13 * j) % 1000 for j in range(n)] for i, n in enumerate(lengths)]


def sampling(new_tokens: int = NEW_TOKENS) -> dict:
    return {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}


WAVE = 256  # prompts of the wave by default, prompt i asking for i + 1 tokens
WAVE_MAX = 1000  # each wave prompt's first id is its own (11 * i % 1000 repeats from i = 1000)


def wave_prompts(size: int = WAVE) -> list[list[int]]:
    """``size`` prompts of 16 token ids each, no two beginning with the same id."""
    return [[3 + (11 * i + 5 * j) % 1000 for j in range(16)] for i in range(size)]


WALK_FIRST = 1003  # the other prompts use ids 3-1002: each walk prompt begins with an id none of them has
WALK_NEW_TOKENS = 2


def refuse(message: str) -> NoReturn:
    """One line on stderr and exit 2: what the recipe was asked cannot run."""
    print(f"run.py: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def walk_prompts(lengths: list[int], vocab: int) -> list[list[int]]:
    """One prompt per length, each beginning with an id no other prompt of the run begins
    with (the radix cache finds no prefix to share)."""
    if WALK_FIRST + len(lengths) > vocab:
        refuse(f"--prefill-walk: {len(lengths)} prompts need a vocabulary of at least {WALK_FIRST + len(lengths)} "
               f"ids, not {vocab}")  # fmt: skip
    return [[WALK_FIRST + i] + [3 + (i + 7 * j) % 1000 for j in range(1, n)] for i, n in enumerate(sorted(lengths))]


# SGLang's own start-up line (sglang/srt/entrypoints/engine.py), logged by an HTTP server
STARTUP_LINE = re.compile(
    r"Engine startup timings \(s\): load_weight=(?P<load_weight>[\d.]+), "
    r"kv_cache_allocation=(?P<kv_cache_allocation>[\d.]+), scheduler_e2e=(?P<scheduler_e2e>[\d.]+), "
    r"cuda_graph=\{(?P<cuda_graph>[^}]*)\}, tokenizer_e2e=(?P<tokenizer_e2e>[\d.]+)"
)


def parse_startup(line: str) -> dict | None:
    """SGLang's start-up timings from its log line, as ``Engine`` keeps them
    (``cuda_graph`` maps each graph phase to seconds); None for another line."""
    found = STARTUP_LINE.search(line)
    if found is None:
        return None
    timings: dict = {k: float(v) for k, v in found.groupdict().items() if k != "cuda_graph"}
    phases = [item.split("=") for item in found["cuda_graph"].split(", ") if item]
    timings["cuda_graph"] = {phase: float(seconds) for phase, seconds in phases}
    return timings


def sizes(text: str) -> list[int]:
    """``1,8,64,256``: positive batch sizes."""
    try:
        found = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of batch sizes: {text!r}") from None
    if not found or min(found) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be positive: {text!r}")
    return found


def wave_size(text: str) -> int:
    """The wave's prompt count: 1 to WAVE_MAX."""
    try:
        size = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a prompt count: {text!r}") from None
    if not 1 <= size <= WAVE_MAX:
        raise argparse.ArgumentTypeError(f"the wave holds 1 to {WAVE_MAX} prompts, not {size}")
    return size


def overrides(pairs: list[str], option: str) -> dict:
    """``KEY=VALUE`` pairs, each value read as JSON where it parses (``0.3``, ``[1, 2]``) and as text otherwise."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            refuse(f"{option} takes KEY=VALUE, not {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


class Served(NamedTuple):
    outputs: list[dict]
    wave: list[dict] | None  # --wave: its prompts' outputs
    startup: dict | None  # SGLang's own start-up timings
    ready_at: float  # time.time() when the server took requests
    batch_s: list[float]  # each batch's seconds, from its request to its answer
    prefill_walk: list[dict] | None = None  # --prefill-walk: one output per prefill graph's size


def run_engine(model: Path, server: dict, wave: int, tpot: list[int], walk_vocab: int | None = None) -> Served:
    import sglang as sgl

    engine = sgl.Engine(model_path=str(model), **server)
    ready_at = time.time()
    try:
        startup = getattr(engine.tokenizer_manager, "startup_time", None)

        def generate(ids: list[list[int]], params: list[dict] | dict | None = None) -> list[dict]:
            return engine.generate(input_ids=ids, sampling_params=params or sampling(), return_logprob=True)

        walk = walk_prompts(prefill_sizes(engine), walk_vocab) if walk_vocab is not None else None  # before any
        outputs, batch_s = _batches(generate)
        served = Served(outputs, _wave(generate, wave) if wave else None, startup, ready_at, batch_s)
        if walk is not None:  # --prefill-walk
            served = served._replace(prefill_walk=[_output(generate([ids], sampling(WALK_NEW_TOKENS))[0])
                                                   for ids in walk])  # fmt: skip
        if tpot:
            _tpot(generate, tpot)
        return served
    finally:
        engine.shutdown()


def run_http(model: Path, port: int, server: dict, wave: int, tpot: list[int]) -> Served:
    args = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), "--port", str(port)]
    for key, value in server.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is False or value is None:  # a switch left off
            continue
        elif isinstance(value, list):
            args += [flag, *map(str, value)]
        else:
            args += [flag, str(value)]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    startup: list[dict] = []
    echo = threading.Thread(target=_echo, args=(process.stdout, startup), daemon=True)
    echo.start()
    try:
        _wait(port, process)
        ready_at = time.time()

        def post(ids: list[list[int]], params: list[dict] | dict | None = None) -> list[dict]:
            body = json.dumps({"input_ids": ids, "sampling_params": params or sampling(),
                               "return_logprob": True}).encode()  # fmt: skip
            request = urllib.request.Request(f"http://127.0.0.1:{port}/generate", body,
                                             {"Content-Type": "application/json"})  # fmt: skip
            with urllib.request.urlopen(request, timeout=300) as response:
                return json.loads(response.read())

        outputs, batch_s = _batches(post)
        served = Served(
            outputs, _wave(post, wave) if wave else None, startup[0] if startup else None, ready_at, batch_s
        )
        if tpot:
            _tpot(post, tpot)
        return served
    finally:
        process.terminate()
        process.wait(timeout=60)
        echo.join(timeout=10)


def _echo(stream, startup: list[dict]) -> None:
    """Pass the server's output through, keeping its start-up timings; it keeps draining
    whatever a line holds (a server whose pipe fills up stops)."""
    for line in stream:
        sys.stdout.write(line)
        try:
            timings = parse_startup(line)
        except ValueError:  # a line like SGLang's that is not: passed through, not parsed
            timings = None
        if timings is not None:
            startup.append(timings)


def _wait(port: int, server: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with {server.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                return
        except OSError:
            time.sleep(2)
    raise SystemExit("the server did not become ready")


def _batches(generate) -> tuple[list[dict], list[float]]:
    """Every prompt's output ids and logprobs, and each batch's seconds (the first
    batch's include whatever SGLang compiles at its first eager prefill)."""
    outputs, batch_s, todo = [], [], prompts()
    for size in BATCHES:
        batch, todo = todo[:size], todo[size:]
        begun = time.perf_counter()
        answers = generate(batch)
        batch_s.append(time.perf_counter() - begun)
        outputs.extend(_output(out) for out in answers)
    return outputs, batch_s


TPOT_PROMPT, TPOT_TOKENS = 16, 128
TPOT_MARK = "tpot batch"  # announces each TPOT batch on stderr, for recipes/sglang/tpot.py


def _tpot(generate, sizes: list[int]) -> None:
    """Each size's batch decoded alone, so SGLang's decode log lines of that batch show
    the step time at that running batch size."""
    for size in sizes:
        print(f"{TPOT_MARK} {size}", file=sys.stderr, flush=True)
        prompts = [[3 + (13 * i + 7 * j) % 1000 for j in range(TPOT_PROMPT)] for i in range(size)]
        generate(prompts, sampling(TPOT_TOKENS))
    print(f"{TPOT_MARK} end", file=sys.stderr, flush=True)


def _wave(generate, size: int) -> list[dict]:
    """The wave's prompts in one request: prompt i stops after i + 1 tokens, so the running
    batch shrinks by one every step and passes every decode graph's size."""
    answers = generate(wave_prompts(size), [sampling(i + 1) for i in range(size)])
    return [_output(out) for out in answers]


def prefill_sizes(engine) -> list[int]:
    """The prefill graphs' token counts SGLang resolved for this server, each short enough
    to be sent as one prompt with its 2 new tokens (SGLang refuses a request as long as
    its context)."""
    args = getattr(engine, "server_args", None)
    sizes = getattr(getattr(getattr(args, "cuda_graph_config", None), "prefill", None), "bs", None)
    if not sizes:
        refuse("--prefill-walk: this server resolved no prefill graph sizes "
               "(ask for them with --set cuda_graph_backend_prefill=full)")  # fmt: skip
    sizes = sorted(int(n) for n in sizes)
    context = getattr(args, "context_length", None)
    if context is not None and sizes[-1] + WALK_NEW_TOKENS >= context:
        refuse(f"--prefill-walk: a prompt of {sizes[-1]} tokens needs --set "
               f"context_length={sizes[-1] + WALK_NEW_TOKENS + 1} or more, not {context}")  # fmt: skip
    return sizes


def _output(out: dict) -> dict:
    meta = out["meta_info"]
    output = {"output_ids": out["output_ids"], "logprobs": [lp[0] for lp in meta.get("output_token_logprobs", [])]}
    spec = {key: meta[key] for key in SPEC_FIELDS if key in meta}
    if spec:  # speculative decoding: this request's verify steps and drafts
        output["spec"] = spec
    return output


def draft_model(preset: str, model: Path, config: dict, changes: dict) -> Path | None:
    """The draft model's directory for ``preset``, its config.json written (see DRAFTS), or None."""
    kind = DRAFTS.get(preset)
    if changes and kind != "copy":
        raise SystemExit(f"--draft-model-set needs a preset with a standalone draft, not {preset!r}")
    if kind != "copy":
        return model if kind == "target" else None
    draft = model.with_name(model.name + "-draft")
    draft.mkdir(parents=True, exist_ok=True)
    (draft / "config.json").write_text(json.dumps({**config, **changes}))
    return draft


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (exit 2 naming what is wrong): nothing runs yet."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny", help="model shape and server (see above)")
    parser.add_argument(
        "--wave", action="store_true", help="also send the wave, 256 prompts unless --wave-size (see above)"
    )
    parser.add_argument("--wave-size", type=wave_size, default=None, metavar="N",
                        help=f"the wave's prompts (default {WAVE}; at most {WAVE_MAX})")  # fmt: skip
    parser.add_argument("--prefill-walk", action="store_true",
                        help="also send one prompt per prefill graph's size, one at a time (see above)")  # fmt: skip
    parser.add_argument("--tpot", type=sizes, default=[], metavar="SIZES",
                        help="comma-separated batch sizes to decode alone, for recipes/sglang/tpot.py")  # fmt: skip
    parser.add_argument("--entry", choices=["engine", "http"], default="engine")
    parser.add_argument("--port", type=int, default=30917)
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="where the model's config.json is written (the same path in SAVE and LOAD: "
                        "model_path is a server argument LOAD compares; default: one per preset in the temporary "
                        "directory)")  # fmt: skip
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a server argument (drift tests: LOAD with another one)")  # fmt: skip
    parser.add_argument("--model-set", action="append", default=[], metavar="KEY=VALUE",
                        help="override an entry of the model's config.json")  # fmt: skip
    parser.add_argument("--draft-model-set", action="append", default=[], metavar="KEY=VALUE",
                        help="override an entry of a standalone draft's config.json (drift: another draft "
                        "model)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.prefill_walk and args.entry != "engine":
        parser.error("--prefill-walk needs --entry engine")
    if args.wave_size is not None and not args.wave:
        parser.error("--wave-size needs --wave")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model_preset, server_preset = PRESETS[args.preset]
    server = {**SERVER, **server_preset, **overrides(args.set, "--set")}
    server = {key: value for key, value in server.items() if value is not None}  # None: SGLang's default
    name = "tiny-qwen3" if args.preset == "tiny" else args.preset
    model = args.model_dir or Path(tempfile.gettempdir()) / f"foundry-sglang-{name}"
    model.mkdir(parents=True, exist_ok=True)
    config = {**CONFIG, **model_preset, **overrides(args.model_set, "--model-set")}
    (model / "config.json").write_text(json.dumps(config))
    draft = draft_model(args.preset, model, config, overrides(args.draft_model_set, "--draft-model-set"))
    if draft is not None:
        server.setdefault("speculative_draft_model_path", str(draft))
    work = Path(tempfile.mkdtemp(prefix="foundry-sglang-"))
    os.environ.setdefault("FOUNDRY_SGLANG_REPORT", str(work / "foundry-report.json"))
    Path(os.environ["FOUNDRY_SGLANG_REPORT"] + ".replays").unlink(missing_ok=True)  # this run's alone
    started = time.time()
    walk_vocab = config["vocab_size"] if args.prefill_walk else None
    wave = (args.wave_size or WAVE) if args.wave else 0
    served = (run_engine(model, server, wave, args.tpot, walk_vocab) if args.entry == "engine"
              else run_http(model, args.port, server, wave, args.tpot))  # fmt: skip
    report_path = Path(os.environ["FOUNDRY_SGLANG_REPORT"])
    record = {"entry": args.entry, "preset": args.preset, "server": server, "outputs": served.outputs,
              "wave": served.wave, "prefill_walk": served.prefill_walk, "wall_s": time.time() - started,
              "ready_s": served.ready_at - started, "batch_s": served.batch_s, "startup": served.startup,
              "foundry": json.loads(report_path.read_text()) if report_path.is_file() else None}  # fmt: skip
    replays = Path(f"{report_path}.replays")
    if record["foundry"] is not None and replays.is_file():  # LOAD: the restored graphs SGLang replayed
        record["foundry"]["replayed"] = sorted(set(replays.read_text().split()))
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":  # SGLang spawns processes: the guard is required
    sys.exit(main())

"""Decode with graphs captured (baseline, SAVE) or restored (LOAD) and report what came out.

    python recipes/torch/run.py --out REPORT.json                       # baseline: plain capture
    foundry run --mode save --archive A -- python recipes/torch/run.py --out save.json
    foundry run --mode load --archive A -- python recipes/torch/run.py --out load.json
    python recipes/torch/compare.py baseline.json save.json save2.json load.json

Every mode runs the same program: allocate, warm up every shape, get the graphs
(captured or restored), then for each batch size decode 32 greedy steps from two
prompt sets, keep the token ids and the final logits' sha256, and finish with
three seeded sampling replays and one eager ``torch.rand``. ``--bench`` instead
times warm-up + capture (or LOAD) and replays, for bench/cold_start.py.

``--world-size N --rank R`` (one process per GPU; ``foundry run --rank R
--world-size N`` with a shared ``FOUNDRY_SAVE_ID`` for a SAVE) splits the decoder
over N ranks, the partial sums added through torch symmetric memory
(``one_shot_all_reduce``); ``--symm`` does the same at world size 1.
``--all-reduce nccl`` sums through NCCL's all-reduce instead, with the settings
the ``nccl-ipc`` backend pins (NCCL's buffers in the region, peers in the import zone).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decoder import CONFIGS, Decoder, TensorParallel, sample
from process_group import start_group
from timing import median_ms

from foundry.runtime.sessions.open import open_session

TINY_BATCHES = (1, 2, 4, 8, 16, 32)
# SGLang's default decode batch sizes up to 256: 36 graphs
BENCH_BATCHES = (1, 2, 4, 8, 12, 16, 24, *range(32, 257, 8))
STEPS = 32
PROMPT_SEEDS = (11, 12)
SAMPLE_REPLAYS = 3
CUDA_SEED = 1234


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()).hexdigest()


def symmetric_tp(session, rank: int, world_size: int, max_batch: int, hidden: int) -> TensorParallel:
    """The tensor-parallel group: NCCL to set it up, a symmetric buffer for the sums,
    attached to the session so SAVE records it and LOAD validates and relocates it."""
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    start_group(rank, world_size, "29541")
    group = dist.group.WORLD.group_name
    buf = symm_mem.empty(max_batch * hidden, dtype=torch.bfloat16, device="cuda")
    handle = symm_mem.rendezvous(buf, group)
    session.attach("torch-symm-mem", handle=handle, group=group, dtype="bfloat16")

    def all_reduce(partial: torch.Tensor) -> torch.Tensor:
        n = partial.numel()
        buf[:n].copy_(partial.reshape(-1))
        return torch.ops.symm_mem.one_shot_all_reduce(buf[:n], "sum", group).view_as(partial)

    return TensorParallel(rank, world_size, all_reduce)


def nccl_tp(session, rank: int, world_size: int) -> TensorParallel:
    """The tensor-parallel group summing through NCCL's all-reduce, with the settings
    that keep NCCL's buffers in the deterministic region and its peer memory in the
    hook's import zone; attached to the session as ``nccl-ipc``."""
    import torch.distributed as dist

    from foundry.backends.nccl_ipc import PINNED_ENV

    os.environ.update(PINNED_ENV)  # read by NCCL when the communicator is made, just below
    start_group(rank, world_size, "29551")
    if session.mode != "off":
        from foundry.runtime.native.hook import Hook

        hook = Hook.attach()
        session.attach("nccl-ipc", world_size=world_size, rank=rank,
                       nccl_version=".".join(map(str, torch.cuda.nccl.version())), region_base=hook.region().base,
                       import_zone=hook.import_zone(), peers=[r for r in range(world_size) if r != rank])  # fmt: skip

    def all_reduce(partial: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(partial)
        return partial

    return TensorParallel(rank, world_size, all_reduce)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON report")
    parser.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    parser.add_argument("--batches", default=None, help="comma-separated batch sizes")
    parser.add_argument("--bench", action="store_true", help="time graph set-up and replay instead of decoding")
    parser.add_argument("--rank", type=int, default=0, help="this process's rank and GPU")
    parser.add_argument("--world-size", type=int, default=1, help="tensor-parallel ranks, one process each")
    parser.add_argument("--symm", action="store_true", help="sum partials through symmetric memory at world size 1")
    parser.add_argument("--all-reduce", choices=["symm", "nccl"], default="symm",
                        help="how ranks sum their partials: torch symmetric memory or NCCL")  # fmt: skip
    args = parser.parse_args(argv)
    if not 0 <= args.rank < args.world_size:
        parser.error("--rank must be below --world-size")
    config = CONFIGS[args.config]
    batches = [int(b) for b in args.batches.split(",")] if args.batches else list(
        BENCH_BATCHES if args.config != "tiny" else TINY_BATCHES)  # fmt: skip
    max_batch = max(batches)

    parallel = args.world_size > 1 or args.symm
    model_record = {"recipe": "torch-decoder", "config": args.config}
    if parallel:
        model_record.update(tensor_parallel=str(args.world_size), all_reduce=args.all_reduce)
    session = open_session(device=args.rank, model=model_record)
    t0 = time.perf_counter()
    session.start()
    torch.cuda.manual_seed(CUDA_SEED)
    tp = None
    if parallel and args.all_reduce == "nccl":
        tp = nccl_tp(session, args.rank, args.world_size)
    elif parallel:
        tp = symmetric_tp(session, args.rank, args.world_size, max_batch, config.hidden)
    model = Decoder(config, max_batch, tp=tp)
    ids = torch.zeros(max_batch, dtype=torch.long, device="cuda")
    pos = torch.zeros(max_batch, dtype=torch.long, device="cuda")
    sample_in = torch.zeros(8, config.vocab, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    t_alloc = time.perf_counter()

    def warm() -> None:
        for bs in batches:
            model.step(ids[:bs], pos[:bs])
        sample(sample_in)
        model.cache.zero_()

    session.warmup(warm)
    t_warm = time.perf_counter()
    graphs = {bs: session.graph(f"decode.bs{bs}", lambda bs=bs: model.step(ids[:bs], pos[:bs]), shape_key=bs,
                                runner="decode") for bs in batches}  # fmt: skip
    sampler = session.graph("sample.bs8", lambda: sample(sample_in), shape_key=8, runner="sample")
    torch.cuda.synchronize()
    t_graphs = time.perf_counter()
    report = {"session": session.finish(), "config": args.config, "batches": batches,
              "timing": {"alloc_s": t_alloc - t0, "warmup_s": t_warm - t_alloc, "graphs_s": t_graphs - t_warm},
              "jit_cache": {k: os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}}  # fmt: skip
    if args.bench:
        report.update(time_replays(graphs))
    else:
        report["decode"] = decode(model, graphs, ids, pos)
        report["sampling"] = sampling(graphs, sampler, sample_in, ids, pos, model)
    args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(json.dumps({k: report[k] for k in ("config", "timing")}, default=str))
    if parallel and args.all_reduce == "nccl":
        # destroying NCCL's communicator while graphs that captured its kernels are alive
        # hung until killed on the H200 test machine; everything is written, so leave now
        sys.stdout.flush()
        os._exit(0)
    if parallel:
        torch.distributed.destroy_process_group()
    return 0


def decode(model: Decoder, graphs: dict, ids: torch.Tensor, pos: torch.Tensor) -> dict:
    """Greedy decoding with every graph from two prompt sets."""
    out = {}
    for bs, graph in graphs.items():
        logits, next_ids = graph.outputs
        for seed in PROMPT_SEEDS:
            model.cache.zero_()
            prompt = torch.randint(0, model.config.vocab, (bs,), generator=torch.Generator().manual_seed(seed + bs))
            ids[:bs].copy_(prompt)
            pos.zero_()
            tokens = []
            for _ in range(STEPS):
                graph.replay()
                tokens.append(next_ids.cpu().tolist())
                ids[:bs].copy_(next_ids)
                pos[:bs].add_(1)
            torch.cuda.synchronize()
            out[f"bs{bs}.prompt{seed}"] = {"tokens": tokens, "final_logits_sha256": digest(logits)}
    return out


def sampling(graphs: dict, sampler, sample_in: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor,
             model: Decoder) -> dict:  # fmt: skip
    """Three seeded sampling replays over the bs-8 logits, then one eager rand."""
    model.cache.zero_()
    ids[:8].copy_(torch.arange(8))
    pos.zero_()
    graphs[8].replay() if 8 in graphs else None
    logits = graphs[8].outputs[0] if 8 in graphs else torch.zeros_like(sample_in)
    sample_in.copy_(logits)
    draws = []
    for _ in range(SAMPLE_REPLAYS):
        sampler.replay()
        draws.append(sampler.outputs.cpu().tolist())
    eager = torch.rand(4, device="cuda")
    return {"draws": draws, "eager_rand_sha256": digest(eager), "eager_rand": eager.cpu().tolist()}


def time_replays(graphs: dict, repeats: int = 20) -> dict:
    """Median replay time of each graph after 3 warm replays: ``replay`` on an idle
    stream (the host's launch counted), ``replay_busy`` behind a sleep kernel (the
    GPU's execution alone)."""
    out: dict = {"replay": {}, "replay_busy": {}}
    for bs, graph in graphs.items():
        for _ in range(3):
            graph.replay()
        out["replay"][str(bs)] = median_ms(graph.replay, busy=False, repeats=repeats)
        out["replay_busy"][str(bs)] = median_ms(graph.replay, busy=True, repeats=repeats)
    return out


if __name__ == "__main__":
    sys.exit(main())

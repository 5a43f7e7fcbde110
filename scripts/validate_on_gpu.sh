#!/usr/bin/env bash
# Everything Foundry claims about a GPU, section by section (tp2, tp2-nccl and ep2 need two GPUs).
#
#   scripts/validate_on_gpu.sh RESULTS_DIR [SECTION ...]
#
# Sections, in order (all one-GPU ones when none is named): tests session-tests recipe
# recipe-runs3 relocation negative bench sglang sglang-more sglang-prefill sglang-cold, scale-save
# scale-load scale-more scale-tpot scale-neg (PRESET=qwen3-8b|qwen3-30b-a3b), vllm vllm-http
# vllm-more vllm-cold vllm-scale-save vllm-scale-load vllm-scale-more (VPRESET=qwen3-8b|qwen3-30b-a3b;
# named only), sglang-spec sglang-spec-more sglang-ngram sglang-hybrid sglang-hybrid-more sglang-mtp
# (named only), and on two GPUs tp2 tp2-nccl sglang-tp2 sglang-tp2-more (TP2_CA=on|off) ep2.
# relocation and negative need recipe's archive in RESULTS_DIR; sglang needs SGLang 0.5.17
# importable (and this package installed, so SGLang finds the plugin's entry point), vllm*
# vLLM 0.25.1 (the same, for vLLM's entry point: on the H200 test machine
# PYTHONPATH=/tmp/vllm-site after its bundles are installed); ep2 needs DeepEP built for the
# installed torch (recipes/deepep/build_deep_ep.sh) and nvidia-ml-py.
#
# Needs torch with CUDA, cuda-bindings, zstandard, nvcc and this package
# (installed, so its backends' entry points exist) with the native hook built.
# Writes logs and reports under RESULTS_DIR and prints a summary table last; each
# step says which command produced it, for docs/validation.md. A section longer than one
# call's limit (sglang-spec) goes on where it stopped when run again with RESUME=1.
set -uo pipefail
RESULTS=${1:?usage: scripts/validate_on_gpu.sh RESULTS_DIR [tests|session-tests|recipe|recipe-runs3|relocation|negative|bench|sglang|sglang-more|sglang-prefill|sglang-cold|scale-save|scale-load|scale-more|scale-tpot|scale-neg|vllm|vllm-http|vllm-more|vllm-cold|vllm-scale-save|vllm-scale-load|vllm-scale-more|sglang-spec|sglang-spec-more|sglang-ngram|sglang-hybrid|sglang-hybrid-more|sglang-mtp|tp2|tp2-nccl|sglang-tp2|sglang-tp2-more|ep2 ...]}
shift
SECTIONS=${*:-tests session-tests recipe recipe-runs3 relocation negative bench sglang sglang-more sglang-prefill sglang-cold}
wants() { [[ " $SECTIONS " == *" $1 "* ]]; }
cd "$(dirname "$0")/.."
mkdir -p "$RESULTS"
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$RESULTS/jit/inductor}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$RESULTS/jit/triton}
SUMMARY=$RESULTS/summary.txt
# RESUME=1: go on where an earlier call stopped (a section longer than one call's time limit):
# the summary is kept, and each step that exited 0 before is not run again
[ -n "${RESUME:-}" ] || { : > "$SUMMARY"; rm -f "$RESULTS"/*.ok; }
done_before() { [ -n "${RESUME:-}" ] && [ -e "$RESULTS/$1.ok" ]; }
step() {  # step NAME CMD...: run, log, record the exit code
    local name=$1; shift
    if done_before "$name"; then echo "$name: exited 0 in an earlier call, not run again" | tee -a "$SUMMARY"; return 0; fi
    local start=$SECONDS
    "$@" > "$RESULTS/$name.log" 2>&1
    local rc=$?
    printf '%-28s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - start))" "$*" | tee -a "$SUMMARY"
    [ "$rc" -ne 0 ] || : > "$RESULTS/$name.ok"
    return $rc
}
refused() {  # refused NAME FIELD RC: the step NAME must have failed (RC) and named FIELD in its log(s)
    if [ "$3" -ne 0 ] && grep -qs -- "$2" "$RESULTS/$1".log "$RESULTS/$1".r*.log; then
        echo "$1: refused naming $2" | tee -a "$SUMMARY"
    else echo "$1: NOT refused by $2" | tee -a "$SUMMARY"; fi
}
RUN="python3 recipes/torch/run.py"
ranks() {  # ranks NAME TEMPLATE: both ranks at once, @R@ replaced by each rank; rc 0 when both exit 0
    local name=$1 template=$2 start=$SECONDS rc=0 pids=()
    for r in 0 1; do
        timeout "${RANKS_TIMEOUT:-180}" bash -c "${template//@R@/$r}" > "$RESULTS/$name.r$r.log" 2>&1 & pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    printf '%-28s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - start))" "$template" | tee -a "$SUMMARY"
    return $rc
}
SHIFTED=0x600400000000  # the default base + 16 GiB

# 1. GPU tests (sessions, native builder, relocation, symmetric memory, the hook, lowering)
# (two sections: together they take longer than ten minutes)
wants tests && step gpu-tests python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py tests/test_gpu_hook.py tests/test_gpu_ipc.py
wants session-tests && step gpu-session-tests python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_session.py

# 2. the decoder recipe: baseline, two-run SAVE, a second two-run SAVE, LOADs
if wants recipe; then
rm -rf "$RESULTS/a" && mkdir -p "$RESULTS/a"
step baseline $RUN --out "$RESULTS/baseline.json"
# SAVE2 runs exactly SAVE's command line (the application's own arguments reach
# unused parameter bytes too), then is moved aside for SAVE to run.
step save2 python3 -m foundry run --mode save --archive "$RESULTS/a/save" -- $RUN --out "$RESULTS/save.json"
mv "$RESULTS/a/save" "$RESULTS/a/save2" && mv "$RESULTS/save.json" "$RESULTS/save2.json"
step save python3 -m foundry run --mode save --archive "$RESULTS/a/save" -- $RUN --out "$RESULTS/save.json"
step load python3 -m foundry run --mode load --archive "$RESULTS/a/save" -- $RUN --out "$RESULTS/load.json"
step load-restore python3 -m foundry run --mode load --warmup restore --archive "$RESULTS/a/save" -- $RUN --out "$RESULTS/load-restore.json"
step load-native python3 -m foundry run --mode load --builder native --build-threads 4 --archive "$RESULTS/a/save" -- $RUN --out "$RESULTS/load-native.json"
step load-shifted python3 -m foundry run --mode load --region-base $SHIFTED --archive "$RESULTS/a/save" -- $RUN --out "$RESULTS/load-shifted.json"
step compare python3 recipes/torch/compare.py "$RESULTS"/baseline.json "$RESULTS"/save.json "$RESULTS"/save2.json "$RESULTS"/load.json \
    "$RESULTS"/load-restore.json "$RESULTS"/load-native.json "$RESULTS"/load-shifted.json
step save-vs-save2 python3 -m foundry archive diff "$RESULTS/a/save" "$RESULTS/a/save2"
fi

# 2b. SAVE vs SAVE2 again, each with three runs: do more runs find every leftover byte, so that
# the two archives' fingerprints agree on every graph? (the same command line twice, as above)
if wants recipe-runs3; then
rm -rf "$RESULTS/a3" && mkdir -p "$RESULTS/a3"
step save3-2 python3 -m foundry run --mode save --save-runs 3 --archive "$RESULTS/a3/save" -- $RUN --out "$RESULTS/a3/save.json"
mv "$RESULTS/a3/save" "$RESULTS/a3/save2"
step save3-1 python3 -m foundry run --mode save --save-runs 3 --archive "$RESULTS/a3/save" -- $RUN --out "$RESULTS/a3/save.json"
step save3-diff python3 -m foundry archive diff "$RESULTS/a3/save" "$RESULTS/a3/save2"
fi

# 3. relocation proof: a SAVE at a base 16 GiB higher, compared word by word
if wants relocation; then
# the same command line as SAVE but for --region-base; SAVE's files are moved aside meanwhile
mv "$RESULTS/save.json" "$RESULTS/save.json.kept" && mv "$RESULTS/a/save" "$RESULTS/a/save.kept"
step save-shifted python3 -m foundry run --mode save --region-base $SHIFTED --archive "$RESULTS/a/save" -- $RUN --out "$RESULTS/save.json"
mv "$RESULTS/save.json" "$RESULTS/save-shifted.json" && mv "$RESULTS/a/save" "$RESULTS/a/save-shifted"
mv "$RESULTS/save.json.kept" "$RESULTS/save.json" && mv "$RESULTS/a/save.kept" "$RESULTS/a/save"
step relocations python3 -m foundry archive diff --relocations "$RESULTS/a/save" "$RESULTS/a/save-shifted"
fi

# 4. negative control: one parameter word altered
if wants negative; then
rm -rf "$RESULTS/a/neg" && cp -r "$RESULTS/a/save" "$RESULTS/a/neg" && python3 recipes/torch/negative_control.py "$RESULTS/a/neg" > "$RESULTS/neg-edit.log" 2>&1
step load-neg python3 -m foundry run --mode load --archive "$RESULTS/a/neg" -- $RUN --out "$RESULTS/load-neg.json"
step compare-neg python3 recipes/torch/compare.py "$RESULTS"/baseline.json "$RESULTS"/load-neg.json  # must exit 1
fi

# 5. cold start at the Qwen3-0.6B shape
if wants bench; then
    step cold-start python3 bench/cold_start.py --out "$RESULTS/bench"
fi

# 6. SGLang: a tiny Qwen3 served by SGLang, baseline vs SAVE vs LOAD (Engine and HTTP);
# sglang-more: SAVE2 and diff, lint, the LOAD without the plugin and the drift refusals
# (it needs sglang's archive in RESULTS_DIR; together they take longer than ten minutes)
SG="python3 recipes/sglang/run.py"
if wants sglang; then
rm -rf "$RESULTS/sg" && mkdir -p "$RESULTS/sg"
step sg-baseline $SG --out "$RESULTS/sg/baseline.json"
step sg-save python3 -m foundry run --mode save --archive "$RESULTS/sg/save" -- $SG --out "$RESULTS/sg/save.json"
step sg-load python3 -m foundry run --mode load --archive "$RESULTS/sg/save" -- $SG --out "$RESULTS/sg/load.json"
# the same LOAD without SGLang's warm-up forwards (SAVE's verdict sglang.warmup_skip must be safe)
step sg-load-skip python3 -m foundry run --mode load --warmup restore --archive "$RESULTS/sg/save" -- $SG --out "$RESULTS/sg/load-skip.json"
# and from launch plans, instantiated on a thread behind SGLang
step sg-load-fast python3 -m foundry run --mode load --warmup restore --builder native --instantiate background \
    --archive "$RESULTS/sg/save" -- $SG --out "$RESULTS/sg/load-fast.json"
# start-up, fairly: plain SGLang again now that the JIT caches are warm (the first baseline
# compiled SGLang's Triton kernels inside its graph phase), then the LOAD against it
step sg-baseline-warm $SG --out "$RESULTS/sg/baseline-warm.json"
step sg-startup python3 recipes/sglang/compare.py "$RESULTS"/sg/baseline-warm.json "$RESULTS"/sg/load.json \
    "$RESULTS"/sg/load-skip.json "$RESULTS"/sg/load-fast.json
# the HTTP entry last: the comparisons above need it least
step sg-load-http python3 -m foundry run --mode load --archive "$RESULTS/sg/save" -- $SG --entry http --out "$RESULTS/sg/load-http.json"
step sg-compare python3 recipes/sglang/compare.py "$RESULTS"/sg/baseline.json "$RESULTS"/sg/save.json \
    "$RESULTS"/sg/load.json "$RESULTS"/sg/load-http.json "$RESULTS"/sg/load-skip.json "$RESULTS"/sg/load-fast.json
fi
if wants sglang-more; then
rm -rf "$RESULTS/sg/save2"
# SAVE2 runs exactly SAVE's command line, SAVE's archive and report moved aside meanwhile
if [ -d "$RESULTS/sg/save.kept" ]; then  # an interrupted run left SAVE aside: put it back first
    rm -rf "$RESULTS/sg/save" && mv "$RESULTS/sg/save.kept" "$RESULTS/sg/save" && mv "$RESULTS/sg/save.json.kept" "$RESULTS/sg/save.json"
fi
mv "$RESULTS/sg/save" "$RESULTS/sg/save.kept" && mv "$RESULTS/sg/save.json" "$RESULTS/sg/save.json.kept"
step sg-save2 python3 -m foundry run --mode save --archive "$RESULTS/sg/save" -- $SG --out "$RESULTS/sg/save.json"
mv "$RESULTS/sg/save" "$RESULTS/sg/save2" && mv "$RESULTS/sg/save.json" "$RESULTS/sg/save2.json"
mv "$RESULTS/sg/save.kept" "$RESULTS/sg/save" && mv "$RESULTS/sg/save.json.kept" "$RESULTS/sg/save.json"
step sg-compare2 python3 recipes/sglang/compare.py "$RESULTS"/sg/baseline.json "$RESULTS"/sg/save2.json
step sg-diff python3 -m foundry archive diff "$RESULTS/sg/save" "$RESULTS/sg/save2"
step sg-lint python3 -m foundry graph lint "$RESULTS/sg/save" --expect nccl-allreduce=0
# the plugin excluded: the LOAD must fail rather than capture again (exit code must be non-zero)
SGLANG_PLUGINS=none step sg-load-without-plugin python3 -m foundry run --mode load --archive "$RESULTS/sg/save" -- $SG --out "$RESULTS/sg/load-without-plugin.json"
refused sg-load-without-plugin "a stream capture in LOAD mode" $?
# drift: each LOAD must be refused before serving, naming the server argument (grep its log)
drift() {  # drift FIELD RECIPE-ARGS...: a LOAD that must fail, naming sglang.FIELD
    local field=$1; shift
    step sg-drift-$field python3 -m foundry run --mode load --archive "$RESULTS/sg/save" -- $SG "$@" --out "$RESULTS/sg/drift-$field.json"
    refused sg-drift-$field "sglang.$field" $?
}
drift mem_fraction_static --set mem_fraction_static=0.25
drift cuda_graph_bs_decode --set 'cuda_graph_bs_decode=[1,2,4]'
drift attention_backend --set attention_backend=torch_native
drift model_config_sha256 --model-set num_hidden_layers=3
fi

# 6b. full prefill graphs with the triton backend, if plain SGLang captures them (SGLang 0.5.17
# does not: its triton backend raises "Invalid forward mode ... EXTEND" for prefill graphs); then
# SAVE, LOAD and the comparison
if wants sglang-prefill; then
rm -rf "$RESULTS/sgp" && mkdir -p "$RESULTS/sgp"
PF=(--set cuda_graph_backend_prefill=full --set 'cuda_graph_bs_prefill=[64,128,256]')
if step sgp-baseline $SG "${PF[@]}" --out "$RESULTS/sgp/baseline.json"; then
step sgp-save python3 -m foundry run --mode save --archive "$RESULTS/sgp/save" -- $SG "${PF[@]}" --out "$RESULTS/sgp/save.json"
step sgp-load python3 -m foundry run --mode load --archive "$RESULTS/sgp/save" -- $SG "${PF[@]}" --out "$RESULTS/sgp/load.json"
step sgp-compare python3 recipes/sglang/compare.py "$RESULTS"/sgp/baseline.json "$RESULTS"/sgp/save.json "$RESULTS"/sgp/load.json
step sgp-inspect python3 -m foundry archive inspect "$RESULTS/sgp/save"
else
echo "sgp: plain SGLang did not capture full prefill graphs (sgp-baseline.log); nothing to persist" | tee -a "$SUMMARY"
fi
fi

# 6c. start-up as a fresh machine sees it: every run with JIT caches of its own (Triton, Inductor,
# SGLang's tvm-ffi and its cache directory, FlashInfer's, the driver's), empty at its start (plain
# SGLang compiles kernels inside its graph phase; a LOAD that skips the warm-ups compiles them at
# its first eager prefill: the first batch's seconds show it). The warm comparison is the sglang
# section's. Each cache's size after its run is listed.
if wants sglang-cold; then
rm -rf "$RESULTS/sgc" && mkdir -p "$RESULTS/sgc"
jit() {  # jit RUN: point every JIT cache at RUN's own empty directories
    local J=$RESULTS/sgc/jit-$1
    export TRITON_CACHE_DIR=$J/triton TORCHINDUCTOR_CACHE_DIR=$J/inductor TVM_FFI_CACHE_DIR=$J/tvm-ffi \
        SGLANG_CACHE_DIR=$J/sglang CUDA_CACHE_PATH=$J/cuda FLASHINFER_WORKSPACE_BASE=$J/flashinfer
}
FAST=(--warmup restore --builder native --instantiate background)
jit baseline; step sgc-baseline-cold $SG --out "$RESULTS/sgc/baseline-cold.json"
# SAVE with the sglang section's command line and its default two runs; the archive carries no
# JIT caches here (--no-jit-caches): this section measures a LOAD that compiles them itself
# (bench/sglang_startup.py measures the one that installs them)
jit save; step sgc-save python3 -m foundry run --mode save --no-jit-caches --archive "$RESULTS/sgc/save" -- $SG --out "$RESULTS/sgc/save.json"
jit load; step sgc-load-cold python3 -m foundry run --mode load --no-jit-caches "${FAST[@]}" --archive "$RESULTS/sgc/save" -- $SG --out "$RESULTS/sgc/load-cold.json"
step sgc-startup-cold python3 recipes/sglang/compare.py "$RESULTS"/sgc/baseline-cold.json "$RESULTS"/sgc/save.json "$RESULTS"/sgc/load-cold.json
(cd "$RESULTS/sgc" && du -s --block-size=K jit-*/* 2>/dev/null) | tee -a "$SUMMARY"
fi

# 6d. SGLang at production shape (PRESET, default qwen3-8b) at SGLang's default decode graph
# set: SAVE, plain SGLang, LOAD repeating the warm-ups, LOAD restoring their bytes from launch
# plans, each with the wave (256 prompts, WAVE_SIZE); then SAVE2, diff, lint, TPOT and the negative control. Five
# sections, each within ten minutes: scale-save, scale-load, scale-more, scale-tpot, scale-neg (in that order).
# SG_EXTRA: more recipe arguments for every run of these sections, SG_TAG: the name of their
# directory's variant (e.g. SG_EXTRA="--set attention_backend=flashinfer --set
# cuda_graph_backend_prefill=full --set context_length=8208 --prefill-walk" SG_TAG=fi-prefill: decode
# and full prefill graphs with FlashInfer, and one prompt per prefill graph's size so that each replays).
# WAVE_SIZE: the wave's prompts where the decode set goes above bs 256 (SG_EXTRA="--set
# max_running_requests=512 --set cuda_graph_bs_decode=[1,2,4,...,496,512] --set max_total_tokens=131072"
# WAVE_SIZE=512 SG_TAG=bs512; the TPOT runs send no wave)
PRESET=${PRESET:-qwen3-8b}
SS=$RESULTS/scale-$PRESET${SG_TAG:+-$SG_TAG}
SGS="$SG --preset $PRESET --wave ${WAVE_SIZE:+--wave-size $WAVE_SIZE} ${SG_EXTRA:-}"
SGP=sgs${SG_TAG:+-$SG_TAG}  # the steps' names (logs, RESUME marks)
REGION=()
# lint's counts per decode graph, from the model's shape: two fused add-norms a layer (the final norm
# and the first layer's post-attention one included), two fused-MoE launches a MoE layer
LINT=(--expect 'kernel:*FusedAddRMSNorm*=72' --expect kernel:fused_moe_kernel=0)
if [ "$PRESET" = qwen3-30b-a3b ]; then
REGION=(--region-size 0x1a00000000)  # the weights and the KV pool
LINT=(--expect 'kernel:*FusedAddRMSNorm*=96' --expect kernel:fused_moe_kernel=96
      --expect 'kernel:moe_align_block_size_kernel*=48' --expect kernel:_router_triton_kernel=48)
fi
if wants scale-save; then
rm -rf "$SS" && mkdir -p "$SS"
step $SGP-save python3 -m foundry run --mode save "${REGION[@]}" --archive "$SS/save" -- $SGS --out "$SS/save.json"
step $SGP-inspect python3 -m foundry archive inspect "$SS/save" --json
step $SGP-trace python3 scripts/region_trace.py "$SS/save" "$SS/trace.json"
fi
if wants scale-load; then  # the quickest first: a section cut short by the call's limit resumes (RESUME=1)
step $SGP-load-fast python3 -m foundry run --mode load --warmup restore --builder native --instantiate background \
    --archive "$SS/save" -- $SGS --out "$SS/load-fast.json"
# the same fast LOAD without SGLang's collection before its capture loop (the graph phase with and without it)
step $SGP-load-fast-nogc env FOUNDRY_SGLANG_GC=skip-all python3 -m foundry run --mode load --warmup restore \
    --builder native --instantiate background --archive "$SS/save" -- $SGS --out "$SS/load-fast-nogc.json"
step $SGP-load python3 -m foundry run --mode load --archive "$SS/save" -- $SGS --out "$SS/load.json"
step $SGP-baseline $SGS --out "$SS/baseline.json"
step $SGP-compare python3 recipes/sglang/compare.py "$SS"/baseline.json "$SS"/save.json "$SS"/load.json "$SS"/load-fast.json \
    "$SS"/load-fast-nogc.json
fi
if wants scale-more; then
rm -rf "$SS/save2"
mv "$SS/save" "$SS/save.kept" && mv "$SS/save.json" "$SS/save.json.kept"
# SAVE2 reuses SAVE's builds (its JIT caches, host code included): each build of SGLang's JIT
# kernels differs (nvcc's anonymous-namespace ids) and Inductor's tuning picks by timing
step $SGP-save2 python3 -m foundry run --mode save "${REGION[@]}" --jit-caches-from "$SS/save.kept" --trust-cached-code \
    --archive "$SS/save" -- $SGS --out "$SS/save.json"
mv "$SS/save" "$SS/save2" && mv "$SS/save.json" "$SS/save2.json"
mv "$SS/save.kept" "$SS/save" && mv "$SS/save.json.kept" "$SS/save.json"
step $SGP-compare2 python3 recipes/sglang/compare.py "$SS"/baseline.json "$SS"/save2.json
step $SGP-diff python3 -m foundry archive diff "$SS/save" "$SS/save2"
step $SGP-lint python3 -m foundry graph lint "$SS/save" --expect nccl-allreduce=0  # every graph, prefill too
step $SGP-lint-decode python3 -m foundry graph lint "$SS/save" --graph 'decode.*' "${LINT[@]}"
fi
# TPOT: decode step times at bs 1, 8, 64, 256 from SGLang's decode log lines, plain vs the
# fast LOAD (the start-up figure's builder) vs the same builder with SGLang's warm-ups repeated
# (they run on a second stream, as plain SGLang's do: docs/sglang.md, "Decode speed after LOAD"),
# and plain SGLang again on the archive's JIT builds (plain compiles its own: Inductor's tuning
# picks by timing, so two builds can launch differently), and a one-run SAVE (SGLang's own builds
# and captured graphs, in Foundry's region: the memory apart from the builds and the restore)
with_builds() (  # with_builds ARCHIVE DIR CMD...: CMD without Foundry, on ARCHIVE's JIT builds installed below DIR
    local archive=$1 dir=$2 exports; shift 2
    exports=$(python3 -m foundry archive jit-caches "$archive" --into "$dir" --trust-cached-code) || return
    eval "$exports" && "$@"
)
if wants scale-tpot; then
TP=(--tpot 1,8,64,256 --set decode_log_interval=1 --set log_level=info)
step $SGP-tpot-plain $SG --preset $PRESET ${SG_EXTRA:-} "${TP[@]}" --out "$SS/tpot-plain.json"
rm -rf "$SS/jit-builds"
step $SGP-tpot-plain-builds with_builds "$SS/save" "$SS/jit-builds" $SG --preset $PRESET ${SG_EXTRA:-} "${TP[@]}" \
    --out "$SS/tpot-plain-builds.json"
rm -rf "$SS/tpot-save"
step $SGP-tpot-save python3 -m foundry run --mode save --save-runs 1 --no-jit-caches "${REGION[@]}" \
    --archive "$SS/tpot-save" -- $SG --preset $PRESET ${SG_EXTRA:-} "${TP[@]}" --out "$SS/tpot-save.json"
step $SGP-tpot-load python3 -m foundry run --mode load --warmup restore --builder native --instantiate background \
    --archive "$SS/save" -- $SG --preset $PRESET ${SG_EXTRA:-} "${TP[@]}" --out "$SS/tpot-load.json"
step $SGP-tpot-load-replay python3 -m foundry run --mode load --warmup replay --builder native --instantiate background \
    --archive "$SS/save" -- $SG --preset $PRESET ${SG_EXTRA:-} "${TP[@]}" --out "$SS/tpot-load-replay.json"
step $SGP-tpot python3 recipes/sglang/tpot.py "$RESULTS/$SGP-tpot-plain.log" "$RESULTS/$SGP-tpot-load.log" \
    "$RESULTS/$SGP-tpot-load-replay.log" "$RESULTS/$SGP-tpot-save.log"
# the LOADs, and plain SGLang on its own builds, against plain SGLang on the archive's
step $SGP-tpot-same-builds python3 recipes/sglang/tpot.py "$RESULTS/$SGP-tpot-plain-builds.log" "$RESULTS/$SGP-tpot-load.log" \
    "$RESULTS/$SGP-tpot-load-replay.log" "$RESULTS/$SGP-tpot-plain.log"
fi
# negative control: decode.bs1 with its final norm's epsilon altered (on the logits path; with
# dummy weights a layer's norm is not, see recipes/torch/negative_control.py); compare must exit 1
# naming the first differing prompt and step
if wants scale-neg; then
REF=$SS/baseline.json  # plain SGLang's outputs, or SAVE's where scale-load did not run (scale-load shows them equal)
[ -f "$REF" ] || REF=$SS/save.json
rm -rf "$SS/neg" && cp -r "$SS/save" "$SS/neg"
step $SGP-neg-edit python3 recipes/torch/negative_control.py "$SS/neg" --graph decode.bs1 --last --epsilon 1e30
step $SGP-load-neg python3 -m foundry run --mode load --archive "$SS/neg" -- $SGS --out "$SS/load-neg.json"
step $SGP-compare-neg python3 recipes/sglang/compare.py "$REF" "$SS"/load-neg.json  # must exit 1
# the same archive asked for launch plans: the altered graph has none, so every graph builds from its IR
step $SGP-load-neg-fast python3 -m foundry run --mode load --warmup restore --builder native --instantiate background \
    --archive "$SS/neg" -- $SGS --out "$SS/load-neg-fast.json"
step $SGP-compare-neg-fast python3 recipes/sglang/compare.py "$REF" "$SS"/load-neg-fast.json  # must exit 1
fi

# 6e. vLLM (not yet run on the H200 test machine): a tiny Qwen3 served by vLLM 0.25.1 through
# vllm.LLM, plain vs SAVE (two runs) vs LOAD, each walking the batch through every capture size
# (--wave); vllm-http the same through vLLM's OpenAI-compatible server; vllm-more SAVE2, diff,
# lint, the LOAD without the plugin and the drift refusals (it needs vllm's archive). Every run
# gets the same torch.compile cache (VLLM_CACHE_ROOT), warmed by the first plain run.
VL="python3 recipes/vllm/run.py"
export VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-$RESULTS/jit/vllm}
if wants vllm; then
rm -rf "$RESULTS/vl" && mkdir -p "$RESULTS/vl"
step vl-baseline $VL --wave --out "$RESULTS/vl/baseline.json"
step vl-save python3 -m foundry run --mode save --archive "$RESULTS/vl/save" -- $VL --wave --out "$RESULTS/vl/save.json"
step vl-load python3 -m foundry run --mode load --archive "$RESULTS/vl/save" -- $VL --wave --out "$RESULTS/vl/load.json"
step vl-load-native python3 -m foundry run --mode load --builder native --archive "$RESULTS/vl/save" -- $VL --wave \
    --out "$RESULTS/vl/load-native.json"
# start-up, fairly: plain vLLM again now that every cache is warm, then the LOADs against it
step vl-baseline-warm $VL --out "$RESULTS/vl/baseline-warm.json"
step vl-startup python3 recipes/vllm/compare.py "$RESULTS"/vl/baseline-warm.json "$RESULTS"/vl/load.json \
    "$RESULTS"/vl/load-native.json
step vl-compare python3 recipes/vllm/compare.py "$RESULTS"/vl/baseline.json "$RESULTS"/vl/save.json \
    "$RESULTS"/vl/load.json "$RESULTS"/vl/load-native.json
step vl-inspect python3 -m foundry archive inspect "$RESULTS/vl/save"
fi
if wants vllm-http; then
rm -rf "$RESULTS/vlh" && mkdir -p "$RESULTS/vlh"
VH="$VL --entry http --wave"
step vlh-baseline $VH --out "$RESULTS/vlh/baseline.json"
step vlh-save python3 -m foundry run --mode save --archive "$RESULTS/vlh/save" -- $VH --out "$RESULTS/vlh/save.json"
step vlh-load python3 -m foundry run --mode load --archive "$RESULTS/vlh/save" -- $VH --out "$RESULTS/vlh/load.json"
step vlh-compare python3 recipes/vllm/compare.py "$RESULTS"/vlh/baseline.json "$RESULTS"/vlh/save.json "$RESULTS"/vlh/load.json
# the server's outputs against vllm.LLM's (the vllm section's baseline), where both ran
[ -f "$RESULTS/vl/baseline.json" ] && step vlh-vs-llm python3 recipes/vllm/compare.py "$RESULTS"/vl/baseline.json "$RESULTS"/vlh/baseline.json
fi
if wants vllm-more; then
rm -rf "$RESULTS/vl/save2"
if [ -d "$RESULTS/vl/save.kept" ]; then  # an interrupted run left SAVE aside: put it back first
    rm -rf "$RESULTS/vl/save" && mv "$RESULTS/vl/save.kept" "$RESULTS/vl/save" && mv "$RESULTS/vl/save.json.kept" "$RESULTS/vl/save.json"
fi
mv "$RESULTS/vl/save" "$RESULTS/vl/save.kept" && mv "$RESULTS/vl/save.json" "$RESULTS/vl/save.json.kept"
step vl-save2 python3 -m foundry run --mode save --archive "$RESULTS/vl/save" -- $VL --wave --out "$RESULTS/vl/save.json"
mv "$RESULTS/vl/save" "$RESULTS/vl/save2" && mv "$RESULTS/vl/save.json" "$RESULTS/vl/save2.json"
mv "$RESULTS/vl/save.kept" "$RESULTS/vl/save" && mv "$RESULTS/vl/save.json.kept" "$RESULTS/vl/save.json"
step vl-compare2 python3 recipes/vllm/compare.py "$RESULTS"/vl/baseline.json "$RESULTS"/vl/save2.json
step vl-diff python3 -m foundry archive diff "$RESULTS/vl/save" "$RESULTS/vl/save2"
step vl-lint python3 -m foundry graph lint "$RESULTS/vl/save" --expect nccl-allreduce=0
# the plugin excluded: the LOAD must fail rather than capture again (exit code must be non-zero)
VLLM_PLUGINS=none step vl-load-without-plugin python3 -m foundry run --mode load --archive "$RESULTS/vl/save" -- $VL --out "$RESULTS/vl/load-without-plugin.json"
refused vl-load-without-plugin "a stream capture in LOAD mode" $?
vdrift() {  # vdrift NAME FIELD RECIPE-ARGS...: a LOAD that must fail, naming FIELD
    local name=$1 field=$2; shift 2
    step vl-drift-$name python3 -m foundry run --mode load --archive "$RESULTS/vl/save" -- $VL "$@" --out "$RESULTS/vl/drift-$name.json"
    refused vl-drift-$name "$field" $?
}
vdrift memory vllm.cache_config.gpu_memory_utilization --set gpu_memory_utilization=0.25
vdrift seqs vllm.scheduler_config.max_num_seqs --set max_num_seqs=4
vdrift sizes vllm.compilation_config.cudagraph_capture_sizes --set 'compilation_config={"cudagraph_capture_sizes": [1, 2, 4]}'
vdrift mode vllm.compilation_config.cudagraph_mode --set 'compilation_config={"cudagraph_mode": "PIECEWISE"}'
vdrift attention vllm.attention_config.backend --set attention_backend=TRITON_ATTN
vdrift model vllm.model_config_sha256 --model-set num_hidden_layers=3
VLLM_USE_V2_MODEL_RUNNER=0 vdrift runner vllm.model_runner
fi
# 6f. vLLM on a fresh machine: every run with JIT caches of its own, empty at its start (vLLM's
# torch.compile cache, which holds Inductor's and Triton's, and the driver's), against the SAVE
# of the vllm section; each cache's size after its run is listed
if wants vllm-cold; then
rm -rf "$RESULTS/vlc" && mkdir -p "$RESULTS/vlc"
vjit() {  # vjit RUN: point every JIT cache at RUN's own empty directories
    local J=$RESULTS/vlc/jit-$1
    export VLLM_CACHE_ROOT=$J/vllm TRITON_CACHE_DIR=$J/triton TORCHINDUCTOR_CACHE_DIR=$J/inductor CUDA_CACHE_PATH=$J/cuda \
        FLASHINFER_WORKSPACE_BASE=$J/flashinfer
}
vjit baseline; step vlc-baseline-cold $VL --out "$RESULTS/vlc/baseline-cold.json"
vjit load; step vlc-load-cold python3 -m foundry run --mode load --archive "$RESULTS/vl/save" -- $VL --out "$RESULTS/vlc/load-cold.json"
step vlc-startup-cold python3 recipes/vllm/compare.py "$RESULTS"/vlc/baseline-cold.json "$RESULTS"/vlc/load-cold.json
(cd "$RESULTS/vlc" && du -s --block-size=K jit-*/* 2>/dev/null) | tee -a "$SUMMARY"
export VLLM_CACHE_ROOT=$RESULTS/jit/vllm TRITON_CACHE_DIR=$RESULTS/jit/triton TORCHINDUCTOR_CACHE_DIR=$RESULTS/jit/inductor
unset CUDA_CACHE_PATH FLASHINFER_WORKSPACE_BASE
fi
# 6g. vLLM at production shape (VPRESET, default qwen3-8b on Model Runner V2; qwen3-30b-a3b is the
# MoE shape, on the V1 runner) at vLLM's default capture sizes (51, 1-512): plain, SAVE, LOAD, each
# with the wave; then SAVE2, diff and lint. Three sections, each meant to fit ten minutes.
VPRESET=${VPRESET:-qwen3-8b}
VS=$RESULTS/vllm-scale-$VPRESET
VLS="$VL --preset $VPRESET --wave"
VREGION=()
[ "$VPRESET" = qwen3-30b-a3b ] && VREGION=(--region-size 0x1a00000000)  # the weights and the KV cache
if wants vllm-scale-save; then
rm -rf "$VS" && mkdir -p "$VS"
step vls-baseline $VLS --out "$VS/baseline.json"
step vls-save python3 -m foundry run --mode save "${VREGION[@]}" --archive "$VS/save" -- $VLS --out "$VS/save.json"
step vls-inspect python3 -m foundry archive inspect "$VS/save" --json
fi
if wants vllm-scale-load; then
step vls-load python3 -m foundry run --mode load --builder native --archive "$VS/save" -- $VLS --out "$VS/load.json"
step vls-baseline-warm $VL --preset $VPRESET --out "$VS/baseline-warm.json"
step vls-compare python3 recipes/vllm/compare.py "$VS"/baseline.json "$VS"/save.json "$VS"/load.json
step vls-startup python3 recipes/vllm/compare.py "$VS"/baseline-warm.json "$VS"/load.json
fi
if wants vllm-scale-more; then
rm -rf "$VS/save2"
mv "$VS/save" "$VS/save.kept" && mv "$VS/save.json" "$VS/save.json.kept"
step vls-save2 python3 -m foundry run --mode save "${VREGION[@]}" --archive "$VS/save" -- $VLS --out "$VS/save.json"
mv "$VS/save" "$VS/save2" && mv "$VS/save.json" "$VS/save2.json"
mv "$VS/save.kept" "$VS/save" && mv "$VS/save.json.kept" "$VS/save.json"
step vls-compare2 python3 recipes/vllm/compare.py "$VS"/baseline.json "$VS"/save2.json
step vls-diff python3 -m foundry archive diff "$VS/save" "$VS/save2"
step vls-lint python3 -m foundry graph lint "$VS/save" --expect nccl-allreduce=0
fi

# 6g. SGLang speculative decoding and hybrid models (not yet run on the H200 test machine).
# sglang-spec: the standalone draft (recipes/sglang/run.py --preset standalone: the tiny Qwen3
# drafting with its own config, so the drafts are accepted) at SGLang's default graph sets for its
# three runners (target_verify, draft_decode, draft_extend): plain vs SAVE vs SAVE2 vs LOAD, output
# ids, logprobs and per-prompt speculative counts identical, accept rate at least 0.5, SAVE vs SAVE2
# diffed; then plain SGLang with warm JIT caches against the LOAD for the graph phase.
# sglang-spec-more: the drift refusals (another algorithm, number of steps, draft model by path
# and by config), a LOAD skipping the warm-ups (refused: not judged for several model runners) and
# lint. sglang-ngram: n-gram drafts (target_verify only). sglang-hybrid: the 4-layer Qwen3-Next
# (gated delta-net + full attention) the same way, with the state pool's size drift;
# sglang-hybrid-more: its state pool sized from free memory (radix cache on), SAVE and LOAD.
# sglang-mtp: Qwen3-Next drafting with its MTP head (NEXTN). Every model directory lives in
# RESULTS_DIR (model_path is compared). Named only.
specrun() {  # specrun DIR NAME PRESET RECIPE-ARGS...: plain, SAVE, SAVE2 (SAVE's command line), LOAD, diff
    local dir=$1 name=$2 preset=$3; shift 3
    local R=(python3 recipes/sglang/run.py --preset "$preset" --model-dir "$dir/model" "$@")
    done_before "$name-baseline" || { rm -rf "$dir" && mkdir -p "$dir"; }
    step "$name-baseline" "${R[@]}" --out "$dir/baseline.json"
    if done_before "$name-save2"; then step "$name-save2" true; else  # says it is not run again
        step "$name-save2" python3 -m foundry run --mode save --archive "$dir/save" -- "${R[@]}" --out "$dir/save.json"
        mv "$dir/save" "$dir/save2" && mv "$dir/save.json" "$dir/save2.json"
    fi
    step "$name-save" python3 -m foundry run --mode save --archive "$dir/save" -- "${R[@]}" --out "$dir/save.json"
    step "$name-load" python3 -m foundry run --mode load --archive "$dir/save" -- "${R[@]}" --out "$dir/load.json"
    step "$name-diff" python3 -m foundry archive diff "$dir/save" "$dir/save2"
    step "$name-inspect" python3 -m foundry archive inspect "$dir/save"
}
SP=$RESULTS/sgspec
if wants sglang-spec; then
specrun "$SP" sgspec standalone
step sgspec-compare python3 recipes/sglang/compare.py --min-accept-rate 0.5 "$SP"/baseline.json "$SP"/save.json \
    "$SP"/save2.json "$SP"/load.json
# the graph phase, fairly: plain SGLang again now that the JIT caches are warm, then a second LOAD
SPR=(python3 recipes/sglang/run.py --preset standalone --model-dir "$SP/model")
step sgspec-baseline-warm "${SPR[@]}" --out "$SP/baseline-warm.json"
step sgspec-load-warm python3 -m foundry run --mode load --archive "$SP/save" -- "${SPR[@]}" --out "$SP/load-warm.json"
step sgspec-startup python3 recipes/sglang/compare.py "$SP"/baseline-warm.json "$SP"/load-warm.json
fi
if wants sglang-spec-more; then
SPR=(python3 recipes/sglang/run.py --preset standalone --model-dir "$SP/model")
specdrift() {  # specdrift NAME FIELD RECIPE-ARGS...: a LOAD of sglang-spec's archive that must fail naming FIELD
    local name=$1 field=$2; shift 2
    step "sgspec-drift-$name" python3 -m foundry run --mode load --archive "$SP/save" -- "${SPR[@]}" "$@" \
        --out "$SP/drift-$name.json"
    refused "sgspec-drift-$name" "$field" $?
}
rm -rf "$SP/other-draft" && cp -r "$SP/model-draft" "$SP/other-draft"  # the same draft at another path
specdrift algorithm sglang.speculative_algorithm --set speculative_algorithm=NGRAM
specdrift steps sglang.speculative_num_steps --set speculative_num_steps=2 --set speculative_num_draft_tokens=3
specdrift draft-path sglang.speculative_draft_model_path --set "speculative_draft_model_path=$SP/other-draft"
specdrift draft-config sglang.draft_model_config_sha256 --draft-model-set num_hidden_layers=1
step sgspec-drift-skip python3 -m foundry run --mode load --warmup restore --archive "$SP/save" -- "${SPR[@]}" \
    --out "$SP/drift-skip.json"
refused sgspec-drift-skip "not judged for several model runners" $?
step sgspec-lint python3 -m foundry graph lint "$SP/save" --expect nccl-allreduce=0
fi
if wants sglang-ngram; then
specrun "$RESULTS/sgngram" sgngram ngram
step sgngram-compare python3 recipes/sglang/compare.py "$RESULTS"/sgngram/baseline.json "$RESULTS"/sgngram/save.json \
    "$RESULTS"/sgngram/save2.json "$RESULTS"/sgngram/load.json
fi
HY=$RESULTS/sghybrid
if wants sglang-hybrid; then
specrun "$HY" sghybrid qwen3-next
step sghybrid-compare python3 recipes/sglang/compare.py "$HY"/baseline.json "$HY"/save.json "$HY"/save2.json "$HY"/load.json
step sghybrid-drift-pool python3 -m foundry run --mode load --archive "$HY/save" -- python3 recipes/sglang/run.py \
    --preset qwen3-next --model-dir "$HY/model" --set max_mamba_cache_size=16 --out "$HY/drift-pool.json"
refused sghybrid-drift-pool sglang.max_mamba_cache_size $?
fi
if wants sglang-hybrid-more; then
# the radix cache on: SGLang sizes the state pool from free memory (sglang.mamba_cache_size pinned)
HR=(python3 recipes/sglang/run.py --preset qwen3-next --model-dir "$HY/model-radix" --set disable_radix_cache=false)
rm -rf "$HY/radix" && mkdir -p "$HY/radix"
step sghybrid-radix-baseline "${HR[@]}" --out "$HY/radix/baseline.json"
step sghybrid-radix-save python3 -m foundry run --mode save --archive "$HY/radix/save" -- "${HR[@]}" --out "$HY/radix/save.json"
step sghybrid-radix-load python3 -m foundry run --mode load --archive "$HY/radix/save" -- "${HR[@]}" --out "$HY/radix/load.json"
step sghybrid-radix-compare python3 recipes/sglang/compare.py "$HY"/radix/baseline.json "$HY"/radix/save.json "$HY"/radix/load.json
step sghybrid-radix-inspect python3 -m foundry archive inspect "$HY/radix/save" --json
fi
if wants sglang-mtp; then
specrun "$RESULTS/sgmtp" sgmtp qwen3-next-mtp
step sgmtp-compare python3 recipes/sglang/compare.py "$RESULTS"/sgmtp/baseline.json "$RESULTS"/sgmtp/save.json \
    "$RESULTS"/sgmtp/save2.json "$RESULTS"/sgmtp/load.json
fi

# 7. two GPUs: the decoder split over two ranks (torch symmetric memory, then NCCL) and
# the symmetric all-reduce graph, baseline vs SAVE vs SAVE2 vs fresh-process LOADs per rank
if wants tp2 || wants tp2-nccl; then
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
tp_recipe() {  # tp_recipe PREFIX RECIPE-ARGS [FOUNDRY-RUN-ARGS [SHIFT]]: baseline, SAVE2, SAVE, LOADs, comparisons,
    # refusals. SHIFT relocate (default): the LOAD at a shifted base must decode identically; refuse: it must
    # be refused (NCCL's addresses are proven identical, never patched)
    local P=$1 ARGS=$2 FR=${3:-} SHIFT=${4:-relocate} T=$RESULTS/$1
    rm -rf "$T" && mkdir -p "$T"
    local TP="$RUN --world-size 2 --rank @R@ $ARGS"
    local SAVE_RUN="python3 -m foundry run $FR --mode save --rank @R@ --world-size 2 --archive $T/save"
    local LOAD_RUN="python3 -m foundry run $FR --mode load --rank @R@ --archive $T/save"
    ranks $P-baseline "$TP --out $T/baseline.r@R@.json"
    FOUNDRY_SAVE_ID=$P-2 ranks $P-save2 "$SAVE_RUN -- $TP --out $T/save.r@R@.json"
    mv "$T/save" "$T/save2" && for r in 0 1; do mv "$T/save.r$r.json" "$T/save2.r$r.json"; done
    FOUNDRY_SAVE_ID=$P-1 ranks $P-save "$SAVE_RUN -- $TP --out $T/save.r@R@.json"
    ranks $P-load "$LOAD_RUN -- $TP --out $T/load.r@R@.json"
    local shifted=""
    if [ "$SHIFT" = relocate ]; then
        ranks $P-load-shifted "$LOAD_RUN --region-base $SHIFTED -- $TP --out $T/load-shifted.r@R@.json"
        shifted=load-shifted
    else
        RANKS_TIMEOUT=120 ranks $P-load-shifted "$LOAD_RUN --region-base $SHIFTED -- $TP --out $T/load-shifted.r@R@.json"
        refused $P-load-shifted nccl-ipc.region_base $?
    fi
    # the same ranks on swapped GPUs: rank 0 on the second GPU, rank 1 on the first
    CUDA_VISIBLE_DEVICES=1,0 ranks $P-load-swapped "$LOAD_RUN -- $TP --out $T/load-swapped.r@R@.json"
    for r in 0 1; do
        step $P-compare.r$r python3 recipes/torch/compare.py "$T/baseline.r$r.json" "$T/save.r$r.json" \
            "$T/save2.r$r.json" "$T/load.r$r.json" ${shifted:+"$T/$shifted.r$r.json"} "$T/load-swapped.r$r.json"
        step $P-relocations.r$r python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['session'].get('relocations'), indent=1))" "$T/${shifted:-load}.r$r.json"
    done
    step $P-ranks-agree python3 recipes/torch/compare.py "$T/baseline.r0.json" "$T/baseline.r1.json"
    step $P-save-vs-save2 python3 -m foundry archive diff "$T/save" "$T/save2"
    # refusals: each rank given the other's part; one process at world size 1 given the archive
    RANKS_TIMEOUT=120 ranks $P-other-rank "python3 -m foundry run $FR --mode load --rank \$((1-@R@)) --archive $T/save -- $TP --out $T/other-rank.r@R@.json"
    refused $P-other-rank ".rank" $?
    step $P-ws1 timeout 120 python3 -m foundry run $FR --mode load --rank 0 --archive "$T/save" -- $RUN --symm $ARGS --out "$T/ws1.json"
    refused $P-ws1 world_size $?
}
if wants tp2; then
tp_recipe tp2 "--all-reduce symm"
for r in 0 1; do
    step tp2-lint.r$r python3 -m foundry graph lint "$RESULTS/tp2/save" --rank $r --graph 'decode.*' --expect symm-allreduce=4 --expect nccl-allreduce=0
done
# the one-shot and two-shot all-reduce graph at world size 2
S=$RESULTS/symm2; rm -rf "$S" && mkdir -p "$S"
SY="python3 recipes/torch/symm_allreduce.py --world-size 2 --rank @R@"
ranks symm2-baseline "$SY --out $S/baseline.r@R@.json"
FOUNDRY_SAVE_ID=symm2 ranks symm2-save "python3 -m foundry run --mode save --rank @R@ --world-size 2 --archive $S/save -- $SY --out $S/save.r@R@.json"
ranks symm2-load "python3 -m foundry run --mode load --rank @R@ --archive $S/save --region-base $SHIFTED -- $SY --move-buffer --out $S/load.r@R@.json"
for r in 0 1; do
    step symm2-compare.r$r python3 recipes/torch/compare_symm.py "$S/baseline.r$r.json" "$S/save.r$r.json" --moved "$S/load.r$r.json"
done
for r in 0 1; do
    step symm2-lint.r$r python3 -m foundry graph lint "$S/save" --rank $r --expect symm-allreduce=2 --expect nccl-allreduce=0
done
fi
if wants tp2-nccl; then
tp_recipe tp2-nccl "--all-reduce nccl" "--region-threads any" refuse  # NCCL's proxy thread allocates peer buffers
for r in 0 1; do
    step tp2-nccl-lint.r$r python3 -m foundry graph lint "$RESULTS/tp2-nccl/save" --rank $r --graph 'decode.*' --expect nccl-allreduce=4 --expect symm-allreduce=0
done
fi
fi

# 7b. two GPUs: SGLang at --tp-size 2, the qwen3-8b preset at SGLang's default decode set, with
# SGLang's custom all-reduce (TP2_CA=on, its default: the custom-allreduce backend) or without it
# (TP2_CA=off: NCCL's all-reduce through nccl-ipc). sglang-tp2: plain, SAVE2, SAVE, both LOADs,
# the comparison; sglang-tp2-more (needs sglang-tp2's archives): SAVE vs SAVE2, lint per rank, the
# GPUs swapped, and the refusals (each rank given the other's part; the world size changed).
# Lint's count per decode graph, from the model: two all-reduces a layer (after attention and
# after the MLP) and one for the vocabulary-split embedding, 2 x 36 + 1. Not yet run.
if wants sglang-tp2 || wants sglang-tp2-more; then
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
CA=${TP2_CA:-on}
case $CA in on|off) ;; *) echo "TP2_CA must be on or off, not $CA" | tee -a "$SUMMARY"; exit 2 ;; esac
T=$RESULTS/sgtp2-$CA
SGT="$SG --preset qwen3-8b --set tp_size=2"
[ "$CA" = off ] && SGT="$SGT --set disable_custom_all_reduce=true"
FR="--region-threads any"  # NCCL's proxy threads allocate too
SAVE1="python3 -m foundry run $FR --mode save --save-runs 1"  # several ranks: one run (docs/sglang.md)
LOADF="python3 -m foundry run $FR --mode load --warmup restore --builder native --instantiate background"
if [ "$CA" = off ]; then EXPECT=(--expect nccl-allreduce=73 --expect custom-allreduce=0)
else EXPECT=(--expect custom-allreduce=73 --expect nccl-allreduce=0); fi
fi
if wants sglang-tp2; then
rm -rf "$T" && mkdir -p "$T"
step sgtp2-$CA-baseline $SGT --out "$T/baseline.json"
FOUNDRY_SAVE_ID=sgtp2-$CA-2 step sgtp2-$CA-save2 $SAVE1 --archive "$T/save" -- $SGT --out "$T/save.json"
mv "$T/save" "$T/save2" && mv "$T/save.json" "$T/save2.json"
FOUNDRY_SAVE_ID=sgtp2-$CA-1 step sgtp2-$CA-save $SAVE1 --archive "$T/save" -- $SGT --out "$T/save.json"
step sgtp2-$CA-load python3 -m foundry run $FR --mode load --archive "$T/save" -- $SGT --out "$T/load.json"
step sgtp2-$CA-load-fast $LOADF --archive "$T/save" -- $SGT --out "$T/load-fast.json"
step sgtp2-$CA-compare python3 recipes/sglang/compare.py "$T"/baseline.json "$T"/save.json "$T"/save2.json \
    "$T"/load.json "$T"/load-fast.json
fi
if wants sglang-tp2-more; then
step sgtp2-$CA-diff python3 -m foundry archive diff "$T/save" "$T/save2"
for r in 0 1; do
    step sgtp2-$CA-lint.r$r python3 -m foundry graph lint "$T/save" --rank $r --graph 'decode.*' "${EXPECT[@]}"
done
# the GPUs swapped: rank 0 on the second GPU; accepted, the same outputs
CUDA_VISIBLE_DEVICES=1,0 step sgtp2-$CA-load-swapped $LOADF --archive "$T/save" -- $SGT --out "$T/load-swapped.json"
step sgtp2-$CA-compare-swapped python3 recipes/sglang/compare.py "$T"/baseline.json "$T"/load-swapped.json
# each rank given the other's part (the catalog's sessions swapped, re-sealed): refused by field rank
rm -rf "$T/other" && cp -r "$T/save" "$T/other"
if step sgtp2-$CA-swap-ranks python3 recipes/sglang/swap_ranks.py "$T/other"; then
    step sgtp2-$CA-other-rank timeout 300 python3 -m foundry run $FR --mode load --archive "$T/other" -- $SGT \
        --out "$T/other-rank.json"
    refused sgtp2-$CA-other-rank "rank: session belongs to another rank" $?
fi
# the world size changed: the archive of two ranks LOADed by one
step sgtp2-$CA-ws1 timeout 300 python3 -m foundry run $FR --mode load --archive "$T/save" -- $SG --preset qwen3-8b \
    --out "$T/ws1.json"
refused sgtp2-$CA-ws1 "sglang.tp_size" $?
fi

# 8. two GPUs: DeepEP low-latency dispatch and combine (EP=2, NVL buffer over CUDA IPC, no fabric),
# baseline vs SAVE vs SAVE2 vs fresh-process LOAD, 8 replays each checked by the payload oracle
if wants ep2; then
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
E=$RESULTS/ep2; rm -rf "$E" && mkdir -p "$E"
EP="python3 recipes/deepep/ep2.py --rank @R@"
FR="--region-threads any"  # NCCL's and NVSHMEM's helper threads allocate too
# each step needs the one before: stop at the first that fails (a hung SAVE costs RANKS_TIMEOUT)
ep2_steps() {
step ep2-import python3 -c 'import sys; sys.path.insert(0, "recipes/deepep"); import ep2; print(ep2.import_deep_ep().__file__)' || return
ranks ep2-baseline "$EP --out $E/baseline.r@R@.json" || return
export RANKS_TIMEOUT=400  # a SAVE runs each rank twice, each starting NVSHMEM
FOUNDRY_SAVE_ID=ep2-2 ranks ep2-save2 "python3 -m foundry run $FR --mode save --rank @R@ --world-size 2 --archive $E/save -- $EP --out $E/save.r@R@.json" || return
mv "$E/save" "$E/save2" || return
for r in 0 1; do mv "$E/save.r$r.json" "$E/save2.r$r.json" || return; done
FOUNDRY_SAVE_ID=ep2-1 ranks ep2-save "python3 -m foundry run $FR --mode save --rank @R@ --world-size 2 --archive $E/save -- $EP --out $E/save.r@R@.json" || return
ranks ep2-load "python3 -m foundry run $FR --mode load --rank @R@ --archive $E/save -- $EP --out $E/load.r@R@.json" || return
for r in 0 1; do  # the checks run whatever the one before says
    step ep2-compare.r$r python3 recipes/deepep/ep2.py --compare "$E/baseline.r$r.json" "$E/save.r$r.json" \
        "$E/save2.r$r.json" "$E/load.r$r.json"
    step ep2-lint.r$r python3 -m foundry graph lint "$E/save" --rank $r --expect deepep-dispatch=1 --expect deepep-combine=1
done
step ep2-save-vs-save2 python3 -m foundry archive diff "$E/save" "$E/save2"
# each rank given the other's part: refused, naming the Buffer's rank
RANKS_TIMEOUT=120 ranks ep2-other-rank "python3 -m foundry run $FR --mode load --rank \$((1-@R@)) --archive $E/save -- $EP --out $E/other-rank.r@R@.json"
refused ep2-other-rank "deepep-nvl.rank" $?
return 0
}
ep2_steps || echo "ep2: stopped after the first failing step" | tee -a "$SUMMARY"
unset RANKS_TIMEOUT
fi

echo
cat "$SUMMARY"
tail -3 "$RESULTS/compare.log" "$RESULTS/save-vs-save2.log" "$RESULTS/relocations.log" "$RESULTS/compare-neg.log" 2>/dev/null
[ -f "$RESULTS/cold-start.log" ] && tail -8 "$RESULTS/cold-start.log"
exit 0

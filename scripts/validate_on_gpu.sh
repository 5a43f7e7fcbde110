#!/usr/bin/env bash
# Everything Foundry claims about a GPU, in one run on one GPU machine.
#
#   scripts/validate_on_gpu.sh RESULTS_DIR [--quick]
#
# Needs torch with CUDA, cuda-bindings, zstandard, nvcc and this package
# (installed, so its backends' entry points exist) with the native hook built.
# Writes logs and reports under RESULTS_DIR and prints a summary table last; each
# step says which command produced it, for docs/validation.md. --quick skips
# the Qwen3-0.6B cold-start benchmark.
set -uo pipefail
RESULTS=${1:?usage: scripts/validate_on_gpu.sh RESULTS_DIR [--quick]}
QUICK=${2:-}
cd "$(dirname "$0")/.."
mkdir -p "$RESULTS"
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$RESULTS/jit/inductor}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$RESULTS/jit/triton}
SUMMARY=$RESULTS/summary.txt
: > "$SUMMARY"
step() {  # step NAME CMD...: run, log, record the exit code
    local name=$1; shift
    local start=$SECONDS
    "$@" > "$RESULTS/$name.log" 2>&1
    local rc=$?
    printf '%-28s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - start))" "$*" | tee -a "$SUMMARY"
    return $rc
}
RUN="python3 recipes/torch/run.py"
SHIFTED=0x600400000000  # the default base + 16 GiB

# 1. GPU tests (sessions, native builder, relocation, symmetric memory, the hook, lowering)
step gpu-tests python3 -m pytest -m gpu -q -p no:cacheprovider tests/

# 2. the decoder recipe: baseline, two-run SAVE, a second two-run SAVE, LOADs
rm -rf "$RESULTS/a" && mkdir -p "$RESULTS/a"
step baseline $RUN --out "$RESULTS/baseline.json"
step save python3 -m foundry run --mode save --archive "$RESULTS/a/save" -- $RUN --out "$RESULTS/save.json"
step save2 python3 -m foundry run --mode save --archive "$RESULTS/a/save2" -- $RUN --out "$RESULTS/save2.json"
step load python3 -m foundry run --mode load --archive "$RESULTS/a/save" -- $RUN --out "$RESULTS/load.json"
step load-restore python3 -m foundry run --mode load --warmup restore --archive "$RESULTS/a/save" -- $RUN --out "$RESULTS/load-restore.json"
step load-native python3 -m foundry run --mode load --builder native --archive "$RESULTS/a/save" -- $RUN --out "$RESULTS/load-native.json"
step load-shifted python3 -m foundry run --mode load --region-base $SHIFTED --archive "$RESULTS/a/save" -- $RUN --out "$RESULTS/load-shifted.json"
step compare python3 recipes/torch/compare.py "$RESULTS"/baseline.json "$RESULTS"/save.json "$RESULTS"/save2.json "$RESULTS"/load.json \
    "$RESULTS"/load-restore.json "$RESULTS"/load-native.json "$RESULTS"/load-shifted.json
step save-vs-save2 python3 -m foundry archive diff "$RESULTS/a/save" "$RESULTS/a/save2"

# 3. relocation proof: a SAVE at a base 16 GiB higher, compared word by word
step save-shifted python3 -m foundry run --mode save --region-base $SHIFTED --archive "$RESULTS/a/save-shifted" -- $RUN --out "$RESULTS/save-shifted.json"
step relocations python3 -m foundry archive diff --relocations "$RESULTS/a/save" "$RESULTS/a/save-shifted"

# 4. negative control: one parameter word altered
cp -r "$RESULTS/a/save" "$RESULTS/a/neg" && python3 recipes/torch/negative_control.py "$RESULTS/a/neg" > "$RESULTS/neg-edit.log" 2>&1
step load-neg python3 -m foundry run --mode load --archive "$RESULTS/a/neg" -- $RUN --out "$RESULTS/load-neg.json"
step compare-neg python3 recipes/torch/compare.py "$RESULTS"/baseline.json "$RESULTS"/load-neg.json  # must exit 1

# 5. cold start at the Qwen3-0.6B shape
if [ "$QUICK" != "--quick" ]; then
    step cold-start python3 bench/cold_start.py --out "$RESULTS/bench"
fi

echo
cat "$SUMMARY"
tail -3 "$RESULTS/compare.log" "$RESULTS/save-vs-save2.log" "$RESULTS/relocations.log" "$RESULTS/compare-neg.log" 2>/dev/null
[ -f "$RESULTS/cold-start.log" ] && tail -8 "$RESULTS/cold-start.log"
exit 0

#!/usr/bin/env bash
# Build DeepEP from source as a wheel for the torch that runs recipes/deepep/ep2.py.
#
#   recipes/deepep/build_deep_ep.sh DEEPEP_SRC PYTHON NCCL_ROOT [WHEEL_DIR]
#
# DEEPEP_SRC  a DeepEP source tree (the H200 runs used DeepEP at dd758ca, version 2.1.0)
# PYTHON      the interpreter of the target: the same Python and torch as the GPU machine
#             (torch 2.11 with its nvidia-* packages, nvidia-nvshmem-cu13 among them)
# NCCL_ROOT   an NCCL >= 2.30 tree (include/, lib/libnccl.so.2), e.g. the nvidia-nccl-cu13
#             2.30.4 wheel unpacked: DeepEP's elastic backend needs its device API headers
#
# The published sgl-deep-ep wheels are built for torch 2.13-2.15: their extension misreads
# torch 2.11's tensors. Builds for sm_90 (H100/H200). Needs nvcc, and the headers of
# rdma-core (Debian: libibverbs-dev; NVSHMEM's IBGDA header includes mlx5dv.h) and fmt
# (libfmt-dev; DeepEP's third-party/fmt submodule may be absent). No GPU is needed:
# without a libcuda.so to link, an empty stub with its soname is linked (DeepEP calls
# the driver through dlsym).
set -euo pipefail
SRC=$(realpath "${1:?usage: build_deep_ep.sh DEEPEP_SRC PYTHON NCCL_ROOT [WHEEL_DIR]}")
PY=${2:?python of the target}
NCCL=$(realpath "${3:?NCCL >= 2.30 root}")
WHEEL_DIR=$(realpath -m "${4:-$SRC/dist}")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
CUDA_PIP=$SITE/nvidia/cu13/include  # cusparse.h, nvrtc.h, ... where the CUDA install lacks them
[ -f /usr/include/infiniband/mlx5dv.h ] || { echo "need rdma-core headers (libibverbs-dev)" >&2; exit 2; }
[ -d /usr/include/fmt ] || [ -f "$SRC/third-party/fmt/include/fmt/format.h" ] || { echo "need fmt (libfmt-dev)" >&2; exit 2; }
mkdir -p "$SRC/third-party/fmt/include"
if ! ldconfig -p 2>/dev/null | grep 'libcuda.so ' > /dev/null; then  # grep reads it all: no SIGPIPE
    echo "" > "$WORK/stub.c" && gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$WORK/libcuda.so" "$WORK/stub.c"
fi

cd "$SRC"
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=${MAX_JOBS:-$(nproc)}
export PATH=$CUDA_HOME/bin:$PATH CPATH=$CUDA_PIP${CPATH:+:$CPATH}
export LIBRARY_PATH=$NCCL/lib:$WORK${LIBRARY_PATH:+:$LIBRARY_PATH}
export EP_NCCL_ROOT_DIR=$NCCL
"$PY" setup.py bdist_wheel --dist-dir "$WHEEL_DIR"
ls -la "$WHEEL_DIR"

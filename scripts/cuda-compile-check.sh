#!/usr/bin/env bash
# Compile every CUDA kernel (kernels/*.cu) with NVRTC for sm_80, sm_90, sm_90a, sm_100, sm_100a
# and print one line per (kernel, arch): registers, shared memory, stack, spills. No GPU and no
# CUDA toolkit needed: NVRTC comes from pinned PyPI wheels installed into a venv under target/.
# Fails on a compile error or a spilling hot kernel.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/cuda-env.sh
cargo build --release --bin specmla -q
exec target/release/specmla cuda-check "$@"

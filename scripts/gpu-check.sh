#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (<= 8 minutes): every CUDA kernel against the CPU backend on
# deterministic random inputs (tolerances per op), batch invariance of the GEMM and MLA decode
# kernels, and the bf16 GEMV's read bandwidth. Runs from a source tree without models/. Kernels
# come from NVRTC when it loads, else from build/cubins (write them on any machine with
# `scripts/cuda-compile-check.sh --out build/cubins`). Uses target/release/specmla when present
# (carry it to a machine without a Rust toolchain), else builds it.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x target/release/specmla ] || cargo build --release --bin specmla -q
args=()
[ -d build/cubins ] && args+=(--cubin-dir build/cubins)
exec timeout 480 target/release/specmla gpu-check "${args[@]}" "$@"

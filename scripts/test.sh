#!/usr/bin/env bash
# Every test: Rust unit + integration tests (golden logits, bitwise speculation exactness,
# distribution tests, draft swaps, KV property tests, config/weights/tokenizer/sampling), the
# header drift test, then the C (ASan/UBSan/LSan), C++ (GoogleTest/ctest), Go and Node suites
# against the real libspecmla.so, and the CUDA kernels' NVRTC compile check (tests/cuda_compile.rs;
# NVRTC from a pinned PyPI wheel, see scripts/cuda-env.sh). One profile (release) so the library
# is built once.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
echo "== NVRTC for the CUDA kernels' compile check (pinned PyPI wheel; no GPU needed)"
. scripts/cuda-env.sh
echo "== cargo test (release)"
cargo test --release --no-fail-fast --lib --bins --tests -- --test-threads=2
if [ -f Makefile ] && grep -q '^test-bindings:' Makefile; then
  echo "== bindings (C, C++, Go, Node)"
  make test-bindings
fi
echo "== all tests passed"

#!/usr/bin/env bash
# Coverage-guided fuzzing of every outside input (libFuzzer via cargo-fuzz, nightly):
#   scripts/fuzz.sh TARGET SECONDS    one of: config safetensors sharded tokenizer request
#   scripts/fuzz.sh all SECONDS       each target in turn, SECONDS each
# Targets call `specmla::fuzzing::TARGET` (src/fuzzing/). Inputs are read from the scratch corpus
# fuzz/work/TARGET (new finds are written there, kept between runs, never committed), the committed
# seeds fuzz/corpus/TARGET and the committed crash inputs fuzz/regressions/TARGET. Built with
# optimisations, debug assertions, overflow checks and AddressSanitizer. Prints executions, exec/s,
# coverage (cov / ft of libFuzzer's last status line), corpus size and crashes; a crash / OOM /
# timeout input is copied to fuzz/regressions/TARGET/ (commit it: tests/fuzz_replay.rs replays it).
# Exit status 1 when a target crashed. One process, one core: run targets one at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGETS=(config safetensors sharded tokenizer request)
if [ $# -ne 2 ] || ! [[ "$2" =~ ^[0-9]+$ ]]; then
  echo "usage: $0 {${TARGETS[*]// /|}|all} SECONDS" >&2
  exit 2
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== installing cargo-fuzz"
  cargo install cargo-fuzz
fi
if ! rustup toolchain list | grep -q '^nightly'; then
  echo "cargo-fuzz needs a nightly toolchain: rustup toolchain install nightly" >&2
  exit 2
fi
BUILD=(-O -a --codegen-units 16)

# Per-target libFuzzer flags. request: its one engine keeps state across inputs (finished
# requests' counters), so every input allocates more than it frees and libFuzzer's per-input
# leak check would scan the whole heap each time (3x slower); leaks of the C ABI are LSan's job in
# `make test-bindings`.
extra_flags() {
  case "$1" in
    request) echo -detect_leaks=0 ;;
  esac
}

max_len() {
  case "$1" in
    config) echo 4096 ;;
    request) echo 1024 ;;
    *) echo 32768 ;;
  esac
}

run_one() {
  local t="$1" secs="$2"
  local work="fuzz/work/$t" art="fuzz/artifacts/$t" reg="fuzz/regressions/$t"
  local log="fuzz/work/$t.log"
  mkdir -p "$work" "$art" "$reg"
  local dict=()
  [ -f "fuzz/dict/$t.dict" ] && dict=(-dict="fuzz/dict/$t.dict")
  local before
  before=$(ls "$art" | sort)
  echo "== fuzz $t for ${secs}s (log: $log)"
  cargo +nightly fuzz build "${BUILD[@]}" --fuzz-dir fuzz "$t"
  set +e
  cargo +nightly fuzz run "${BUILD[@]}" --fuzz-dir fuzz "$t" \
    "$work" "fuzz/corpus/$t" "$reg" -- \
    -max_total_time="$secs" -max_len="$(max_len "$t")" -timeout=20 -rss_limit_mb=3072 \
    -print_final_stats=1 -artifact_prefix="$art/" "${dict[@]}" $(extra_flags "$t") >"$log" 2>&1
  local rc=$?
  set -e
  local status execs rate cov ft corp
  status=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo "?")
  rate=$(grep -oE 'stat::average_exec_per_sec: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo "?")
  cov=$(grep -oE 'cov: [0-9]+' <<<"$status" | grep -oE '[0-9]+' || echo "?")
  ft=$(grep -oE 'ft: [0-9]+' <<<"$status" | grep -oE '[0-9]+' || echo "?")
  corp=$(ls "$work" | wc -l)
  local new crashes=0
  new=$(comm -13 <(echo "$before") <(ls "$art" | sort) | grep -E '^(crash|oom|timeout|leak|slow-unit)-' || true)
  for f in $new; do
    cp "$art/$f" "$reg/$f"
    crashes=$((crashes + 1))
    echo "   found: $reg/$f"
  done
  if [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ]; then
    echo "   libFuzzer exited with $rc and left no artifact; see $log" >&2
    crashes=1
  fi
  if [ "$crashes" -gt 0 ]; then
    grep -E 'panic at|ERROR: (libFuzzer|AddressSanitizer)|SUMMARY' "$log" | head -5 | sed 's/^/   /'
  fi
  printf '%-12s seconds=%-5s execs=%-9s exec/s=%-6s cov=%-6s ft=%-7s corpus=%-6s crashes=%s\n' \
    "$t" "$secs" "$execs" "$rate" "$cov" "$ft" "$corp" "$crashes"
  [ "$crashes" -eq 0 ]
}

if [ "$1" = all ]; then
  failed=0
  for t in "${TARGETS[@]}"; do
    run_one "$t" "$2" || failed=1
  done
  exit "$failed"
fi
if ! printf '%s\n' "${TARGETS[@]}" | grep -qx "$1"; then
  echo "unknown target $1 (one of: ${TARGETS[*]}, all)" >&2
  exit 2
fi
run_one "$1" "$2"

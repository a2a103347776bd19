#!/usr/bin/env bash
# The main job: speculative generation with a thinking budget on the bundled models.
# Target models/target, draft models/draft (both trained by tools/train, committed), four prompts
# from the held-out workload run as one continuous batch; prints each answer and its counters.
#   scripts/demo.sh [extra `specmla generate` flags, e.g. --reasoning-budget 10 --json]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin specmla
prompts=$(mktemp)
trap 'rm -f "$prompts"' EXIT
head -n 4 models/workload/prompts.txt > "$prompts"
exec target/release/specmla generate \
  --model models/target --draft models/draft --num-draft-tokens 4 \
  --reasoning-budget 40 --max-tokens 160 --prompts-file "$prompts" "$@"

#!/usr/bin/env bash
# The main job: speculative generation with a thinking budget on the bundled models.
# Target models/target, draft models/draft (both trained by tools/train, committed), four held-out
# prompts run as one continuous batch, twice: with a budget of 96 thinking tokens (more than any
# scratchpad needs: the answers should be right) and with a budget of 16 (the end of thinking is
# forced after two steps: the answers become guesses). Prints each answer, its counters and the
# expected answers.
#   scripts/demo.sh [extra `specmla generate` flags, e.g. --json, --adaptive]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin specmla
prompts=$(mktemp)
trap 'rm -f "$prompts"' EXIT
expected="(see the prompts)"
if [ -f models/workload/prompts.jsonl ]; then
  head -n 4 models/workload/prompts.jsonl | sed -E 's/^\{"prompt": "([^"]*)".*$/\1/' > "$prompts"
  expected=$(head -n 4 models/workload/prompts.jsonl | sed -E 's/.*"answer": "([0-9])".*/\1/' | tr '\n' ' ')
else
  cat > "$prompts" <<'P'
<bos>Q: Let x=4. Evaluate mod 10: k+3,l-1,m+2,n-2,o+1<think>
<bos>Q: Start from x=7 and apply mod 10: c-2 d+1 e+3 f-1 g+2 h-3<think>
<bos>Q: With x=0, compute mod 10 in order: p+1, q+2, r-3, s+1<think>
<bos>Q: Given x=9, work out mod 10 the steps a+3,b+3,c-1,d-2,e+1,f+2,g-3<think>
P
  expected="7 7 1 2"
fi
for budget in 96 16; do
  echo "=== thinking budget $budget (target models/target, draft models/draft, k = 4)"
  target/release/specmla generate \
    --model models/target --draft models/draft --num-draft-tokens 4 \
    --reasoning-budget "$budget" --max-tokens 160 --prompts-file "$prompts" "$@"
  echo "=== expected answers, in order: $expected"
done

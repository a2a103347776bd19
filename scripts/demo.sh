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
if [ -f models/workload/prompts.txt ]; then
  head -n 4 models/workload/prompts.txt > "$prompts"
else
  cat > "$prompts" <<'P'
<bos>Q: Let x=4. Evaluate mod 10: k+3,l-1,m+2,n-2,o+1<think>
<bos>Q: Start from x=7 and apply mod 10: c-2 d+1 e+3 f-1 g+2 h-3<think>
<bos>Q: With x=0, compute mod 10 in order: p+1, q+2, r-3, s+1<think>
<bos>Q: Given x=9, work out mod 10 the steps a+3,b+3,c-1,d-2,e+1,f+2,g-3<think>
P
fi
target=models/target; draft=models/draft
[ -f models/target/config.json ] || { target=models/draft; draft=models/draft-weak; }
exec target/release/specmla generate \
  --model "$target" --draft "$draft" --num-draft-tokens 4 \
  --reasoning-budget 40 --max-tokens 160 --prompts-file "$prompts" "$@"

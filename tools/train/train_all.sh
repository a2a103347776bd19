#!/usr/bin/env bash
# Train every bundled model, then check and evaluate them. One command, seeded:
#   tools/train/train_all.sh [python]        (default python: .venv/bin/python)
# The three models train at the same time, one thread each (on a 2-core machine shared with other
# work this beats one 2-thread job at a time). Logs: models/logs/. Wall time: models/train_all.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${1:-.venv/bin/python}"
mkdir -p models/logs
start=$(date +%s)
pids=()
for m in target draft draft-weak; do
  "$PY" tools/train/train.py --model "$m" --threads 1 > "models/logs/$m.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
end=$(date +%s)
echo "{\"train_wall_s\": $((end - start))}" > models/train_all.json
"$PY" tools/train/check_models.py > models/logs/check_models.log 2>&1
"$PY" tools/train/evaluate.py > models/logs/evaluate.log 2>&1
echo "done: models/eval.json"

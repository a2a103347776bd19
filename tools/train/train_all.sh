#!/usr/bin/env bash
# Train every bundled model, then check and evaluate them. One command, seeded:
#   tools/train/train_all.sh [python]        (default python: .venv/bin/python)
# One CPU thread per job (on a shared 2-core machine two 1-thread jobs beat one 2-thread job).
#   stage 1: draft (1000 steps, seed 2) and draft-weak (100 steps, seed 3) side by side;
#   stage 2: the target is upcycled from the trained draft (function-preserving, see
#            train.upcycle_from_draft) and fine-tuned (30 steps, seed 1).
# Logs: models/logs/. Wall time of all training: models/train_all.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${1:-.venv/bin/python}"
T=tools/train/train.py
mkdir -p models/logs
start=$(date +%s)
"$PY" $T --model draft > models/logs/draft.log 2>&1 &
p1=$!
"$PY" $T --model draft-weak > models/logs/draft-weak.log 2>&1 &
p2=$!
wait "$p1"; wait "$p2"
"$PY" $T --model target --init-from models/draft > models/logs/target.log 2>&1
end=$(date +%s)
echo "{\"train_wall_s\": $((end - start))}" > models/train_all.json
"$PY" tools/train/check_models.py > models/logs/check_models.log 2>&1
"$PY" tools/train/evaluate.py > models/logs/evaluate.log 2>&1
"$PY" tools/train/model_card.py
echo "done: models/eval.json"

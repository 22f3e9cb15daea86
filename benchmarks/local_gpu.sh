#!/usr/bin/env bash
# The prepared device run for local target mode (see /work/.library/device/README.md):
#   run(command="bash benchmarks/local_gpu.sh", carry=[".whl"], timeout_s=560)
# where .whl holds the pure-Python wheels the device image lacks:
#   pip download --no-deps -d .whl tenacity respx pytest-asyncio
# Weights cannot travel there, so the models are random-init Qwen2.5 shapes
# built on the GPU; costs are timed (c, v, seconds per round, proposals) and
# speedups projected with ALPHA, the acceptance measured with real weights on
# the CPU (benchmarks/results/local-qwen-0.5b-1.5b-cpu.json), and the trees' reach
# with trained heads on the CPU (benchmarks/local_auto.py's defaults).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-.}
ALPHA=${ALPHA:-0.66}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name())"
# 1. --gamma auto (issue 43), 0.5B -> 1.5B: eager, static, static + CUDA graphs;
#    chain gamma 1..5 and auto, EAGLE and Medusa trees cut by auto; projected
#    at the CPU's acceptance, and the loops at alpha ~ 0 (auto must not lose).
timeout 270 python3 benchmarks/local_auto.py --pair qwen2.5-0.5b qwen2.5-1.5b --device cuda --alpha "$ALPHA" \
    --out "$OUT/local-auto-0.5b-1.5b.json" 2>&1 | tee "$OUT/local-auto-0.5b-1.5b.log" | tail -c 3000 || echo "local_auto failed or timed out"
# 2. The local engine's tests on CUDA (BSPEC_TEST_DEVICE=cuda): chi-square
#    checks on the static and eager engines, auto gamma, rollback, greedy ==
#    plain, seeds, the CLI, the static path's own tests (CUDA graphs there).
BSPEC_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider -W ignore::FutureWarning \
    tests/test_local_engine.py tests/test_local_static.py tests/test_local_auto.py 2>&1 | tee "$OUT/local-engine-tests-cuda.log" | tail -15
# 3. Issue 22's figure if time is left: eager against static + CUDA graphs, 0.5B -> 7B, gamma 1..5.
timeout 110 python3 benchmarks/local_target.py --random-init qwen2.5-0.5b qwen2.5-7b --device cuda --alpha "$ALPHA" --engines eager static+compiled \
    --gammas 1 2 3 4 5 --max-tokens 48 --cost-repeats 3 --out "$OUT/local-cuda-0.5b-7b.json" 2>&1 | tail -30 || echo "0.5b-7b failed or timed out"

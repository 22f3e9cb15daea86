#!/usr/bin/env bash
# The prepared device run for local target mode (see /work/.library/device/README.md):
#   run(command="bash bench/local_gpu.sh", carry=[".whl"], timeout_s=560)
# where .whl holds the pure-Python wheels the device image lacks:
#   pip download --no-deps -d .whl tenacity respx pytest-asyncio
# 1. The local engine's tests on CUDA (BSPEC_TEST_DEVICE=cuda): the 100k-sample
#    chi-square checks on the static and the eager engine, cache rollback,
#    greedy == plain, seeds, the CLI, and the static path's own tests
#    (compiled steps = CUDA graphs there).
# 2. Costs: weights cannot travel there, so the models are random-init Qwen2.5
#    shapes built directly on the GPU; only costs are timed (c, v, seconds per
#    round), and the speedup is projected with ALPHA, the acceptance measured
#    with real weights on the CPU (bench/results/local-qwen-0.5b-1.5b-cpu.json).
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
BSPEC_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider -W ignore::FutureWarning \
    tests/test_local_engine.py tests/test_local_static.py 2>&1 | tee "$OUT/local-engine-tests-cuda.log" | tail -25
# 3. Eager against the static engine with CUDA graphs (issue 22), 0.5B -> 7B
#    first: the figure that matters; gamma 1..5.
for pair in "qwen2.5-0.5b qwen2.5-7b" "qwen2.5-0.5b qwen2.5-1.5b"; do
  name="local-cuda-${pair// /-}"
  timeout 240 python3 bench/local_target.py --random-init $pair --device cuda --alpha "$ALPHA" --engines eager static+compiled \
      --gammas 1 2 3 4 5 --max-tokens 48 --cost-repeats 5 --out "$OUT/$name.json" 2>&1 | tee "$OUT/$name.log" | tail -30 \
      || echo "$name failed or timed out"
done

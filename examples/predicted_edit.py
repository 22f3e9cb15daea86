"""Edit a file through the openai SDK and `bspec serve`, with and without a
prediction (OpenAI's Predicted Outputs) - on a server that has no Predicted
Outputs of its own, such as vLLM or llama.cpp.

    bspec server start vllm --port 8000 &                       # an upstream
    python examples/predicted_edit.py --base-url http://127.0.0.1:8000/v1 [FILE]

The proxy runs in this process (or pass --proxy URL of a running `bspec
serve`).  The same edit is asked three times: directly, through the proxy,
and through the proxy with the file itself as `prediction`; the answers are
compared and the three times printed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from pathlib import Path

import httpx
import openai

from blackbox_spec.bench.workloads import INVENTORY_PY
from blackbox_spec.proxy import Proxy, running


def edit(base_url: str, model: str, code: str, max_tokens: int, predicted: bool) -> tuple[str, float, object]:
    client = openai.OpenAI(base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY", "none"), max_retries=0, timeout=1800)
    messages = [{"role": "user", "content": f"Rename the function `total` to `count_all` everywhere. Reply with the complete file only.\n\n{code}"}]
    extra = {"prediction": {"type": "content", "content": code}} if predicted else {}
    started = time.perf_counter()
    answer = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=max_tokens, **extra)
    return answer.choices[0].message.content or "", time.perf_counter() - started, answer.usage


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", nargs="?", help="the file to edit (default: a small Python module with a `total` method)")
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="the upstream server")
    parser.add_argument("--proxy", help="a running bspec serve (default: start one here)")
    parser.add_argument("--model", help="default: the first model the upstream lists")
    parser.add_argument("--max-tokens", type=int, default=400)
    args = parser.parse_args()
    key = os.environ.get("OPENAI_API_KEY")
    model = args.model or httpx.get(args.base_url + "/models", headers={"authorization": f"Bearer {key}"} if key else {}).json()["data"][0]["id"]
    code = Path(args.file).read_text() if args.file else INVENTORY_PY
    with (contextlib.nullcontext(args.proxy) if args.proxy else running(Proxy(args.base_url, key))) as proxy_url:
        direct, direct_s, _ = edit(args.base_url, model, code, args.max_tokens, predicted=False)
        plain, plain_s, _ = edit(proxy_url, model, code, args.max_tokens, predicted=False)
        predicted, predicted_s, usage = edit(proxy_url, model, code, args.max_tokens, predicted=True)
    print(predicted)
    details = getattr(usage, "completion_tokens_details", None)
    kept = f"; prediction tokens accepted {details.accepted_prediction_tokens}, rejected {details.rejected_prediction_tokens}" if details else ""
    print(f"\ndirect {direct_s:.2f} s; through bspec serve {plain_s:.2f} s; with the file as prediction {predicted_s:.2f} s{kept}")
    same = direct == plain == predicted
    print(f"same answer all three times: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())

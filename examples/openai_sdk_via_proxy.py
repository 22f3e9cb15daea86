"""An unchanged openai SDK application, made faster by `bspec serve`.

    bspec server start vllm &                                   # an upstream
    bspec serve --base-url http://127.0.0.1:8000/v1 &           # the proxy, port 8100
    python examples/openai_sdk_via_proxy.py --proxy http://127.0.0.1:8100/v1

Without --proxy, this example starts the proxy itself, in a thread, in front
of --base-url.  It sends the same chat request directly and through the
proxy, and shows that the answers are the same, how long each took, the
x-bspec header and what /metrics says.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from pathlib import Path

import httpx
import openai

from blackbox_spec.proxy import Proxy, running

HERE = Path(__file__).parent


def ask(base_url: str, model: str, messages: list[dict], max_tokens: int) -> tuple[str, float, str]:
    client = openai.OpenAI(base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY", "none"), max_retries=0)
    started = time.perf_counter()
    raw = client.chat.completions.with_raw_response.create(model=model, messages=messages, temperature=0, max_tokens=max_tokens)
    return raw.parse().choices[0].message.content, time.perf_counter() - started, raw.headers.get("x-bspec", "(direct)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="the upstream server")
    parser.add_argument("--proxy", help="a running bspec serve (default: start one here)")
    parser.add_argument("--model", help="default: the first model the upstream lists")
    parser.add_argument("--max-tokens", type=int, default=200)
    args = parser.parse_args()
    key = os.environ.get("OPENAI_API_KEY")  # the upstream's, if it wants one; the proxy uses it too
    model = args.model or httpx.get(args.base_url + "/models", headers={"authorization": f"Bearer {key}"} if key else {}).json()["data"][0]["id"]
    code = (HERE / "prompts" / "edit.txt").read_text()
    messages = [{"role": "user", "content": f"Add type hints to this code. Reply with the code only.\n\n{code}"}]
    with (contextlib.nullcontext(args.proxy) if args.proxy else running(Proxy(args.base_url, key))) as proxy_url:
        direct, direct_s, _ = ask(args.base_url, model, messages, args.max_tokens)
        proxied, proxied_s, how = ask(proxy_url, model, messages, args.max_tokens)
        metrics = httpx.get(proxy_url.removesuffix("/v1") + "/metrics").json()
    print(proxied)
    print(f"\ndirect {direct_s:.2f} s, through bspec serve {proxied_s:.2f} s; x-bspec: {how}")
    print(f"same answer: {'yes' if proxied == direct else 'NO'}; proxy metrics: {metrics['speculated']} speculated, "
          f"{metrics['decode_steps_saved']} decoding steps saved, acceptance {metrics['acceptance_rate']}")
    return 0 if proxied == direct else 1


if __name__ == "__main__":
    raise SystemExit(main())

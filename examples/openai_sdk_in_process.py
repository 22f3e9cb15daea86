"""An openai SDK application made faster with one line: the SDK's own
http_client, from blackbox_spec.sdk.  No proxy to run, no port.

    python examples/openai_sdk_in_process.py --base-url http://127.0.0.1:8000/v1

It asks the same chat question with a plain client and with the wrapped
one (sync, then async, streamed), and shows that the answers are the same
and how long each took.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path

import openai

from blackbox_spec.sdk import speculative

HERE = Path(__file__).parent


def timed_sync(client: openai.OpenAI, request: dict) -> tuple[str, float, str]:
    started = time.perf_counter()
    raw = client.chat.completions.with_raw_response.create(**request)
    return raw.parse().choices[0].message.content, time.perf_counter() - started, raw.headers.get("x-bspec", "(direct)")


async def streamed(client: openai.AsyncOpenAI, request: dict) -> str:
    stream = await client.chat.completions.create(**request, stream=True)
    return "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="the server (any OpenAI-compatible API)")
    parser.add_argument("--model", help="default: the first model the server lists")
    parser.add_argument("--max-tokens", type=int, default=200)
    args = parser.parse_args()
    plain = openai.OpenAI(base_url=args.base_url, api_key=os.environ.get("OPENAI_API_KEY", "none"), max_retries=0)
    fast = speculative(plain)  # the one line
    model = args.model or plain.models.list().data[0].id
    code = (HERE / "prompts" / "edit.txt").read_text()
    request = {"model": model, "temperature": 0, "max_tokens": args.max_tokens,
               "messages": [{"role": "user", "content": f"Add type hints to this code. Reply with the code only.\n\n{code}"}]}
    direct, direct_s, _ = timed_sync(plain, request)
    wrapped, wrapped_s, how = timed_sync(fast, request)
    async_text = asyncio.run(streamed(speculative(openai.AsyncOpenAI(base_url=args.base_url, api_key=plain.api_key)), request))
    print(wrapped)
    print(f"\nplain {direct_s:.2f} s, wrapped {wrapped_s:.2f} s ({direct_s / wrapped_s:.2f}x); x-bspec: {how}")
    same = wrapped == direct == async_text
    print(f"same answer (sync, async streamed): {'yes' if same else 'NO'}")
    fast.close()
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())

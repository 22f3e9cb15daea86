"""LangChain's ChatOpenAI with speculation: its own ``http_client`` and
``http_async_client`` arguments take the wrapped httpx clients.

    pip install 'blackbox-spec[langchain]'
    python examples/langchain_in_process.py --base-url http://127.0.0.1:8000/v1 --model qwen
"""

from __future__ import annotations

import argparse
import asyncio
import os

from langchain_openai import ChatOpenAI

from blackbox_spec.sdk import async_http_client, http_client


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="the server (any OpenAI-compatible API)")
    parser.add_argument("--model", required=True, help="the server's model name")
    parser.add_argument("--max-tokens", type=int, default=100, help="the answer's length at most")
    args = parser.parse_args()
    key = os.environ.get("OPENAI_API_KEY", "none")
    settings = dict(model=args.model, base_url=args.base_url, api_key=key, temperature=0, max_tokens=args.max_tokens)
    fast = ChatOpenAI(**settings, http_client=http_client(args.base_url), http_async_client=async_http_client(args.base_url))
    question = "Repeat this list exactly: alpha, beta, gamma, delta, epsilon, zeta, eta, theta."
    sync_text = fast.invoke(question).content
    async_text = asyncio.run(fast.ainvoke(question)).content
    plain = ChatOpenAI(**settings).invoke(question).content
    print(sync_text)
    same = sync_text == async_text == plain
    print(f"same answer as plain ChatOpenAI (sync, async): {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())

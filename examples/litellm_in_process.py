"""LiteLLM with speculation: hand litellm.completion a wrapped openai
client (its documented ``client=`` argument for OpenAI-compatible servers).

    pip install 'blackbox-spec[litellm]'
    python examples/litellm_in_process.py --base-url http://127.0.0.1:8000/v1 --model qwen
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of the price list at import

import litellm  # noqa: E402
import openai  # noqa: E402

from blackbox_spec.sdk import speculative  # noqa: E402


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="the server, as LiteLLM's api_base")
    parser.add_argument("--model", required=True, help="the server's model name")
    parser.add_argument("--max-tokens", type=int, default=100, help="max_tokens of both calls")
    return parser.parse_args()


def main() -> int:
    args = arguments()
    key = os.environ.get("OPENAI_API_KEY", "none")
    client = speculative(openai.OpenAI(base_url=args.base_url, api_key=key))
    messages = [{"role": "user", "content": "Repeat this list exactly: alpha, beta, gamma, delta, epsilon, zeta, eta, theta."}]
    ask = dict(model=f"openai/{args.model}", messages=messages, temperature=0, max_tokens=args.max_tokens, api_base=args.base_url, api_key=key)
    fast = litellm.completion(**ask, client=client).choices[0].message.content
    plain = litellm.completion(**ask).choices[0].message.content
    print(fast)
    print(f"same answer as plain litellm: {'yes' if fast == plain else 'NO'}")
    return 0 if fast == plain else 1


if __name__ == "__main__":
    raise SystemExit(main())

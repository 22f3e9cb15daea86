"""The async client against a vLLM server: stream an edit, see what it cost.

    bspec server start vllm &          # or any running vLLM: vllm serve MODEL
    python examples/vllm_client.py --base-url http://127.0.0.1:8000/v1

vLLM offers everything the client can use: logprobs while streaming (side
branches next to the plain stream) and prompt logprobs with ``echo`` (one
call checks a whole draft).  The client measures both on the server and
picks per draft; the text is what ``temperature=0`` alone returns.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from blackbox_spec import BlackboxSpecError, SpecClient

HERE = Path(__file__).parent


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", help="default: the first model the server lists")
    parser.add_argument("--prompt-file", default=str(HERE / "prompts" / "edit.txt"))
    parser.add_argument("--max-tokens", type=int, default=200)
    args = parser.parse_args()
    prompt = Path(args.prompt_file).read_text()
    try:
        async with SpecClient(args.base_url, model=args.model) as client:
            stream = client.stream(prompt, max_tokens=args.max_tokens)
            async for piece in stream:
                # piece.drafted: the text came in through an accepted draft
                print(f"\x1b[32m{piece}\x1b[0m" if piece.drafted else piece, end="", flush=True)
            stats = stream.result.stats
            caps = client.capabilities
    except BlackboxSpecError as exc:
        print(f"\nerror: {exc}")
        return 1
    print(f"\n\nserver: echo {'yes' if caps.echo else 'no'}, logprobs {'yes' if caps.logprobs else 'no'}")
    print(f"{stats.output_tokens} tokens in {stats.wall_s:.2f}s, {stats.target_calls} calls, "
          f"{stats.mean_accepted_per_round:.1f} tokens per round, rounds by strategy {stats.strategy_rounds}")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))

"""The async client against llama.cpp's llama-server.

    llama-server -m qwen2.5-coder-0.5b-instruct-q8_0.gguf --port 8080 --parallel 4
    python examples/llama_cpp_client.py --base-url http://127.0.0.1:8080/v1

llama-server returns logprobs while streaming but refuses ``echo``, so the
probe finds one way to verify: side branches, extra streams at draft
offsets next to the plain one, which need ``--parallel`` slots to run at
once.  A draft that misses costs only the slower steps while its branches
lived, so free-form text stays near plain speed.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from blackbox_spec import BlackboxSpecError, SpecClient

HERE = Path(__file__).parent


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    parser.add_argument("--model", help="default: the first model the server lists")
    parser.add_argument("--prompt-file", default=str(HERE / "prompts" / "edit.txt"))
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--width", type=int, default=4, help="streams at once: the server's --parallel slots")
    args = parser.parse_args()
    prompt = Path(args.prompt_file).read_text()
    try:
        async with SpecClient(args.base_url, model=args.model, fanout_width=args.width) as client:
            caps = await client.probe()
            print(f"echo: {'yes' if caps.echo else 'refused'}, logprobs: {'yes' if caps.logprobs else 'no'}, "
                  f"round trip {caps.round_trip_s * 1000:.0f} ms")
            result = await client.generate(prompt, max_tokens=args.max_tokens)
    except BlackboxSpecError as exc:
        print(f"error: {exc}")
        return 1
    print(result.text)
    s = result.stats
    print(f"\n{s.output_tokens} tokens in {s.wall_s:.2f}s; jumps onto side branches: {s.jumps}; "
          f"calls: {s.target_calls} ({s.cancelled_calls} closed early)")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))

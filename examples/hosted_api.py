"""The async client against a hosted OpenAI-compatible API.

    export OPENAI_BASE_URL=https://api.example.com/v1 OPENAI_API_KEY=sk-...
    python examples/hosted_api.py --model some-completions-model

Settings come from the same environment variables the openai SDK reads.
The server needs the legacy ``/v1/completions`` endpoint; with logprobs the
client can verify drafts, without them it decodes plainly (and says so in
``stats.notes``) rather than guess.  Rate limits (429, with Retry-After) and
5xx are retried with backoff; a round that still fails resumes from the text
already confirmed.  The key is never printed, not even in errors.
"""

from __future__ import annotations

import argparse
import asyncio

from blackbox_spec import BlackboxSpecError, RetryPolicy, SpecClient


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", help="default: $OPENAI_BASE_URL")
    parser.add_argument("--model", help="default: the first model the server lists")
    parser.add_argument("--max-tokens", type=int, default=120)
    args = parser.parse_args()
    document = "\n".join(f"- item {k}: owner alice, due 2026-12-{k + 1:02d}, status open" for k in range(12))
    prompt = f"Rewrite the list below with every status set to closed.\n\n{document}\n\nRewritten:\n"
    try:
        async with SpecClient(args.base_url, model=args.model, retries=RetryPolicy(attempts=6, max_total_wait_s=60)) as client:
            result = await client.generate(prompt, max_tokens=args.max_tokens)
    except BlackboxSpecError as exc:
        print(f"error: {exc}")  # never holds the key
        if exc.partial is not None:
            print(f"(kept {len(exc.partial.text)} characters already confirmed)")
        return 1
    print(result.text)
    s = result.stats
    print(f"\n{s.output_tokens} tokens in {s.wall_s:.2f}s, {s.target_calls} calls, {s.retries} retried; {s.bill_summary()}")
    for note in s.notes:
        print("note:", note)
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))

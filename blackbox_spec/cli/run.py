"""``bspec run``: the continuation of a prompt through an OpenAI-compatible
API, streamed as it is confirmed (a batch of prompts: :mod:`.batch`; the
target run here: :mod:`.run_local`)."""

from __future__ import annotations

import argparse
import json
import sys

from .._exceptions import ConfigurationError, PromptError
from .._render import LEGEND, Renderer, isatty, use_color
from .._stats import GenerationResult
from .api_client import _client, _load_drafter
from .batch import _run_batch
from .common import (HEAD_KINDS, MAX_COST_HELP, PRICE_HELP, _add_drafter_arguments, _add_profile_argument, _max_cost, _non_negative_int,
                     _positive_int, _price, read_prompt)
from .output import _json_object, _summary
from .run_local import LOCAL_ONLY, _add_local_arguments

RUN_EXAMPLES = """\
examples:
  bspec run prompt.txt --base-url http://127.0.0.1:8000/v1 --model qwen
  bspec run prompt.txt --drafter none            # plain decoding, the baseline
  bspec run prompt.txt --drafter suffix          # suffix automaton over the text
  bspec run prompt.txt --drafter llama --draft-model qwen-0.5b.gguf   # a small local model
  bspec run prompt.txt --strategy fanout --json  # force one verification strategy
  cat prompt.txt | bspec run -                   # prompt from standard input
  bspec run a.txt b.txt prompts.jsonl --concurrency 16 > results.jsonl   # a batch: one JSON line each
  bspec run prompt.txt > out.txt                 # text to the file, a live status line on the terminal
  bspec run prompt.txt --color never             # no colour (also: NO_COLOR=1); green = from accepted drafts
  bspec run prompt.txt --local --target-model qwen-1.5b/ --draft-model qwen-0.5b/ --temperature 0.7 --seed 1

The output is exactly what a plain temperature-0 call to the same server
returns.  OPENAI_BASE_URL and OPENAI_API_KEY are read when the flags are not
given, as the openai SDK does.  With --local both models run here
(transformers) and the output is sampled exactly from the target's
distribution at any temperature.
"""


def _add_run_parser(commands) -> None:
    run = commands.add_parser(
        "run",
        help="generate a continuation of a prompt file, speculatively",
        description="Generate the continuation of PROMPT_FILE with speculative decoding.",
        epilog=RUN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument(
        "prompt_files", nargs="+", metavar="PROMPT_FILE",
        help="UTF-8 text file with the prompt ('-' reads standard input); several files, or a .jsonl file of "
        '{"prompt": ..., "id"?, "max_tokens"?, "stop"?} lines, run as a batch that prints one JSON line per prompt',
    )
    run.add_argument("--base-url", help="OpenAI-compatible API root, e.g. http://127.0.0.1:8000/v1 (default: $OPENAI_BASE_URL)")
    run.add_argument("--api-key", help="API key (default: $OPENAI_API_KEY); never printed")
    run.add_argument("--model", help="model name (default: the first one the server lists)")
    run.add_argument("--max-tokens", type=_positive_int, default=256, metavar="N", help="most target tokens to generate (default: 256)")
    run.add_argument("--stop", nargs="+", default=None, metavar="S", help="stop sequences; the text ends before the first one")
    _add_drafter_arguments(run, local=True)
    run.add_argument(
        "--strategy", choices=["auto", "logprobs", "echo", "fanout", "plain"], default="auto",
        help="verification: auto (measure and choose), logprobs/echo (one call from prompt logprobs), fanout (concurrent calls), plain",
    )
    _add_profile_argument(run)
    run.add_argument("--fanout-width", type=_positive_int, default=16, metavar="W", help="most concurrent streams (side branches + the main one), or requests per round with --strategy fanout; narrower widths are measured first (default: 16)")
    run.add_argument("--timeout", type=float, default=600.0, metavar="S", help="seconds to wait for one server response (default: 600)")
    run.add_argument("--retries", type=_non_negative_int, default=5, metavar="N", help="retries of a call after a 429, 408, 409, 5xx, timeout or reset, waiting as the server's Retry-After says or with jittered exponential backoff (at most 30 s each, 120 s in all); 0 turns them off (default: 5)")
    run.add_argument("--concurrency", type=_positive_int, default=8, metavar="N", help="batch: generations at once (default: 8)")
    run.add_argument("--max-in-flight", type=_positive_int, default=64, metavar="N", help="most HTTP requests in flight at once, over all generations and their branches (default: 64)")
    run.add_argument("--chat", action="store_true", help="use /v1/chat/completions: PROMPT_FILE is the user's message, or a JSON list of {role, content} messages; the answer equals a plain chat call's")
    run.add_argument("--system", metavar="TEXT", help="with --chat: a system message before the user's")
    run.add_argument("--continue-final", action="store_true", help="with --chat: a conversation that ends with an assistant message has that message continued (with speculation, where the server can prefill); without it the messages are sent as they are and decoded plainly, as servers differ on them")
    run.add_argument("--prediction", metavar="FILE", help="the text the answer is expected to be much like (the file being edited), as OpenAI's Predicted Outputs: "
                     "drafted from first, here (the answer stays the plain call's); the stats report the prediction tokens accepted and rejected")
    run.add_argument("--prediction-mode", choices=["auto", "local", "server"], default="auto", help="where --prediction is used: local = drafted from here; "
                     "server = sent as `prediction` to an API that speculates on it itself (OpenAI's gpt-4o/4.1), the turn decoded plainly here (--chat only); "
                     "auto = sent where a probe shows the server uses predictions itself (its usage counts predicted tokens; probed once per server, kept in the profile), else drafted here (default: auto)")
    run.add_argument("--price", type=_price, metavar="PRICES", help=PRICE_HELP)
    run.add_argument("--max-cost", type=_max_cost, default="auto", metavar="R", help=MAX_COST_HELP)
    run.add_argument("--json", action="store_true", help="print one JSON object with text and stats instead of streaming")
    run.add_argument("--quiet", action="store_true", help="do not print the stats line on stderr")
    run.add_argument("--color", choices=["auto", "always", "never"], default="auto", help="colour text confirmed from accepted drafts green: auto = on a terminal unless NO_COLOR is set (default: auto)")
    run.add_argument("--no-color", action="store_true", help="same as --color never")
    run.add_argument("--progress", action="store_true", help="a live status line on stderr even when it is not a terminal (default: on when stderr is a terminal and the text goes elsewhere)")
    _add_local_arguments(run)


def _check_mode(args: argparse.Namespace) -> None:
    """Options of the other mode are a one-line error, not silently ignored."""
    if args.local:
        if args.stop is not None:
            raise ConfigurationError("--stop is not supported with --local (the text ends at the model's end token or --max-tokens)")
        for name in ("base_url", "api_key", "model"):
            if getattr(args, name) is not None:
                raise ConfigurationError(f"--{name.replace('_', '-')} is for the API mode; with --local the target runs here (--target-model)")
        if args.target_model is None:
            raise ConfigurationError("--local needs --target-model PATH (a transformers folder)")
        if args.drafter not in (None, "hf", "none", *HEAD_KINDS):
            raise ConfigurationError(f"--local drafts with a transformers model (--draft-model DIR) or heads (--drafter medusa|eagle --heads DIR); "
                                     f"--drafter {args.drafter} is for the API mode")
        if args.engine == "eager" and args.compile == "on":
            raise ConfigurationError("--compile on compiles the static engine's steps; --engine eager runs transformers' own forward (leave one out)")
        if args.drafter in HEAD_KINDS or args.heads is not None:
            if args.drafter not in HEAD_KINDS or args.heads is None or args.draft_model:
                raise ConfigurationError("trained heads draft with --drafter medusa|eagle --heads DIR (and no --draft-model)")
            if args.gamma not in (None, "auto"):
                raise ConfigurationError("--gamma K is the draft model's tokens per round; heads draft a tree, whose depth --gamma auto chooses (leave --gamma out)")
            return
        if args.drafter == "none" and args.draft_model:
            raise ConfigurationError("--drafter none samples from the target alone; leave out --draft-model")
        if args.drafter != "none" and not args.draft_model:
            raise ConfigurationError("--local needs --draft-model DIR (sharing the target's tokenizer), or --drafter none for plain sampling")
        return
    if not args.chat and (args.system is not None or args.continue_final):
        raise ConfigurationError("--system and --continue-final need --chat")
    if not args.chat and args.prediction_mode == "server":
        raise ConfigurationError("--prediction-mode server needs --chat (Predicted Outputs is a chat API field)")
    if args.prediction is not None and (len(args.prompt_files) > 1 or args.prompt_files[0].endswith(".jsonl")):
        raise ConfigurationError("--prediction is for one prompt file, not a batch")
    if args.chat and (len(args.prompt_files) > 1 or args.prompt_files[0].endswith(".jsonl")):
        raise ConfigurationError("--chat takes one prompt file (batches are completions prompts); run one bspec run --chat per conversation")
    if args.drafter in HEAD_KINDS:
        raise ConfigurationError(f"--drafter {args.drafter} needs --local: heads read the target's hidden states, which an API does not show")
    given = [f"--{name.replace('_', '-')}" for name in LOCAL_ONLY if getattr(args, name) is not None]
    if given:
        raise ConfigurationError(f"{' '.join(given)} {'needs' if len(given) == 1 else 'need'} --local: the API mode is exact greedy decoding (temperature 0)")


async def _run(args: argparse.Namespace, result_box: list[GenerationResult]) -> int:
    if len(args.prompt_files) > 1 or args.prompt_files[0].endswith(".jsonl"):
        return await _run_batch(args)
    prompt = read_prompt(args.prompt_files[0])
    prediction = read_prompt(args.prediction) if args.prediction else None
    async with _client(args) as client:
        await _load_drafter(args, client)
        if args.chat:
            stream = client.stream_chat(chat_messages(prompt, args.system), max_tokens=args.max_tokens, stop=args.stop, prediction=prediction,
                                        continue_final=args.continue_final)
        else:
            stream = client.stream(prompt, max_tokens=args.max_tokens, stop=args.stop, prediction=prediction)
        result_box.append(stream.result)
        render = _renderer(args)
        try:
            async for piece in stream:
                render.piece(piece)
        finally:
            render.finish()
        result = stream.result
        if args.json:
            print(json.dumps(_json_object(result, client.model), ensure_ascii=False))
        else:
            sys.stdout.write("\n")
            if not args.quiet:
                legend = f" ({LEGEND})" if render.color and render.drafted_chars else ""
                print(_summary(result) + legend, file=sys.stderr)
    return 0


def chat_messages(text: str, system: str | None = None) -> list[dict]:
    """A prompt file as chat messages: a JSON list of {role, content} objects
    as it is, any other text as one user message."""
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            messages = json.loads(text)
        except ValueError as exc:
            raise PromptError(f"the prompt looks like a JSON list of messages but is not valid JSON: {exc}") from None
        if system is not None:
            messages = [{"role": "system", "content": system}] + messages
        return messages
    return ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": text}]


def _renderer(args: argparse.Namespace) -> Renderer:
    """Colour for a terminal (``--color``, ``NO_COLOR``); a live status line
    on stderr when the text goes elsewhere (a file, a pipe, ``--json``)."""
    color = not args.json and use_color("never" if args.no_color else args.color, sys.stdout)
    progress = args.progress or (not args.quiet and isatty(sys.stderr) and (args.json or not isatty(sys.stdout)))
    return Renderer(color=color, progress=progress, show_text=not args.json)


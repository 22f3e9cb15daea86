"""``bspec run --local``: both models run here (transformers), sampling
exactly from the target's distribution at any temperature."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .._exceptions import ConfigurationError
from .._stats import GenerationResult, GenerationStats
from .common import HEAD_KINDS, _gamma, _log, _non_negative_float, _non_negative_int, _probability, read_prompt
from .output import _json_object, _summary

LOCAL_ONLY = ("temperature", "top_p", "top_k", "seed", "device", "gamma", "dtype", "target_model", "heads", "engine", "compile")


def _add_local_arguments(parser: argparse.ArgumentParser) -> None:
    local = parser.add_argument_group("local target mode (--local): both models run here, sampling at any temperature")
    local.add_argument("--local", action="store_true", help="run the target here with transformers (full speculative sampling, distribution-exact) instead of calling an API")
    local.add_argument("--target-model", metavar="PATH", help="the target: a transformers folder (a .gguf converts with `bspec server prepare vllm`)")
    local.add_argument("--temperature", type=_non_negative_float, metavar="T", help="sampling temperature; 0 is greedy (default: 1.0)")
    local.add_argument("--top-p", type=_probability, metavar="P", help="keep the most likely tokens up to this mass (default: 1.0, off)")
    local.add_argument("--top-k", type=_non_negative_int, metavar="K", help="keep the K most likely tokens (default: 0, off)")
    local.add_argument("--seed", type=int, metavar="S", help="seed for reproducible samples (default: random)")
    local.add_argument("--device", choices=["cpu", "cuda"], help="where both models run (default: cpu)")
    local.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], help="weights' type (default: auto = float32 on cpu, bfloat16 on cuda)")
    local.add_argument("--heads", metavar="DIR", help="heads for --drafter medusa or eagle, trained for this target by `bspec heads train "
                                                     "--kind KIND` (refused for any other target)")
    local.add_argument("--gamma", type=_gamma, metavar="K|auto", help="draft tokens per round, the paper's γ (default: auto: each round takes the γ, 0 = plain "
                       "decoding, with the best expected speed from this machine's measured step costs and the acceptance seen so far; with heads, the tree's depth); "
                       "a fixed K replays a seed anywhere, auto on the same stored costs")
    local.add_argument("--engine", choices=["auto", "static", "eager"], help="how the models run: static = a static KV cache and fixed-shape steps "
                       "(Qwen2/Llama decoders), eager = transformers' own forward and cache (any causal LM); default: auto = static where it can")
    local.add_argument("--compile", choices=["auto", "on", "off"], help="torch.compile the static engine's steps (CUDA graphs on a GPU; the first "
                       "call compiles for a minute or more); default: auto = on with --device cuda, off on CPU, where it did not pay")


def _run_local(args: argparse.Namespace, result_box: list[GenerationResult]) -> int:
    from ..local import LocalSpeculator, SamplingParams
    from ..local.engine import DEFAULT_GAMMA

    if len(args.prompt_files) > 1 or args.prompt_files[0].endswith(".jsonl"):
        raise ConfigurationError("--local runs one prompt file at a time")
    prompt = read_prompt(args.prompt_files[0])
    try:
        sampling = SamplingParams(
            temperature=1.0 if args.temperature is None else args.temperature,
            top_k=args.top_k or 0, top_p=1.0 if args.top_p is None else args.top_p,
        )
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    if not args.quiet:
        helper = f" and {args.draft_model}" if args.draft_model else f" and heads {args.heads}" if args.heads else ""
        _log(f"loading {args.target_model}{helper} (seconds to minutes)")
    speculator = LocalSpeculator.from_pretrained(
        args.target_model, args.draft_model if args.drafter not in ("none", *HEAD_KINDS) else None,
        device=args.device or "cpu", dtype=args.dtype or "auto", gamma=args.gamma or DEFAULT_GAMMA, heads_path=args.heads, heads_kind=args.drafter,
        engine=args.engine or "auto", compile={"on": True, "off": False}.get(args.compile or "auto"), progress=None if args.quiet else _log,
    )
    shown = GenerationResult(text="", stats=GenerationStats())
    result_box.append(shown)  # what was printed survives an interrupt

    def on_text(piece: str) -> None:
        shown.text += piece
        if not args.json:
            sys.stdout.write(piece)
            sys.stdout.flush()

    result = speculator.generate(prompt, max_tokens=args.max_tokens, sampling=sampling, seed=args.seed, on_text=on_text)
    result_box[0] = result
    name = Path(args.target_model).name
    if args.json:
        data = _json_object(result, name)
        data["stats"]["local"] = result.local.to_dict()  # type: ignore[attr-defined]
        print(json.dumps(data, ensure_ascii=False))
    else:
        sys.stdout.write("\n")
        if not args.quiet:
            local = result.local  # type: ignore[attr-defined]
            measure = f"{local.tokens_per_target_forward:.2f} tokens per target forward" if args.heads else f"alpha {local.alpha:.2f}"
            print(_summary(result) + f", {measure}, engine {local.engine}" + _auto_summary(local), file=sys.stderr)
    return 0


def _auto_summary(local: Any) -> str:
    """What --gamma auto chose and why, for the summary line."""
    auto = local.auto
    if not auto.get("gamma_rounds") and not auto.get("depth_rounds"):
        return ""
    kind, chosen = ("depth", auto["depth_rounds"]) if "depth_rounds" in auto else ("gamma", auto["gamma_rounds"])
    rounds = ", ".join(f"{k} x{n}" for k, n in chosen.items())
    why = f"alpha ~{auto['alpha_estimate']:.2f}, " if "alpha_estimate" in auto else ""
    return (f"; {kind} auto: {rounds} rounds ({why}c {auto['c']:.2f}, v {auto['v']:.2f}: expected {auto['expected_speedup']:.2f}x plain; "
            f"costs {auto['costs']})")

"""``bspec heads train``: Medusa or EAGLE heads for local target mode,
trained on the target's own continuations of an offline corpus
(:mod:`blackbox_spec.local.train_heads` does the work)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .._exceptions import PromptError
from .common import HEAD_KINDS, _positive_int


def _add_heads_parser(commands) -> None:
    heads = commands.add_parser(
        "heads", help="train Medusa or EAGLE heads for local target mode (self-distillation, CPU or GPU)",
        description="Train heads on a target's own greedy continuations of an offline corpus (Python standard-library "
        "sources, chat instructions about them, and prose instructions; the bench prompts are left out, since heads are "
        "measured on them). Continuations and hidden states are cached in OUT; a run resumes from OUT's checkpoint.",
    )
    heads.add_argument("action", choices=["train"], help="train: make (or resume) a heads folder")
    heads.add_argument("--target", required=True, metavar="DIR", help="the target's transformers folder (a .gguf converts to one with `bspec server prepare vllm --model NAME`)")
    heads.add_argument("--kind", choices=HEAD_KINDS, default="medusa",
                       help="medusa: K heads on the last hidden state; eagle: one decoder layer drafting the target's features (default: medusa)")
    heads.add_argument("--out", required=True, metavar="DIR", help="the heads folder to write (heads.pt, heads.json, checkpoint, cached data)")
    heads.add_argument("--heads", type=_positive_int, default=3, help="Medusa heads: tokens guessed beyond the LM head's (default: 3)")
    heads.add_argument("--prompts", type=_positive_int, default=200, help="prompts of the offline corpus to continue (default: 200; a tenth is held out)")
    heads.add_argument("--max-tokens", type=_positive_int, default=128, help="tokens the target writes per prompt (default: 128)")
    heads.add_argument("--epochs", type=_positive_int, default=2, help="passes over the cached positions (default: 2)")
    heads.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    heads.add_argument("--chain", type=_positive_int, default=2,
                       help="EAGLE: steps of the training-time test, the head learning from its own drafted features (default: 2; "
                            "1 turns it off and makes an epoch ~3.5x faster on CPU)")
    heads.add_argument("--labels", choices=["hard", "soft"], default="hard",
                       help="EAGLE: learn the target's next token (hard) or its whole next-token distribution (soft, as EAGLE does; "
                            "~25%% slower per epoch) (default: hard)")
    heads.add_argument("--init", metavar="DIR", default=None,
                       help="EAGLE: start from the head in this folder (trained for the same target) instead of a copy of the target's last "
                            "layer, e.g. to go on training on a larger corpus; --epochs counts this run's epochs")
    heads.add_argument("--continuations-from", metavar="URL", default=None,
                       help="an OpenAI-compatible server already running this same target (e.g. `bspec server start vllm --model "
                            "qwen2.5-coder-0.5b --dtype float32`, then http://127.0.0.1:8000/v1): it writes the continuations, many at "
                            "once, instead of this process one by one; checked against the target afterwards")



def _heads(args: argparse.Namespace) -> int:
    """``bspec heads train``: continuations, hidden states (cached), training, held-out accuracy."""
    from rich.progress import Progress

    from ..local.train_heads import corpus_sequences, offline_corpus

    if args.init and args.kind != "eagle":
        raise PromptError("--init starts an EAGLE head from another; Medusa heads train from scratch in seconds to minutes")
    model, tokenizer = _load_target(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = offline_corpus(args.prompts)
    with Progress(transient=True) as bar:
        progress = _progress_bars(bar)
        train, held_out = corpus_sequences(model, tokenizer, prompts, out, args.max_tokens, continuations_from=args.continuations_from,
                                           target=args.target, progress=progress)
        details = _train(args, model, tokenizer, train, held_out, out, progress)
    print(json.dumps(details))
    return 0


def _load_target(args: argparse.Namespace) -> tuple[Any, Any]:
    """The target in float32 on ``--device``; an ``--init`` head that does
    not fit it is refused now, not after an hour of answers."""
    from ..drafters.hf import import_hf, load_folder

    import_hf("bspec heads")
    hint = "a .gguf file converts to one with `bspec server prepare vllm --model NAME`"
    model, tokenizer = load_folder(args.target, device=args.device, dtype="float32", role="target model", option="--device", hint=hint, feature="bspec heads")
    model = model.to(args.device).eval()
    if args.init:
        from ..local.eagle import load_eagle

        load_eagle(Path(args.init), model, tokenizer)
    return model, tokenizer


def _progress_bars(bar: Any):
    """A ``progress(what, done, total)`` that shows one bar per ``what``."""
    tasks: dict[str, int] = {}

    def progress(what: str, done: int, total: int) -> None:
        if what not in tasks:
            tasks[what] = int(bar.add_task(what, total=total))
        bar.update(tasks[what], completed=done)

    return progress


def _train(args: argparse.Namespace, model: Any, tokenizer: Any, train: Any, held_out: Any, out: Path, progress: Any) -> dict[str, Any]:
    """Train ``--kind`` heads on the texts; what ``heads.json`` records."""
    from ..local.train_heads import train_eagle, train_medusa

    if args.kind == "eagle":
        return train_eagle(model, tokenizer, train, held_out, out, epochs=args.epochs, chain=args.chain, soft=args.labels == "soft",
                           init=Path(args.init) if args.init else None, progress=progress)
    return train_medusa(model, tokenizer, train.medusa(args.heads), held_out.medusa(args.heads), out,
                        heads=args.heads, epochs=args.epochs, progress=progress)

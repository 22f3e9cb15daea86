"""Loading and wrapping local mode's models: transformers folders in, the
target, the draft (or a tree proposer from trained heads) and the engine
that runs each (:class:`~.eager.CachedLM` or :class:`~.static.StaticLM`)."""

from __future__ import annotations

from typing import Any

from .._exceptions import ConfigurationError
from ..drafters.hf import load_folder
from .eager import CachedLM
from .static import StaticLM, static_unsupported

ENGINES = ("auto", "static", "eager")


def load_models(target_path: str, draft_path: str | None, *, device: str, dtype: str, heads_path: str | None,
                heads_kind: str) -> tuple[Any, Any | None, Any, Any | None]:
    """(target, draft, tokenizer, proposer) from transformers folders (no
    downloads): a draft must share the target's tokenizer; heads
    (``bspec heads train``) are refused for any other target than theirs."""
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    hint = "a .gguf file converts to one with `bspec server prepare vllm --model NAME`"
    target, tokenizer = load_folder(target_path, device=device, dtype=dtype, role="target model", option="--device", hint=hint, feature="--local")
    draft = None
    if draft_path is not None:
        draft, draft_tokenizer = load_folder(draft_path, device=device, dtype=dtype, role="draft model", option="--device", hint=hint, feature="--local")
        check_same_tokenizer(tokenizer, draft_tokenizer)
        draft = draft.to(device)
    target = target.to(device)
    proposer = None
    if heads_path is not None and heads_kind == "eagle":
        from .eagle import EagleProposer, load_eagle

        proposer = EagleProposer(load_eagle(heads_path, target, tokenizer))
    elif heads_path is not None:
        from .heads import MedusaProposer, load_medusa

        proposer = MedusaProposer(load_medusa(heads_path, target, tokenizer))
    return target, draft, tokenizer, proposer


def language_model(model: Any, engine: str = "auto", compile: bool | None = None) -> tuple["CachedLM | StaticLM", str]:
    """The model wrapped for the rounds, and what was chosen, for ``stats.local``.

    ``static`` (:mod:`.static`: a static KV cache, fixed-shape steps) serves
    Qwen2/Llama decoders; ``eager`` (transformers' forward and cache) serves
    any causal LM; ``auto`` takes static where it can.  ``compile``
    (``torch.compile``; CUDA graphs on a GPU) applies to the static path;
    None compiles on CUDA only: on this project's 2-core CPU it did not pay
    (``benchmarks/results/local-static-cpu/``).
    """
    if engine not in ENGINES:
        raise ConfigurationError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    reason = static_unsupported(model) if engine != "eager" else "asked for"
    if reason is not None:
        if engine == "static":
            raise ConfigurationError(f"the static engine cannot run this model: {reason}; use --engine eager (or auto)")
        return CachedLM(model), f"eager ({reason})"
    device = next(model.parameters()).device
    compiled = compile if compile is not None else device.type == "cuda"
    return StaticLM(model, compile=compiled), "static+compiled" if compiled else "static"


def check_same_tokenizer(target_tokenizer: Any, draft_tokenizer: Any) -> None:
    """Local mode compares token ids, so both models must number tokens alike."""
    target_vocab, draft_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if target_vocab != draft_vocab:
        differ = len(set(target_vocab.items()) ^ set(draft_vocab.items()))
        raise ConfigurationError(
            f"the target and draft models do not share a tokenizer ({len(target_vocab)} vs {len(draft_vocab)} tokens, "
            f"{differ} entries differ); local mode needs one tokenizer, "
            "while the API mode (--drafter hf) works on text and takes any draft model"
        )

"""Local target mode: the full speculative sampling of the paper, with both
models on this machine (torch; the ``hf`` extra).

- :mod:`.sampling`: the rule as pure functions (p = target, q = draft);
- :mod:`.engine`: the rounds, one target forward each, over transformers'
  own forward and caches (the eager engine, any causal LM);
- :mod:`.static`: static KV buffers and fixed-shape, compilable steps for
  Qwen2/Llama decoders (the default where it applies).
"""

from .engine import CachedLM, LocalSpeculator, LocalStats, check_same_tokenizer
from .sampling import NO_TOKEN, SamplingParams, expected_acceptance, leviathan_speedup, rejection_sample, sampling_probs

__all__ = [
    "NO_TOKEN", "CachedLM", "LocalSpeculator", "LocalStats", "SamplingParams", "check_same_tokenizer",
    "expected_acceptance", "leviathan_speedup", "rejection_sample", "sampling_probs",
]

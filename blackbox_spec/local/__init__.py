"""Local target mode: the full speculative sampling of the paper, with both
models on this machine (torch; the ``hf`` extra).

- :mod:`.sampling`: the rule as pure functions (p = target, q = draft);
- :mod:`.engine`: transformers models with rollback KV caches, one target
  forward per round.
"""

from .engine import CachedLM, LocalSpeculator, LocalStats, check_same_tokenizer
from .sampling import NO_TOKEN, SamplingParams, expected_acceptance, leviathan_speedup, rejection_sample, sampling_probs

__all__ = [
    "NO_TOKEN", "CachedLM", "LocalSpeculator", "LocalStats", "SamplingParams", "check_same_tokenizer",
    "expected_acceptance", "leviathan_speedup", "rejection_sample", "sampling_probs",
]

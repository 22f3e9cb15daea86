"""Drafters: cheap guesses at how the text goes on."""

from .base import Drafter
from .ngram import NGramDrafter, lookup_continuation

__all__ = ["Drafter", "NGramDrafter", "lookup_continuation"]

"""Drafters: cheap guesses at how the text goes on.

- ``ngram``: prompt lookup over the current text (:mod:`.ngram`);
- ``suffix``: suffix automata over the current text and the session's
  earlier outputs, scored by frequency (:mod:`.suffix`);
- ``llama``: a GGUF model through llama-cpp-python (:mod:`.llama`);
- ``hf``: a transformers model on CPU or CUDA (:mod:`.hf`);
- a caller's prediction (Predicted Outputs), before any of them
  (:mod:`.prediction`).
"""

from __future__ import annotations

import importlib.util
from typing import Callable

from .._exceptions import ConfigurationError
from .base import Drafter, DraftLength
from .model import ModelDrafter, vocabulary_of
from .ngram import NGramDrafter, lookup_continuation
from .prediction import PredictionDrafter
from .suffix import SessionIndex, SuffixDrafter

DRAFTERS = ("ngram", "suffix", "llama", "hf")

__all__ = [
    "DRAFTERS", "Drafter", "DraftLength", "DrafterFactory", "ModelDrafter", "NGramDrafter", "PredictionDrafter",
    "SessionIndex", "SuffixDrafter", "lookup_continuation",
]


class DrafterFactory:
    """One fresh drafter per generation, sharing what is costly to rebuild:
    a loaded draft model, and the suffix drafter's session index (so later
    generations of one client draft from earlier ones).

    Arguments are checked at once (unknown name, missing extra, missing or
    wrong-format model file); the model itself loads on first use.
    """

    def __init__(self, kind: str, *, draft_model: str | None = None, draft_device: str = "cpu", session: SessionIndex | None = None) -> None:
        if kind not in DRAFTERS:
            raise ConfigurationError(f"unknown drafter {kind!r}; choose from: {', '.join(DRAFTERS)}, none")
        self.kind = kind
        self.draft_model = draft_model
        self.draft_device = draft_device
        self.session = session or SessionIndex()
        self._model = None
        if kind in ("llama", "hf"):
            if not draft_model:
                flag = "--draft-model PATH.gguf" if kind == "llama" else "--draft-model FOLDER"
                raise ConfigurationError(f"--drafter {kind} needs {flag}")
            if kind == "llama":
                from .llama import check_gguf

                check_gguf(draft_model)
                _require("llama_cpp", "--drafter llama needs llama-cpp-python: pip install 'blackbox-spec[llama]' (see README for the CPU build flags)")
            else:
                _require("torch", "--drafter hf needs torch and transformers: pip install 'blackbox-spec[hf]'")
                _require("transformers", "--drafter hf needs torch and transformers: pip install 'blackbox-spec[hf]'")
        elif draft_model:
            raise ConfigurationError(f"--draft-model is for --drafter llama or hf, not {kind}")

    def load(self) -> None:
        """Load the draft model now (it takes seconds); a no-op otherwise."""
        if self._model is not None or self.kind not in ("llama", "hf"):
            return
        if self.kind == "llama":
            from .llama import LlamaCppModel

            self._model = LlamaCppModel(self.draft_model)  # type: ignore[arg-type]
        else:
            from .hf import HFModel

            self._model = HFModel(self.draft_model, device=self.draft_device)
        vocabulary_of(self._model)  # the healing index, built once, not in the first draft

    def __call__(self) -> Drafter:
        if self.kind == "ngram":
            return NGramDrafter()
        if self.kind == "suffix":
            return SuffixDrafter(session=self.session)
        self.load()
        return ModelDrafter(self._model)  # type: ignore[arg-type]


def _require(module: str, message: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ConfigurationError(message)


def drafter_factory(spec: "str | Drafter | None", *, draft_model: str | None = None, draft_device: str = "cpu") -> Callable[[], Drafter] | None:
    """What ``SpecClient(drafter=...)`` accepts: a name, a drafter instance
    (used for every generation), or None / "none" for plain decoding."""
    if spec is None or spec == "none":
        return None
    if isinstance(spec, str):
        return DrafterFactory(spec, draft_model=draft_model, draft_device=draft_device)
    if draft_model:
        raise ConfigurationError("draft_model is for drafter='llama' or 'hf'")
    return lambda: spec  # type: ignore[return-value]

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

import copy
import importlib.util
import threading
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


class _LoadedModel:
    """A draft model, loaded once on first use and then only read: every
    factory that shares this object drafts with the same one (``bspec
    serve`` keeps one per process, whatever the number of callers' keys)."""

    def __init__(self, kind: str, path: str | None, device: str) -> None:
        self.kind, self.path, self.device = kind, path, device
        self.model = None
        self._lock = threading.Lock()

    def get(self):
        with self._lock:  # (two generations starting at once load it once)
            if self.model is None:
                if self.kind == "llama":
                    from .llama import LlamaCppModel

                    model = LlamaCppModel(self.path)  # type: ignore[arg-type]
                else:
                    from .hf import HFModel

                    model = HFModel(self.path, device=self.device)
                vocabulary_of(model)  # the healing index, built once, not in the first draft
                self.model = model
            return self.model


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
        self.loaded = _LoadedModel(kind, draft_model, draft_device)
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

    @property
    def _model(self):
        return self.loaded.model

    def sibling(self, session: SessionIndex | None = None) -> "DrafterFactory":
        """A factory for the same drafter with a session index of its own
        (``session``, else a new one): the same draft model (loaded once,
        for both), nothing learned shared."""
        twin = copy.copy(self)
        twin.session = session or SessionIndex()
        return twin

    def load(self) -> None:
        """Load the draft model now (it takes seconds); a no-op otherwise."""
        if self.kind in ("llama", "hf"):
            self.loaded.get()

    def __call__(self) -> Drafter:
        if self.kind == "ngram":
            return NGramDrafter()
        if self.kind == "suffix":
            return SuffixDrafter(session=self.session)
        return ModelDrafter(self.loaded.get())


def _require(module: str, message: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ConfigurationError(message)


def drafter_factory(spec: "str | Drafter | None", *, draft_model: str | None = None, draft_device: str = "cpu") -> Callable[[], Drafter] | None:
    """What ``SpecClient(drafter=...)`` accepts: a name, a drafter instance
    (used for every generation), a factory (``DrafterFactory.sibling``:
    one draft model for several clients), or None / "none" for plain decoding."""
    if spec is None or spec == "none":
        return None
    if isinstance(spec, DrafterFactory):
        return spec
    if isinstance(spec, str):
        return DrafterFactory(spec, draft_model=draft_model, draft_device=draft_device)
    if draft_model:
        raise ConfigurationError("draft_model is for drafter='llama' or 'hf'")
    return lambda: spec  # type: ignore[return-value]

"""A GGUF draft model through llama-cpp-python (the ``llama`` extra).

Build llama-cpp-python with explicit CPU flags on machines where the default
``-march=native`` build crashes (these AMX Xeons)::

    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" \\
        pip install 'blackbox-spec[llama]'

The KV cache is llama.cpp's own: :meth:`LlamaCppModel.greedy` keeps the
tokens it holds, rolls back to the longest common prefix with the next
request (``n_tokens``; llama.cpp drops the cache past it on the next
evaluation) and evaluates only what is new.

One limit, measured here: on the CPU, llama.cpp's logits depend on how the
context was cut into batches (its matrix kernels differ by batch size).
Evaluating 21 tokens as 21, as 10 + 11 or one by one gave logits up to 0.3
apart, so a reused cache and a fresh one can pick different tokens where the
top two are that close.  Drafts are only guesses, so this never touches the
output; the tests check that drafts agree except at such near-ties.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Sequence

from .._exceptions import ConfigurationError
from .model import common_prefix

GGUF_MAGIC = b"GGUF"


def check_gguf(path: str | os.PathLike[str]) -> Path:
    """``path`` as a Path if it is a readable GGUF file; else a clear error."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigurationError(f"draft model {p} does not exist")
    if p.is_dir():
        raise ConfigurationError(f"draft model {p} is a folder; --drafter llama needs a .gguf file (use --drafter hf for a transformers folder)")
    with p.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ConfigurationError(f"draft model {p} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    return p


def _import_llama_cpp():
    try:
        import llama_cpp
    except ImportError:
        raise ConfigurationError(
            "--drafter llama needs llama-cpp-python: "
            "CMAKE_ARGS=\"-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON\" pip install 'blackbox-spec[llama]'"
        ) from None
    return llama_cpp


class LlamaCppModel:
    """A GGUF model for drafting, with its KV cache kept between drafts."""

    def __init__(self, path: str | os.PathLike[str], *, n_ctx: int = 8192, n_threads: int | None = None) -> None:
        gguf = check_gguf(path)
        llama_cpp = _import_llama_cpp()
        self._lib = llama_cpp
        self.name = f"llama:{gguf.stem}"
        self.path = gguf
        self.llm = llama_cpp.Llama(
            model_path=str(gguf), n_ctx=n_ctx, n_threads=n_threads, n_batch=512, logits_all=False, verbose=False,
        )
        self.n_ctx = n_ctx
        self.n_vocab = self.llm.n_vocab()
        self._vocab_ptr = llama_cpp.llama_model_get_vocab(self.llm._model.model)
        self.evaluations = 0  # tokens evaluated, all drafts together (KV reuse shows here)
        self.record_gaps = False  # tests: keep each step's top-two logit gap
        self.gaps: list[float] = []

    def tokenize(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)

    def vocabulary(self) -> list[bytes]:
        return [self.llm.detokenize([i]) for i in range(self.n_vocab)]

    def is_end(self, token: int) -> bool:
        return bool(self._lib.llama_vocab_is_eog(self._vocab_ptr, token))

    def greedy(self, tokens: Sequence[int], n: int, first_allowed: Sequence[int] | None = None) -> list[int]:
        import numpy as np

        tokens = list(tokens)[-(self.n_ctx - n - 1) :]  # keep within the context window
        llm = self.llm
        held = list(llm.input_ids[: llm.n_tokens])
        keep = common_prefix(held, tokens)
        if keep == len(tokens):
            keep -= 1  # the last token is re-evaluated for its logits
        llm.n_tokens = keep  # rollback: llama.cpp drops the cache past it on eval
        out: list[int] = []
        pending = tokens[keep:]
        while len(out) < n:
            llm.eval(pending)
            self.evaluations += len(pending)
            pointer = self._lib.llama_get_logits_ith(llm._ctx.ctx, -1)
            logits = np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(self.n_vocab,))
            candidates = np.asarray(first_allowed) if not out and first_allowed is not None else None
            scores = logits[candidates] if candidates is not None else logits
            best = int(np.argmax(scores))
            token = int(candidates[best]) if candidates is not None else best
            if self.record_gaps:
                top = np.partition(scores, -2)[-2:] if len(scores) > 1 else np.array([0.0, np.inf])
                self.gaps.append(float(top[1] - top[0]))
            out.append(token)
            if self.is_end(token) or llm.n_tokens + 1 >= self.n_ctx:
                break
            pending = [token]
        return out

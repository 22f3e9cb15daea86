"""A transformers draft model on CPU or CUDA (the ``hf`` extra).

The KV cache is a ``DynamicCache`` kept between drafts: it is cropped to the
longest common prefix with the next request and only the new tokens run
through the model.  A GGUF file can be converted to a plain HF folder with
``bspec server prepare vllm`` (the folders land under the cache), or loaded
directly by transformers with ``gguf_file`` (slow: it dequantizes).
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any, Sequence

from .._exceptions import ConfigurationError
from .model import common_prefix


def import_hf(feature: str = "--drafter hf"):
    """torch and transformers, imported on first use (they are the optional
    ``hf`` extra), or a one-line :class:`ConfigurationError` naming the
    ``feature`` that needs them."""
    try:
        import torch
        import transformers
    except ImportError:
        raise ConfigurationError(f"{feature} needs torch and transformers: pip install 'blackbox-spec[hf]'") from None
    return torch, transformers


def load_folder(path: str | os.PathLike[str], *, device: str, dtype: str, role: str, option: str, hint: str, feature: str = "--drafter hf") -> tuple[Any, Any]:
    """A transformers causal LM and its tokenizer from a local folder, or a
    one-line :class:`ConfigurationError` (``role`` and ``option`` name what
    the user passed, e.g. "draft model" and "--draft-device"; ``hint`` is
    what to do with a path that is not a folder)."""
    torch, transformers = import_hf(feature)
    folder = Path(path).expanduser()
    if not folder.exists():
        raise ConfigurationError(f"{role} {folder} does not exist")
    if not folder.is_dir() or not (folder / "config.json").exists():
        raise ConfigurationError(f"{role} {folder} is not a transformers folder (no config.json); {hint}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigurationError(f"{option} cuda, but torch sees no CUDA device")
    transformers.utils.logging.disable_progress_bar()  # one bar per weight file clutters the CLI's stderr
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype))
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"cannot load {role} {folder}: {str(exc).splitlines()[0]}") from None
    return model, tokenizer


def cache_argument(model: Any) -> str:
    """The forward argument that takes the KV cache (transformers 5 renamed
    ``past_key_values`` to ``cache``)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def end_tokens(model: Any, tokenizer: Any) -> set[int]:
    """Every id that ends a generation: the config's, the generation config's
    (instruct models list two) and the tokenizer's."""
    found = [getattr(model.config, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)]
    found.append(getattr(getattr(model, "generation_config", None), "eos_token_id", None))
    return {int(e) for x in found if x is not None for e in (x if isinstance(x, (list, tuple)) else [x])}


class HFModel:
    """A causal LM from a local folder (or an already loaded model and tokenizer)."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        model: Any = None,
        tokenizer: Any = None,
        max_context: int = 8192,
    ) -> None:
        self.torch, _ = import_hf()
        if model is None:
            if path is None:
                raise ConfigurationError("HFModel needs a folder path or a loaded model")
            model, tokenizer = load_folder(path, device=device, dtype=dtype, role="draft model", option="--draft-device", hint="for a .gguf file use --drafter llama")
            self.name = f"hf:{Path(path).name}"
        else:
            self.name = f"hf:{type(model).__name__}"
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.device = device
        self.max_context = max_context
        self._ends = end_tokens(model, tokenizer)
        self._cache_arg = cache_argument(self.model)
        parameters = inspect.signature(self.model.forward).parameters
        self._last_only = {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}
        self._cache: Any = None
        self._held: list[int] = []  # tokens whose keys and values the cache holds
        self.evaluations = 0

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def vocabulary(self) -> list[bytes]:
        special = set(self.tokenizer.all_special_ids)
        size = len(self.tokenizer)
        # Decoded one by one, a token that is part of a character decodes to
        # U+FFFD: it never matches the healing prefix then, which is safe.
        return [b"" if i in special else self.tokenizer.decode([i]).encode("utf-8") for i in range(size)]

    def is_end(self, token: int) -> bool:
        return token in self._ends

    def greedy(self, tokens: Sequence[int], n: int, first_allowed: Sequence[int] | None = None) -> list[int]:
        torch = self.torch
        tokens = list(tokens)[-(self.max_context - n - 1) :]
        keep = common_prefix(self._held, tokens)
        if keep == len(tokens):
            keep -= 1  # the last token runs again for its logits
        if self._cache is None or keep == 0:
            self._cache, keep = None, 0
        elif keep < len(self._held):
            # A negative count removes that many tokens in every transformers
            # release (a positive one meant "keep this many" before 5.0).
            self._cache.crop(keep - len(self._held))
        self._held = tokens[:keep]
        pending = tokens[keep:]
        out: list[int] = []
        with torch.inference_mode():
            while len(out) < n:
                ids = torch.tensor([pending], device=self.device)
                result = self.model(input_ids=ids, use_cache=True, **self._last_only, **{self._cache_arg: self._cache})
                self._cache = getattr(result, self._cache_arg)
                self._held += pending
                self.evaluations += len(pending)
                logits = result.logits[0, -1]
                if not out and first_allowed is not None:
                    allowed = torch.as_tensor(list(first_allowed), device=self.device)
                    token = int(allowed[int(torch.argmax(logits[allowed]))])
                else:
                    token = int(torch.argmax(logits))
                out.append(token)
                if self.is_end(token):
                    break
                pending = [token]
        return out

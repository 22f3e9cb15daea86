"""The server's own tokenizer, where it has one: vLLM's and llama.cpp's
``/tokenize`` (asked in whichever shape the server takes, learned once) and
``/detokenize`` (to name the ``"token_id:N"`` strings vLLM may send)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from ._exceptions import TokenizerError
from ._target_answers import _rename_tokens, _token_strings
from ._target_http import TargetHTTP
from ._tokens import is_token_id


def _token_list(data: dict[str, Any] | None) -> list[int] | None:
    """``/tokenize``'s token ids, or None where the answer holds none."""
    tokens = data.get("tokens") if data else None
    if isinstance(tokens, list) and tokens and all(isinstance(t, int) for t in tokens):
        return tokens
    return None


class ServerTokenizer(TargetHTTP):
    """:class:`TargetHTTP` with the server's tokenizer endpoints."""

    def _start_tokenizer(self) -> None:
        """Nothing learned yet about this server's tokenizer."""
        self._tokenizes: str | bool | None = None  # how /tokenize is asked ("vllm", "llama"), False: it isn't there
        self._learning_tokenize = asyncio.Lock()
        self._detokenizes: bool | None = None
        self._token_names: dict[str, str] = {}  # "token_id:N" -> its text (see _name_token_ids)

    async def tokenize(self, text: str) -> list[int] | None:
        """The server's own tokens for ``text`` (vLLM's or llama.cpp's
        ``/tokenize``), without special tokens; None where it has none;
        :class:`TokenizerError` where it has one that keeps failing."""
        if not text:
            return []
        if self._tokenizes is None:
            async with self._learning_tokenize:  # callers at once learn the shape once
                if self._tokenizes is None:
                    return await self._learn_tokenize(text)
        if not self._tokenizes:
            return None
        return _token_list(await self._root_post("/tokenize", self._tokenize_body(str(self._tokenizes), text)))

    async def learn_tokenize(self) -> None:
        """Learn now how this server tokenizes, if that is not known yet: a
        speculative generation starts it beside its first request, so the
        first text it sends back (checked by ``_canon``) does not wait for it.
        (A failure leaves it unlearned: the first check asks again.)"""
        if self._tokenizes is None:
            with contextlib.suppress(TokenizerError):
                await self.tokenize("Hello")

    def _tokenize_body(self, shape: str, text: str) -> dict[str, Any]:
        if shape == "vllm":
            return {"model": self.model, "prompt": text, "add_special_tokens": False}
        return {"content": text, "add_special": False}

    async def _learn_tokenize(self, text: str) -> list[int] | None:
        """Ask in both request shapes at once (one round trip where the
        server has neither, as hosted APIs have not); the first that answers
        with tokens is how this server is asked from now on.  (llama.cpp
        answers vLLM's shape too: with no tokens, for no "content".)"""
        shapes = ("vllm", "llama")
        answers = await asyncio.gather(*(self._root_post("/tokenize", self._tokenize_body(shape, text)) for shape in shapes), return_exceptions=True)
        failed = None
        for shape, data in zip(shapes, answers):
            if isinstance(data, BaseException):
                if not isinstance(data, TokenizerError):
                    raise data
                failed = data
                continue
            tokens = _token_list(data)
            if tokens:
                self._tokenizes = shape
                return tokens
        if failed is not None:
            raise failed  # there but failing: not learned, asked again next time
        self._tokenizes = False
        return None

    async def context_tokens(self, prompt: str, text: str) -> list[int] | None:
        """The server's tokens for ``prompt + text`` (``_canon``); None where
        it can't tokenize."""
        return await self.tokenize(prompt + text)

    async def count_tokens(self, prompt: str, text: str) -> int | None:
        """How many tokens the target made ``text`` of, after ``prompt``: the
        server's own tokenization of both (the greedy path is its own
        tokenization: ``_canon`` checks that before anything is sent back).
        None where the server can't tokenize (:class:`TokenizerError` where
        its tokenizer fails)."""
        whole, head = await asyncio.gather(self.context_tokens(prompt, text), self.context_tokens(prompt, ""))
        if whole is None or head is None or whole[: len(head)] != head:
            return None
        return len(whole) - len(head)

    async def _name_token_ids(self, data: Any) -> None:
        """vLLM's ``--return-tokens-as-token-ids`` shows tokens as
        ``"token_id:N"``: each is named by ``/detokenize`` (once per id and
        client), so it can be placed in the text like any token string.
        Without ``/detokenize`` the ids stay (an answer is then one unit)."""
        strings = [s for s in _token_strings(data) if is_token_id(s)]
        if not strings:
            return
        unknown = {s for s in strings if s not in self._token_names} if self._detokenizes is not False else set()

        async def name(token: str) -> None:
            try:
                answer = await self._root_post("/detokenize", {"model": self.model, "tokens": [int(token.split(":", 1)[1])]})
            except TokenizerError:
                return  # failing now, not absent: the id stays unnamed in this answer
            text = answer.get("prompt") if answer else None
            if isinstance(text, str):
                self._token_names[token] = text
            else:
                self._detokenizes = False

        await asyncio.gather(*(name(token) for token in unknown))
        if self._token_names:
            _rename_tokens(data, self._token_names)

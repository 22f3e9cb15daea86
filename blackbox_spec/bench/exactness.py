"""Exactness runs against a real server: bspec's text against a plain call's.

The reference is one plain, non-streamed ``/v1/completions`` call at
temperature 0 with the same ``max_tokens`` and ``stop`` (where a server
renders a streamed and a non-streamed answer differently, as llama.cpp does
with a character max_tokens cuts, the non-streamed one is what bspec
returns).  :data:`CASES` are prompts whose answers have emoji, CJK and other
characters a byte-level tokenizer splits, or stop strings (several at once,
overlapping, a split character); with the bench workloads they make the
real-server run of ``benchmarks/exactness_real.py`` and part of the integration
tests.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from .workloads import PROMPTS, chatml


@dataclass(frozen=True)
class Case:
    name: str
    prompt: str
    max_tokens: int
    stop: tuple[str, ...] | None = None

    @property
    def unicode(self) -> bool:
        return any(ord(c) > 0x7F for c in self.prompt)


_REPEAT = "Repeat exactly: 🚀😀🎉 龘靐齉 🚀😀🎉 龘靐齉\n" * 2 + "Repeat exactly:"
_CODE_BLOCK = chatml("Write a Python function that prints 'hello' three times, in a markdown code block, then one sentence about it.")

CASES: list[Case] = [
    Case("emoji-repeat", _REPEAT, 48),
    Case("emoji-repeat-cut-1", _REPEAT, 1),
    Case("emoji-repeat-cut-2", _REPEAT, 2),
    Case("emoji-repeat-cut-6", _REPEAT, 6),
    Case("emoji-stop-split", _REPEAT, 48, ("😀",)),
    Case("cjk-stop-split", _REPEAT, 48, ("齉", "🎉")),
    Case("translate-zh", chatml("Translate into Chinese, then into Japanese: 'The weather is nice today, let us walk to the old bridge by the river.'"), 96),
    Case("translate-zh-stop", chatml("Translate into Chinese: 'The weather is nice today. We walk to the river. The bridge is old.'"), 96, ("。", "，")),
    Case("zh-comments", chatml("Write a Python function that sums a list, with comments and a docstring in Chinese."), 128),
    Case("emoji-list", chatml("List ten fruits, one per line, each line starting with its emoji."), 96),
    Case("emoji-list-stops", chatml("List ten fruits, one per line, each line starting with its emoji."), 96, ("🍌", "\n\n", "🍒")),
    Case("json-cjk", '{"name": "张三", "city": "北京", "hobby": "读书"}\n{"name": "李四", "city": "上海", "hobby": "跑步"}\n{"name": "王五", "city": ', 64),
    Case("accents", chatml("Write five French sentences full of accented words (é, è, ê, ç, ï, ô)."), 96),
    Case("zwj-family", chatml("Show six family and profession emoji (with zero-width joiners, like 👨‍👩‍👧 and 👩‍💻), each with its name."), 96),
    Case("russian", chatml("Продолжите рассказ в трёх предложениях: Москва — столица России, и"), 96),
    Case("crlf-lines", "line one\r\nline two\r\nline three\r\nline four\r\nline", 48),
    Case("tabs-code", "def classify(x):\n\tif x < 0:\n\t\treturn 'negative'\n\telif x == 0:\n\t\treturn 'zero'\n\telif x < 10:\n\t\t", 48),
    Case("code-block-stops", _CODE_BLOCK, 128, ("```", "\n```")),
    Case("code-block-stops-reversed", _CODE_BLOCK, 128, ("\n```", "```")),
    Case("overlapping-stops", chatml("Count from one to twenty in English words, separated by commas."), 96, ("teen", "een", "n,")),
    Case("stops-three", chatml("Write a short poem about the sea, in four lines."), 96, ("\n", "sea", "a")),
    Case("mixed-scripts", chatml("Write one sentence each in Korean, Arabic, Hindi and Greek about coffee."), 128),
]


def bench_cases(max_tokens: int = 128) -> list[Case]:
    """The bench workloads' prompts as cases (their budget capped)."""
    return [Case(p.name, p.text, min(p.max_tokens, max_tokens)) for p in PROMPTS]


@dataclass
class Outcome:
    name: str
    unicode: bool  # non-ASCII in the prompt or the plain answer
    stops: int
    identical: bool
    plain: str
    spec: str
    plain_finish: str | None
    spec_finish: str | None
    plain_s: float
    spec_s: float
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def plain_answer(base_url: str, model: str, case: Case, *, api_key: str | None = None) -> tuple[str, str | None, float]:
    """The reference: one plain non-streamed completion at temperature 0."""
    body: dict[str, Any] = {"model": model, "prompt": case.prompt, "max_tokens": case.max_tokens, "temperature": 0}
    if case.stop:
        body["stop"] = list(case.stop)
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=600) as http:
        response = await http.post(base_url.rstrip("/") + "/completions", json=body, headers=headers)
    response.raise_for_status()
    choice = response.json()["choices"][0]
    return choice["text"], choice.get("finish_reason"), time.perf_counter() - started


async def compare(client: Any, case: Case) -> Outcome:
    """``client`` (a SpecClient) against the plain call, on one case."""
    text, finish, plain_s = await plain_answer(client.api._url, client.model, case, api_key=client.api._api_key)
    started = time.perf_counter()
    result = await client.generate(case.prompt, max_tokens=case.max_tokens, stop=list(case.stop) if case.stop else None)
    spec_s = time.perf_counter() - started
    unicode = case.unicode or any(ord(c) > 0x7F for c in text)
    return Outcome(case.name, unicode, len(case.stop or ()), result.text == text and result.finish_reason == finish,
                   text, result.text, finish, result.finish_reason, round(plain_s, 3), round(spec_s, 3), list(result.stats.notes))

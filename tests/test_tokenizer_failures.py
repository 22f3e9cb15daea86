"""A server's /tokenize: absent and failing are not the same (issue 38, item 2).

Absent (404, 405, another refusal): the text sent back is judged by its
characters alone (``risky_boundary``), as on a hosted API.  Failing (5xx, a
timeout): retried; one that keeps failing is not taken for absent, so the
check it makes is never dropped silently: the text is not sent back, and
the rest is the plain call's, with a note saying why.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
import respx

from blackbox_spec import TokenizerError
from blackbox_spec._target import TargetAPI
from blackbox_spec.testing import FakeModel, FakeTarget

from .conftest import API_KEY, BASE_URL, client_for, no_sleep

ROOT = BASE_URL.removesuffix("/v1")
PROMPT = "the there then integer in int " * 6


def copying() -> FakeTarget:
    fake = FakeTarget(model=FakeModel(deviate_every=1000, eos_every=10000), echo="refuse")
    fake.decode_s = 0.005
    return fake


def tokenizer(fake: FakeTarget, answers: list):
    """/tokenize answering from ``answers`` in turn (an int: that status; a
    class: that exception), then as the fake does."""
    calls = []

    async def handle(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if answers:
            answer = answers.pop(0)
            if isinstance(answer, int):
                return httpx.Response(answer, json={"detail": "busy" if answer >= 500 else "Not Found"})
            raise answer("tokenizer down", request=request)
        return await fake.handle_async(request)

    handle.calls = calls
    return handle


async def _generate(fake: FakeTarget, tokenize, max_tokens: int = 60):
    with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
        router.post("/completions").mock(side_effect=fake.handle_async)
        router.post(ROOT + "/tokenize").mock(side_effect=tokenize)
        async with client_for() as client:
            return await client.generate(PROMPT, max_tokens=max_tokens), client


@pytest.mark.parametrize("status", [404, 405, 400, 422])
def test_a_refusal_is_an_absent_tokenizer(status):
    async def run():
        with respx.mock(base_url=BASE_URL) as router:
            router.post(ROOT + "/tokenize").mock(return_value=httpx.Response(status, json={"detail": "no"}))
            api = TargetAPI(BASE_URL, API_KEY, "m")
            try:
                return await api.tokenize("Hello"), api._tokenizes
            finally:
                await api.aclose()

    assert asyncio.run(run()) == (None, False)


@pytest.mark.parametrize("failure", [500, 503, httpx.ReadTimeout, httpx.ConnectError])
def test_a_failing_tokenizer_raises_after_its_retries_and_stays_unlearned(failure):
    async def run():
        route = tokenizer(FakeTarget(), [failure] * 50)
        with respx.mock(base_url=BASE_URL) as router:
            router.post(ROOT + "/tokenize").mock(side_effect=route)
            from blackbox_spec import RetryPolicy

            api = TargetAPI(BASE_URL, API_KEY, "m", retries=RetryPolicy(attempts=3, sleep=no_sleep))
            try:
                with pytest.raises(TokenizerError):
                    await api.tokenize("Hello")
                return api._tokenizes, len(route.calls)
            finally:
                await api.aclose()

    learned, calls = asyncio.run(run())
    assert learned is None  # not "absent": asked again next time
    transient = failure != httpx.ConnectError  # (a refused connection is not retried, as everywhere)
    assert calls == (2 * 3 if transient else 2)  # both request shapes, each retried


def test_a_tokenizer_that_fails_once_is_retried_and_the_check_kept():
    fake = copying()
    route = tokenizer(fake, [503, 503])
    result, client = asyncio.run(_generate(fake, route))
    assert result.text == fake.generate(PROMPT, 60)[0]
    assert client.api._tokenizes == "vllm"
    assert not any("tokenizer failed" in n for n in result.stats.notes)
    assert result.stats.accepted_tokens > 0  # speculation went on, checked


def test_a_tokenizer_that_keeps_failing_is_not_taken_for_absent():
    """Every /tokenize fails: nothing is sent back unchecked.  The text is
    the plain call's, and the stats say why; the request does not fail."""
    fake = copying()
    route = tokenizer(fake, [500] * 10_000)
    result, client = asyncio.run(_generate(fake, route))
    assert (result.text, result.finish_reason) == fake.generate(PROMPT, 60)[:2]
    assert any("tokenizer failed" in n for n in result.stats.notes)
    assert client.api._tokenizes is None
    assert route.calls
    # Text is taken from a side branch only once its context is checked:
    # with no check possible, none was.
    assert result.stats.jumps == 0


def test_without_a_tokenizer_the_prompts_end_is_judged_by_its_characters():
    fake = copying()

    async def absent(request):
        return httpx.Response(404, json={"detail": "Not Found"})

    result, client = asyncio.run(_generate(fake, absent))
    assert result.text == fake.generate(PROMPT, 60)[0]
    assert client.api._tokenizes is False
    assert not any("tokenizer failed" in n for n in result.stats.notes)

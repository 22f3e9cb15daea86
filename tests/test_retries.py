"""Retries of target calls (respx): what is retried, how long it waits,
when it gives up, and that a fault-ridden server still yields exact text."""

from __future__ import annotations

import random

import httpx
import pytest
import respx

from blackbox_spec import RetryPolicy, TargetConnectionError, TargetHTTPError
from blackbox_spec._target import TargetAPI

from .conftest import API_KEY, BASE_URL, PROMPTS, client_for

OK = {"choices": [{"text": " world", "finish_reason": "length"}], "usage": {"prompt_tokens": 2, "completion_tokens": 1}}


class Sleeps:
    """An injected sleep that records instead of waiting."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def api_with(sleeps: Sleeps, **policy) -> TargetAPI:
    return TargetAPI(BASE_URL, API_KEY, "m", retries=RetryPolicy(sleep=sleeps, rng=random.Random(0), **policy))


def answers(*responses):
    """A respx side effect that plays ``responses`` in order (exceptions are raised)."""
    queue = list(responses)

    def handler(request: httpx.Request) -> httpx.Response:
        item = queue.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    return handler


async def test_429_honours_retry_after():
    sleeps = Sleeps()
    api = api_with(sleeps)
    limited = httpx.Response(429, headers={"retry-after": "2"}, json={"error": {"message": "slow down"}})
    with respx.mock(base_url=BASE_URL) as router:
        router.post("/completions").mock(side_effect=answers(limited, limited, httpx.Response(200, json=OK)))
        completion = await api.complete("Hello", max_tokens=1)
    await api.aclose()
    assert completion.text == " world"
    assert sleeps.waits == [2.0, 2.0] and api.calls == 3 and api.retried == 2


@pytest.mark.parametrize("status", [408, 409, 500, 502, 503, 504])
async def test_transient_statuses_back_off_with_jitter(status):
    sleeps = Sleeps()
    api = api_with(sleeps, base_s=0.5)
    failing = httpx.Response(status, json={"error": {"message": "try again"}})
    with respx.mock(base_url=BASE_URL) as router:
        router.post("/completions").mock(side_effect=answers(failing, failing, failing, httpx.Response(200, json=OK)))
        await api.complete("Hello", max_tokens=1)
    await api.aclose()
    assert api.calls == 4 and len(sleeps.waits) == 3
    for n, wait in enumerate(sleeps.waits):
        assert 0 <= wait <= 0.5 * 2**n  # full jitter below the exponential cap


@pytest.mark.parametrize(
    "fault",
    [httpx.ReadTimeout("slow"), httpx.ConnectTimeout("slow"), httpx.ReadError("connection reset by peer"), httpx.RemoteProtocolError("peer closed connection")],
)
async def test_timeouts_and_resets_are_retried(fault):
    sleeps = Sleeps()
    api = api_with(sleeps)
    with respx.mock(base_url=BASE_URL) as router:
        router.post("/completions").mock(side_effect=answers(fault, httpx.Response(200, json=OK)))
        assert (await api.complete("Hello", max_tokens=1)).text == " world"
    await api.aclose()
    assert api.calls == 2


@pytest.mark.parametrize(
    "first",
    [
        httpx.Response(400, json={"error": {"message": "This model's maximum context length is 2048 tokens"}}),
        httpx.Response(401, json={"error": {"message": "bad key"}}),
        httpx.Response(404, json={"error": {"message": "The model `m` does not exist"}}),
        httpx.Response(501, json={"error": {"message": "echo is not implemented"}}),
        httpx.ConnectError("connection refused"),
    ],
)
async def test_permanent_failures_are_not_retried(first):
    sleeps = Sleeps()
    api = api_with(sleeps)
    with respx.mock(base_url=BASE_URL) as router:
        router.post("/completions").mock(side_effect=answers(first, httpx.Response(200, json=OK)))
        with pytest.raises((TargetHTTPError, TargetConnectionError)) as info:
            await api.complete("Hello", max_tokens=1)
    await api.aclose()
    assert api.calls == 1 and sleeps.waits == []
    assert "\n" not in str(info.value)
    if isinstance(first, httpx.Response) and first.status_code == 400:
        assert "maximum context length is 2048" in str(info.value)  # the server's own words


async def test_gives_up_after_the_attempts_with_the_last_error():
    sleeps = Sleeps()
    api = api_with(sleeps, attempts=4)
    with respx.mock(base_url=BASE_URL) as router:
        router.post("/completions").mock(return_value=httpx.Response(503, json={"error": {"message": "overloaded"}}))
        with pytest.raises(TargetHTTPError, match="503.*overloaded"):
            await api.complete("Hello", max_tokens=1)
    await api.aclose()
    assert api.calls == 4 and len(sleeps.waits) == 3


async def test_total_waiting_is_bounded():
    sleeps = Sleeps()
    api = api_with(sleeps, attempts=100, max_wait_s=30, max_total_wait_s=100)
    with respx.mock(base_url=BASE_URL) as router:
        router.post("/completions").mock(return_value=httpx.Response(429, headers={"retry-after": "45"}, json={}))
        with pytest.raises(TargetHTTPError):
            await api.complete("Hello", max_tokens=1)
    await api.aclose()
    # Retry-After 45 is capped at 30 per wait; a fourth wait would pass 100 s.
    assert sleeps.waits == [30.0, 30.0, 30.0] and sum(sleeps.waits) <= 100
    sleeps = Sleeps()
    api = api_with(sleeps, attempts=100, base_s=8, max_wait_s=30, max_total_wait_s=50)
    with respx.mock(base_url=BASE_URL) as router:
        router.post("/completions").mock(return_value=httpx.Response(500, json={}))
        with pytest.raises(TargetHTTPError):
            await api.complete("Hello", max_tokens=1)
    await api.aclose()
    assert sum(sleeps.waits) <= 50 + 1e-9 and api.calls < 100


async def test_a_stream_is_retried_until_it_opens_not_after():
    sse = b'data: {"choices": [{"text": " world", "finish_reason": "length"}]}\n\ndata: [DONE]\n\n'
    sleeps = Sleeps()
    api = api_with(sleeps)
    with respx.mock(base_url=BASE_URL) as router:
        router.post("/completions").mock(side_effect=answers(
            httpx.Response(503, json={}), httpx.ReadTimeout("slow"),
            httpx.Response(200, content=sse, headers={"content-type": "text/event-stream"}),
        ))
        pieces = [p async for p in api.stream("Hello", max_tokens=1)]
    await api.aclose()
    assert pieces[0].text == " world" and api.calls == 3 and len(sleeps.waits) == 2


async def test_exact_text_through_a_server_that_fails_one_call_in_five(fake):
    """A fifth of the calls fail (429 with Retry-After, 500, 503, timeouts,
    resets) before reaching the fake target: every generation still ends with
    exactly the plain text."""
    rng = random.Random(5)
    injected: dict[str, int] = {}
    faults = [
        lambda: httpx.Response(429, headers={"retry-after": "1"}, json={"error": {"message": "rate limited"}}),
        lambda: httpx.Response(500, json={"error": {"message": "internal"}}),
        lambda: httpx.Response(503, text="<html>overloaded</html>"),
        lambda: httpx.ReadTimeout("slow"),
        lambda: httpx.ReadError("connection reset by peer"),
    ]

    def flaky(request: httpx.Request) -> httpx.Response:
        if rng.random() < 0.2:
            fault = rng.choice(faults)()
            name = type(fault).__name__ if isinstance(fault, Exception) else str(fault.status_code)
            injected[name] = injected.get(name, 0) + 1
            if isinstance(fault, Exception):
                raise fault
            return fault
        return fake.handle(request)

    exact = retried = 0
    with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
        router.post("/completions").mock(side_effect=flaky)
        router.get("/models").mock(side_effect=flaky)
        for name in ("code", "prose") * 3:
            async with client_for(drafter="ngram", strategy="echo") as client:
                result = await client.generate(PROMPTS[name], max_tokens=60)
            exact += result.text == fake.generate(PROMPTS[name], 60)[0]
            retried += result.stats.retries
    assert exact == 6
    # Each fault costs one retry (a branch cancelled while waiting skips its own).
    assert 0 < retried <= sum(injected.values())
    assert sum(injected.values()) >= 6 and len(injected) >= 3, injected


async def test_retries_can_be_turned_off_and_the_cli_flag_is_checked(capsys):
    with respx.mock(base_url=BASE_URL) as router:
        route = router.post("/completions").mock(return_value=httpx.Response(503, json={"error": {"message": "busy"}}))
        async with client_for(retries=RetryPolicy(attempts=1)) as client:
            with pytest.raises(TargetHTTPError):
                await client.api.complete("Hello", max_tokens=1)
    assert route.call_count == 1
    from blackbox_spec.cli import main

    with pytest.raises(SystemExit) as info:
        main(["run", "p.txt", "--retries", "-1"])
    assert info.value.code == 2 and "--retries" in capsys.readouterr().err

"""The async client against the mocked API (respx): API surface, probing,
fallbacks, errors, secrets and cancellation."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
import respx

from blackbox_spec import (
    AuthenticationError,
    ConfigurationError,
    ModelNotFoundError,
    PromptError,
    SpecClient,
    TargetConnectionError,
    TargetHTTPError,
    TargetResponseError,
)
from blackbox_spec.testing import FakeTarget
from blackbox_spec.testing.faults import cut_off

from .conftest import API_KEY, BASE_URL, PROMPTS, client_for
from blackbox_spec.client import PROBE_PROMPTS


async def test_stream_yields_what_generate_returns(served):
    prompt = PROMPTS["code"]
    async with client_for() as client:
        stream = client.stream(prompt, max_tokens=80)
        pieces = [p async for p in stream]
        full = await client.generate(prompt, max_tokens=80)
    assert len(pieces) > 1
    assert "".join(pieces) == stream.result.text == full.text == served.generate(prompt, 80)[0]
    assert stream.result.stats.rounds >= 1


async def test_stream_never_shows_text_a_stop_string_later_removes(served):
    prompt = PROMPTS["code"]
    truth = served.generate(prompt, 80)[0]
    stop = truth[30:34]
    async with client_for() as client:
        pieces = [p async for p in client.stream(prompt, max_tokens=80, stop=[stop])]
    assert "".join(pieces) == served.generate(prompt, 80, [stop])[0]


async def test_environment_variables_as_the_openai_sdk(served, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", BASE_URL)
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    served.api_key = API_KEY  # the fake now insists on the key
    async with SpecClient(model="fake-model") as client:
        result = await client.generate("Hello there", max_tokens=5)
    assert result.text == served.generate("Hello there", 5)[0]


async def test_model_defaults_to_the_first_listed(served):
    async with SpecClient(BASE_URL, API_KEY) as client:
        await client.generate("Hello there", max_tokens=3)
        assert client.model == "fake-model"


async def test_probe_runs_once_per_client(served):
    async with client_for() as client:
        await client.generate(PROMPTS["prose"], max_tokens=10)
        probes = sum(1 for r in served.requests if r["prompt"] in PROBE_PROMPTS)
        await client.generate(PROMPTS["prose"], max_tokens=10)
    # One plain probe and one echo probe at once (then, where a call takes
    # long enough to time, 8 plain ones at once), and never again.
    assert probes >= 2
    assert sum(1 for r in served.requests if r["prompt"] in PROBE_PROMPTS) == probes


@pytest.mark.parametrize("mode", ["refuse", "ignore"])
async def test_echo_refused_or_ignored_falls_back_to_fanout(served, mode):
    served.echo = mode
    prompt = PROMPTS["code"] * 2
    async with client_for() as client:
        result = await client.generate(prompt, max_tokens=60)
        assert client.capabilities.echo is False and client.capabilities.logprobs is True
    assert result.text == served.generate(prompt, 60)[0]
    assert "echo" not in result.stats.strategy_rounds


async def test_forcing_an_unavailable_strategy_is_a_clear_error(served):
    served.echo = "refuse"
    async with client_for(strategy="echo") as client:
        with pytest.raises(ConfigurationError, match="not available"):
            await client.generate("Hello there", max_tokens=5)


async def test_echo_refused_mid_run_loses_nothing(fake):
    prompt = PROMPTS["code"] * 2
    original = fake.handle
    calls = {"echo": 0}

    def flaky(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content).get("echo"):
            calls["echo"] += 1
            if calls["echo"] > 1:  # the probe passes, then echo is refused
                return httpx.Response(400, json={"error": {"message": "echo disabled"}})
        return original(request)

    with respx.mock(base_url=BASE_URL) as router:
        router.post("/completions").mock(side_effect=flaky)
        async with client_for(strategy="echo") as client:
            result = await client.generate(prompt, max_tokens=120)
    assert result.text == fake.generate(prompt, 120)[0]
    assert any("echo" in note for note in result.stats.notes)


async def test_plain_mode_is_a_single_streamed_call(served):
    async with client_for(drafter=None) as client:
        result = await client.generate(PROMPTS["json"], max_tokens=30, stop=["}"])
    assert result.text == served.generate(PROMPTS["json"], 30, ["}"])[0]
    assert len(served.requests) == 1 and served.requests[0]["stream"] is True


async def test_server_without_logprobs_decodes_plainly(fake):
    original = fake.handle

    def no_logprobs(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if "logprobs" in body:
            return httpx.Response(400, json={"error": {"message": "logprobs not supported"}})
        return original(request)

    with respx.mock(base_url=BASE_URL) as router:
        router.post("/completions").mock(side_effect=no_logprobs)
        async with client_for() as client:
            result = await client.generate(PROMPTS["code"], max_tokens=40)
    assert result.text == fake.generate(PROMPTS["code"], 40)[0]
    assert result.stats.notes and "plainly" in result.stats.notes[0]


# -- errors --------------------------------------------------------------------


@pytest.mark.parametrize(
    "status, body, error",
    [
        (401, {"error": {"message": "bad key"}}, AuthenticationError),
        (404, {"error": {"message": "The model `x` does not exist."}}, ModelNotFoundError),
        (500, {"error": {"message": "boom"}}, TargetHTTPError),
        (503, "<html>overloaded</html>", TargetHTTPError),
    ],
)
async def test_http_errors_map_onto_the_tree(status, body, error):
    with respx.mock(base_url=BASE_URL) as router:
        kwargs = {"json": body} if isinstance(body, dict) else {"text": body}
        router.post("/completions").mock(return_value=httpx.Response(status, **kwargs))
        async with client_for() as client:
            with pytest.raises(error) as info:
                await client.generate("Hello there", max_tokens=5)
    assert str(status) in str(info.value) and "\n" not in str(info.value)


async def test_unreachable_server():
    async with SpecClient("http://127.0.0.1:9/v1", API_KEY, "m") as client:
        with pytest.raises(TargetConnectionError, match="cannot reach"):
            await client.generate("Hello", max_tokens=2)


@pytest.mark.parametrize("payload", [b"not json", b"[1, 2]", b'{"choices": []}', b'{"choices": [{"text": 5}]}'])
async def test_malformed_responses(payload):
    with respx.mock(base_url=BASE_URL) as router:
        router.post("/completions").mock(return_value=httpx.Response(200, content=payload))
        async with client_for() as client:
            with pytest.raises(TargetResponseError):
                await client.generate("Hello there", max_tokens=5)


@pytest.mark.parametrize("kwargs", [{"max_tokens": 0}, {"max_tokens": -1}, {"max_tokens": True}, {"stop": [""]}])
async def test_bad_arguments(kwargs):
    async with client_for() as client:
        with pytest.raises(ConfigurationError):
            client.stream("Hello", **kwargs)


async def test_empty_prompt_and_bad_options():
    async with client_for() as client:
        with pytest.raises(PromptError):
            client.stream("", max_tokens=3)
    with pytest.raises(ConfigurationError):
        SpecClient(BASE_URL, API_KEY, "m", strategy="telepathy")
    with pytest.raises(ConfigurationError):
        SpecClient(BASE_URL, API_KEY, "m", drafter="crystal-ball")
    with pytest.raises(ConfigurationError, match="invalid base URL"):
        SpecClient("ftp://x", API_KEY, "m")


async def test_failure_mid_generation_keeps_the_partial_text(fake):
    prompt = PROMPTS["code"] * 2
    original = fake.handle
    count = {"n": 0}

    def dies(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content).get("prompt") in PROBE_PROMPTS:
            return original(request)  # the client's probe
        count["n"] += 1
        response = original(request)
        if response.headers.get("content-type") == "text/event-stream":
            # Every stream breaks off part-way: the main one too.
            return cut_off(response, 1 / 3)
        if count["n"] > 3:
            return httpx.Response(500, json={"error": {"message": "the GPU caught fire"}})
        return response

    with respx.mock(base_url=BASE_URL) as router:
        router.post("/completions").mock(side_effect=dies)
        async with client_for() as client:
            with pytest.raises(TargetConnectionError) as info:
                await client.generate(prompt, max_tokens=200)
    partial = info.value.partial
    truth = fake.generate(prompt, 200)[0]
    assert partial.text and truth.startswith(partial.text)


async def test_api_key_never_appears():
    def leaky(request: httpx.Request) -> httpx.Response:
        # A server that echoes the Authorization header in its error message.
        return httpx.Response(500, json={"error": {"message": f"bad header {request.headers['authorization']}"}})

    client = client_for()
    assert API_KEY not in repr(client) and API_KEY not in repr(client.api)
    with respx.mock(base_url=BASE_URL) as router:
        router.post("/completions").mock(side_effect=leaky)
        with pytest.raises(TargetHTTPError) as info:
            await client.generate("Hello there", max_tokens=5)
    await client.aclose()
    assert API_KEY not in str(info.value) and "***" in str(info.value)


# -- fan-out cancellation ----------------------------------------------------------


async def test_fanout_cancels_branches_a_divergence_made_useless():
    fake = FakeTarget()
    prompt = PROMPTS["code"]
    slow_started: list[float] = []

    async def slow_branches(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if body["prompt"] != prompt and body["prompt"] not in PROBE_PROMPTS:
            slow_started.append(time.perf_counter())
            await asyncio.sleep(2.0)  # branches past offset 0 are slow...
        return fake.handle(request)

    class WrongDrafter:
        name = "wrong"

        def start(self, prompt):
            pass

        def propose(self, max_chars):
            return "\u2603" + " wrong" * 40

        def update(self, *args):
            pass

    with respx.mock(base_url=BASE_URL) as router:
        router.post("/completions").mock(side_effect=slow_branches)
        async with client_for(drafter=WrongDrafter(), strategy="fanout", fanout_width=4) as client:
            stream = client.stream(prompt, max_tokens=8)
            text = "".join([p async for p in stream])
    assert text == fake.generate(prompt, 8)[0]
    # ...but request 0 already showed the draft is wrong, so they were cancelled.
    stats = stream.result.stats
    assert slow_started and stats.cancelled_calls >= 2 and stats.cancelled_calls == stats.target_calls - 1

"""Rounds that fail after their retries: nothing lost, nothing duplicated.

A failed verification round or a broken stream leaves the text at its last
safe cut; the next round resumes from there, and after two failures in a
row without new text the generation falls back to plain decoding.  Every
test compares with what the fake target writes plainly, and with the pieces
the client streamed (a duplicated or dropped piece shows there)."""

from __future__ import annotations

import json

import httpx
import pytest
import respx

from blackbox_spec import TargetHTTPError
from blackbox_spec._retry import RetryPolicy
from blackbox_spec.testing import FakeTarget
from blackbox_spec.testing.faults import cut_off
from blackbox_spec.verifiers import FanoutVerifier
from blackbox_spec._target import TargetAPI
from blackbox_spec.verifiers.base import Plan
from blackbox_spec.verifiers.fanout import likely_boundaries

from .conftest import BASE_URL, PROMPTS, client_for, no_sleep
from blackbox_spec.client import PROBE_PROMPTS

ONCE = RetryPolicy(attempts=1, sleep=no_sleep)  # every fault reaches the orchestrator


def is_stream(request: httpx.Request) -> bool:
    return bool(json.loads(request.content).get("stream"))


async def streamed(client, prompt: str, max_tokens: int) -> tuple[str, object]:
    """The pieces joined, and the result (whose text must be the same)."""
    stream = client.stream(prompt, max_tokens=max_tokens)
    pieces = [piece async for piece in stream]
    assert "".join(pieces) == stream.result.text  # nothing emitted twice or dropped
    return "".join(pieces), stream.result


async def test_streams_that_break_part_way_resume_exactly(fake):
    """Every stream the server sends for more than 20 tokens breaks off a
    third of the way in: each resumes from the last whole token, and the text
    is the plain text."""
    prompt = PROMPTS["code"] * 2

    def breaks(request: httpx.Request) -> httpx.Response:
        response = fake.handle(request)
        if is_stream(request) and json.loads(request.content)["max_tokens"] > 20:
            return cut_off(response, 1 / 3)
        return response

    with respx.mock(base_url=BASE_URL) as router:
        router.post("/completions").mock(side_effect=breaks)
        async with client_for(retries=ONCE) as client:
            text, result = await streamed(client, prompt, 200)
    assert text == fake.generate(prompt, 200)[0]
    assert result.stats.failed_rounds >= 2 and result.finish_reason in ("length", "stop")
    assert result.stats.fallback is None  # each break made progress: no reason to give up


@pytest.mark.parametrize("strategy", ["auto", "echo", "fanout"])
async def test_every_third_call_reset_still_exact(fake, strategy):
    """With no retries at all, every third request is reset: the rounds they
    break are run again from the same text."""
    prompt = PROMPTS["prose"] * 3
    calls = {"n": 0}

    def resets(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["prompt"] not in PROBE_PROMPTS:  # (not the client's probes)
            calls["n"] += 1
            if calls["n"] % 3 == 1:  # the first call, and every third after it
                raise httpx.ReadError("connection reset by peer")
        return fake.handle(request)

    with respx.mock(base_url=BASE_URL) as router:
        router.post("/completions").mock(side_effect=resets)
        async with client_for(retries=ONCE, strategy=strategy) as client:
            text, result = await streamed(client, prompt, 150)
    assert text == fake.generate(prompt, 150)[0]
    assert result.stats.failed_rounds >= 1


async def test_verification_that_keeps_failing_falls_back_to_plain(fake):
    """Every echo verification fails with a 500 (the probe passes): after two
    failed rounds in a row the generation decodes plainly, continuing from
    what it had, and says so."""
    prompt = PROMPTS["prose"] * 3
    verifications = []

    def echo_fails(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if body.get("echo") and body["prompt"] not in PROBE_PROMPTS:
            verifications.append(body["prompt"])
            return httpx.Response(500, json={"error": {"message": "prompt_logprobs crashed the worker"}})
        return fake.handle(request)

    with respx.mock(base_url=BASE_URL) as router:
        router.post("/completions").mock(side_effect=echo_fails)
        async with client_for(retries=ONCE, strategy="echo") as client:
            text, result = await streamed(client, prompt, 120)
    assert text == fake.generate(prompt, 120)[0]
    stats = result.stats
    assert len(verifications) == 2 and stats.failed_rounds == 2
    assert stats.fallback and "2 failed rounds" in stats.fallback and "500" in stats.fallback
    assert stats.fallback in stats.notes and stats.output_tokens == 120


async def test_a_server_that_goes_down_keeps_the_partial_text(fake):
    """After some text, every call fails: the error carries what the target
    had confirmed (a prefix of the plain text), after three failed rounds."""
    prompt = PROMPTS["code"] * 2
    calls = {"n": 0}

    def dies(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["prompt"] in PROBE_PROMPTS:
            return fake.handle(request)  # the client's probe
        calls["n"] += 1
        if calls["n"] > 4:
            return httpx.Response(503, json={"error": {"message": "the GPU caught fire"}})
        response = fake.handle(request)
        if is_stream(request):
            return cut_off(response)
        return response

    with respx.mock(base_url=BASE_URL) as router:
        router.post("/completions").mock(side_effect=dies)
        async with client_for(retries=ONCE) as client:
            with pytest.raises(TargetHTTPError, match="caught fire") as info:
                await client.generate(prompt, max_tokens=200)
    partial = info.value.partial
    assert partial.text and fake.generate(prompt, 200)[0].startswith(partial.text)
    # Three failures in a row without new text: plain decoding, then giving up.
    assert partial.stats.failed_rounds >= 3 and partial.stats.fallback


@pytest.mark.parametrize("status, raised", [(401, True), (404, True), (400, True), (503, False)])
async def test_what_a_plain_round_survives(fake, status, raised):
    """A plain stream that is refused for good (bad key, unknown model, a
    context the server rejects) fails at once; a 503 is survived."""
    prompt = PROMPTS["prose"]
    failures = {"n": 0}
    message = "The model `x` does not exist" if status == 404 else "nope"

    def refuses_one_stream(request: httpx.Request) -> httpx.Response:
        if is_stream(request) and failures["n"] == 0 and json.loads(request.content)["prompt"] not in PROBE_PROMPTS:  # (not the probe)
            failures["n"] += 1
            return httpx.Response(status, json={"error": {"message": message}})
        return fake.handle(request)

    with respx.mock(base_url=BASE_URL) as router:
        router.post("/completions").mock(side_effect=refuses_one_stream)
        async with client_for(retries=ONCE) as client:
            if raised:
                with pytest.raises(TargetHTTPError, match=str(status)):
                    await client.generate(prompt, max_tokens=40)
            else:
                result = await client.generate(prompt, max_tokens=40)
                assert result.text == fake.generate(prompt, 40)[0] and result.stats.failed_rounds == 1
    assert failures["n"] == 1


async def test_a_failed_fanout_request_keeps_the_chain_before_it():
    """Fan-out at four offsets of a correct draft; the request at the third
    offset fails.  The chain still holds through the second, whose whole
    output is the target's: the verdict is a prefix of the plain text, and
    longer than one request could give."""
    fake = FakeTarget()
    prompt = PROMPTS["prose"]
    truth = fake.generate(prompt, 60)[0]
    draft = truth[:48]
    api = TargetAPI(BASE_URL, None, "fake-model", retries=ONCE)
    plan = Plan("fanout", width=4, tokens_per_request=8, segment_chars=12)
    offsets = likely_boundaries(draft, plan.width, plan.segment_chars)
    assert len(offsets) == 4
    asked: list[int] = []

    def third_fails(request: httpx.Request) -> httpx.Response:
        offset = len(json.loads(request.content)["prompt"]) - len(prompt)
        asked.append(offset)
        if offset == offsets[2]:
            return httpx.Response(500, json={"error": {"message": "worker lost"}})
        return fake.handle(request)

    with respx.mock(base_url=BASE_URL) as router:
        router.post("/completions").mock(side_effect=third_fails)
        verdict = await FanoutVerifier(api).verify(prompt, draft, plan)
    await api.aclose()
    got = "".join(u.text for u in verdict.units)
    assert offsets[2] in asked and truth.startswith(got)
    assert len(got) > offsets[1]  # through the second request's whole output

"""One-call scoring forms beyond vLLM's completions echo (``_scoring``):
SGLang's and TGI's native ``/generate``, found by the probe where
``/v1/completions`` echo gives no prompt logprobs, and Together's echo;
used by echo rounds, kept in the profile, exact; each read from its
documented shape."""

from __future__ import annotations

import json

import httpx
import pytest
import respx

from blackbox_spec import SpecClient
from blackbox_spec._exceptions import TargetResponseError
from blackbox_spec._scoring import sglang_as_echo
from blackbox_spec.testing import FakeTarget

from .conftest import API_KEY, BASE_URL, PROMPTS, client_for, over_http

ROOT = BASE_URL.removesuffix("/v1")


def sglang_like() -> FakeTarget:
    """SGLang: its /v1/completions ignores echo's prompt logprobs, its root
    /generate scores the prompt."""
    return FakeTarget(echo="ignore", sglang_generate=True)


def tgi_like() -> FakeTarget:
    """TGI: its /v1/completions has no echo, its root /generate lists the
    prompt's tokens with their own logprobs (``decoder_input_details``)."""
    return FakeTarget(echo="ignore", tgi_generate=True, chat_prefill="tgi")


def _scored_by_generate(form: str, request: dict) -> bool:
    """Is ``request`` (as the fake recorded it) a /generate call in ``form``, asking for the prompt's scores?"""
    if form == "sglang":
        return "text" in request and request["return_logprob"] and request["logprob_start_len"] == 0 and request["return_text_in_logprobs"]
    params = request.get("parameters") or {}
    return "inputs" in request and params["details"] and params["decoder_input_details"] and not params["do_sample"]


@pytest.mark.parametrize("form", ["sglang", "tgi"])
@pytest.mark.parametrize("name", ["code", "json", "emoji"])
async def test_echo_rounds_score_with_generate_and_stay_exact(name, form):
    """SGLang's and TGI's /generate found by the probe where completions echo
    gives no prompt logprobs, every echo round scored by it alone, exact.
    (TGI's proves only tokens with p > 0.51: the fake's top choices all are.)"""
    prompt = PROMPTS[name] * 3
    with over_http(sglang_like() if form == "sglang" else tgi_like()) as (fake, url):
        async with SpecClient(url, None, "fake-model", strategy="echo", profile="off") as client:
            caps = await client.probe()
            result = await client.generate(prompt, max_tokens=60)
        async with SpecClient(url, None, "fake-model", drafter=None, profile="off") as plain:
            truth = await plain.generate(prompt, max_tokens=60)
    assert caps.echo and caps.scoring == form
    assert result.text == truth.text and result.finish_reason == truth.finish_reason
    scored = [r for r in fake.requests if "text" in r or "inputs" in r]
    assert result.stats.strategy_rounds.get("echo", 0) >= 1 and len(scored) >= result.stats.strategy_rounds["echo"]
    assert all(_scored_by_generate(form, r) for r in scored) and result.stats.accepted_tokens > 0
    assert not any(r.get("echo") for r in fake.requests if "prompt" in r and r["_prefilled"])  # (no completions echo was used)


async def test_a_vllm_server_keeps_its_completions_echo():
    with over_http(FakeTarget(sglang_generate=True)) as (fake, url):
        async with SpecClient(url, None, "fake-model", profile="off") as client:
            caps = await client.probe()
    assert caps.echo and caps.scoring == "echo" and client.api.scoring == "echo"
    assert not any("text" in r for r in fake.requests)


async def test_the_profile_keeps_the_scoring_form(tmp_path, monkeypatch):
    monkeypatch.setenv("BSPEC_PROFILES", str(tmp_path))
    with over_http(sglang_like()) as (_, url):
        async with SpecClient(url, None, "fake-model", profile="auto") as client:
            await client.generate(PROMPTS["code"] * 2, max_tokens=20)
        async with SpecClient(url, None, "fake-model", profile="auto") as later:
            result = await later.generate(PROMPTS["code"] * 2, max_tokens=20)
            assert later.api.scoring == "sglang" and result.stats.server_profile == "stored"


async def test_sglangs_documented_answer_is_read_as_an_echo():
    """The request and answer as SGLang documents them, mocked with respx."""
    seen: list[dict] = []

    def generate(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        return httpx.Response(200, json={"text": " world", "meta_info": {
            "id": "abc", "finish_reason": {"type": "length", "length": 1}, "prompt_tokens": 2, "completion_tokens": 1, "cached_tokens": 0,
            "input_token_logprobs": [[None, 9707, "Hello"], [-1.25, 11, ","]], "output_token_logprobs": [[-0.5, 1879, " world"]],
            "input_top_logprobs": [None, [[-1.25, 11, ","], [-2.0, 0, "!"]]], "output_top_logprobs": [[[-0.5, 1879, " world"], [-1.5, 3, " there"]]]}})

    with respx.mock(assert_all_called=False) as router:
        router.post(ROOT + "/generate").mock(side_effect=generate)
        async with client_for() as client:
            client.api.scoring = "sglang"
            c = await client.api.complete("Hello,", max_tokens=1, logprobs=1, echo=True)
    assert seen[0]["text"] == "Hello," and seen[0]["sampling_params"] == {"max_new_tokens": 1, "temperature": 0}
    assert c.echoed and c.text == " world" and c.finish_reason == "length" and c.usage.prompt_tokens == 2
    assert [u.text for u in c.prompt_units] == ["Hello", ","] and [u.text for u in c.units] == [" world"]


@pytest.mark.parametrize("meta", [{}, {"prompt_tokens": 1, "completion_tokens": 0, "input_token_logprobs": [[None, 1]], "output_token_logprobs": []}])
def test_a_malformed_generate_answer_is_refused(meta):
    with pytest.raises((KeyError, ValueError, TypeError)):
        sglang_as_echo("a", {"text": "", "meta_info": meta})


async def test_a_malformed_generate_answer_is_a_response_error_not_a_crash():
    with respx.mock(assert_all_called=False) as router:
        router.post(ROOT + "/generate").mock(return_value=httpx.Response(200, json={"text": "x", "meta_info": {"prompt_tokens": 1}}))
        async with client_for() as client:
            client.api.scoring = "sglang"
            with pytest.raises(TargetResponseError, match="malformed /generate answer") as refused:
                await client.api.complete("Hello", max_tokens=1, logprobs=1, echo=True)
    assert API_KEY not in str(refused.value)


# -- TGI's /generate details and Together's echo: each position's own logprob only ----------


async def test_tgis_documented_answer_is_read_as_an_echo_that_proves_only_likely_tokens():
    """The request and answer as TGI documents them, mocked with respx: a
    prompt token more likely than not is the target's choice; one less
    likely says nothing (no top candidates), so the draft is taken up to
    it and no correction is made up."""
    from blackbox_spec.verifiers.base import Plan
    from blackbox_spec.verifiers.echo import EchoVerifier

    seen: list[dict] = []

    def generate(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"generated_text": " there", "details": {
            "finish_reason": "length", "generated_tokens": 1, "seed": None,
            "prefill": [{"id": 1, "text": "Hello", "logprob": None}, {"id": 2, "text": ",", "logprob": -0.05},
                        {"id": 3, "text": " world", "logprob": -0.2}, {"id": 4, "text": "!", "logprob": -0.9}],
            "tokens": [{"id": 5, "text": " there", "logprob": -0.3, "special": False}],
            "top_tokens": [[{"id": 5, "text": " there", "logprob": -0.3, "special": False}]]}})

    with respx.mock(assert_all_called=False) as router:
        router.post(ROOT + "/generate").mock(side_effect=generate)
        async with client_for() as client:
            client.api.scoring = "tgi"
            c = await client.api.complete("Hello, world!", max_tokens=1, logprobs=1, echo=True)
            verdict = await EchoVerifier(client.api).verify("Hello,", " world!", Plan("echo", extra_tokens=1))
    assert seen[0] == {"inputs": "Hello, world!", "parameters": {"max_new_tokens": 1, "do_sample": False, "details": True,
                                                                 "decoder_input_details": True, "top_n_tokens": 1}}
    assert c.echoed and c.text == " there" and c.usage.prompt_tokens == 4
    assert [u.matches for u in c.prompt_units[1:]] == [True, True, False]
    assert [u.text for u in verdict.units] == [" world"] and verdict.plain_next  # ("!" unproven: the round ends before it)


async def test_a_together_style_echo_is_found_and_read():
    """Together answers completions ``echo`` + ``logprobs`` with the
    prompt's tokens beside the choices (``prompt[0].logprobs``): the probe
    names that form, and echo rounds read it and stay exact."""
    fake = FakeTarget()

    def together(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        answer = fake.handle(request)
        if not body.get("echo") or answer.status_code != 200:
            return answer
        data = answer.json()
        choice, logprobs = data["choices"][0], data["choices"][0]["logprobs"]
        split = data["usage"]["prompt_tokens"]
        data["prompt"] = [{"text": body["prompt"], "logprobs": {"tokens": logprobs["tokens"][:split], "token_logprobs": logprobs["token_logprobs"][:split]}}]
        choice["text"] = choice["text"][len(body["prompt"]):]
        choice["logprobs"] = {"tokens": logprobs["tokens"][split:], "token_logprobs": logprobs["token_logprobs"][split:]}
        return httpx.Response(200, json=data)

    prompt = PROMPTS["code"] * 3
    with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
        router.post("/completions").mock(side_effect=together)
        router.get("/models").mock(side_effect=fake.handle)
        async with client_for(strategy="echo") as client:
            caps = await client.probe()
            result = await client.generate(prompt, max_tokens=60)
        async with client_for(drafter=None) as plain:
            truth = await plain.generate(prompt, max_tokens=60)
    assert caps.echo and caps.scoring == "together"
    assert result.text == truth.text and result.stats.strategy_rounds.get("echo", 0) >= 1 and result.stats.accepted_tokens > 0

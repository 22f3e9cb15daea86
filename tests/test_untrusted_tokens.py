"""Token strings that can't be trusted never fail a request, never splice (issue 38).

Where the server's token strings don't fit its text (vLLM 0.10's first
``_correct_decoded_token``, or strings corrupted at random), the generation
goes on plainly, without logprobs, from the text confirmed so far: the
text is the plain call's, and the stats say so once.  A plain restart
from the prompt checks that it writes again what was already emitted.
"""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import pytest
import respx
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from blackbox_spec import NondeterministicTargetError, SpecClient
from blackbox_spec._tokens import AlignmentError
from blackbox_spec.cli import _summary
from blackbox_spec.serving.answers import spec_headers as _spec_headers
from blackbox_spec.testing import FakeModel, FakeTarget, FakeTokenizer
from blackbox_spec.testing.corrupt import KINDS, corrupting

from .conftest import API_KEY, BASE_URL, client_for, over_http
from .test_byte_level import COPYING, MODEL, prompts, stops, target
from .test_cli import bspec, write
from blackbox_spec.client import PROBE_PROMPTS

ROOT = BASE_URL.removesuffix("/v1")
FORMS = ["vllm-legacy", "vllm", "vllm-0.10", "openai", "token-id", "llama"]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True, database=None)


def rule_of(form: str) -> str:
    return "earliest-start" if form == "llama" else "earliest-end"


async def _generate(fake: FakeTarget, prompt: str, max_tokens: int, stop, strategy: str, drafter: str | None, handler=None, **client):
    with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
        router.post("/completions").mock(side_effect=handler or fake.handle_async)
        for path in ("/detokenize", "/tokenize"):
            router.post(ROOT + path).mock(side_effect=fake.handle_async)
        async with SpecClient(BASE_URL, API_KEY, "fake-model", strategy=strategy, drafter=drafter, **client) as c:
            return await c.generate(prompt, max_tokens=max_tokens, stop=stop)


def ascii_probe(fake: FakeTarget):
    """``fake``'s handler, but the client's probes ("Hello") are answered by
    a fake whose answer has no split characters: its strings fit, so the
    generation starts speculating (and finds out later)."""
    plain = FakeTarget()

    async def handle(request: httpx.Request) -> httpx.Response:
        return await (plain if json.loads(request.content).get("prompt") in PROBE_PROMPTS else fake).handle_async(request)

    return handle


# -- vLLM 0.10's convention: the crash of issue 38 ----------------------------------


@pytest.mark.parametrize("strategy", ["auto", "echo", "fanout"])
@pytest.mark.parametrize("drafter", ["ngram", "suffix"])
def test_vllm_010_token_strings_are_given_up_not_raised(strategy, drafter):
    """The strings of a split emoji all read "" there (the one that completes
    it too): they can't be placed, so the generation stops reading them and
    the rest comes from a plain stream without logprobs."""
    fake = target("vllm-0.10", "earliest-end", COPYING)
    prompt = "😀🚀 中文本字节测试 👍🙂🎉 " * 4
    result = asyncio.run(_generate(fake, prompt, 60, None, strategy, drafter, ascii_probe(fake)))
    assert (result.text, result.finish_reason) == fake.generate(prompt, 60)[:2]
    stats = result.stats
    assert stats.token_strings_failed
    assert sum("token strings did not fit" in n for n in stats.notes) == 1
    assert "without logprobs" in _summary(result)
    # After the failure, no request asked for logprobs.
    failed_at = next(k for k, r in enumerate(fake.requests) if r.get("logprobs") is None and r.get("stream") and r.get("prompt") not in PROBE_PROMPTS)
    assert all(r.get("logprobs") is None for r in fake.requests[failed_at:])


def test_the_summary_and_stats_say_nothing_when_the_strings_fit():
    fake = target("vllm", "earliest-end", COPYING)
    prompt = "😀🚀 中文本字节测试 👍🙂🎉 " * 4
    result = asyncio.run(_generate(fake, prompt, 60, None, "auto", "ngram"))
    assert result.text == fake.generate(prompt, 60)[0]
    assert result.stats.token_strings_failed is None
    assert "without logprobs" not in _summary(result)


def test_the_probe_aligns_its_answer_before_it_trusts_token_strings():
    """A probe answer whose strings don't fit its text: nothing is
    speculated on them (the strategies that read them are not offered)."""
    fake = FakeTarget()

    async def handler(request: httpx.Request) -> httpx.Response:
        response = await fake.handle_async(request)
        await response.aread()
        if json.loads(request.content).get("prompt") not in PROBE_PROMPTS or not json.loads(request.content).get("stream"):
            return response
        chunks = [json.loads(line[6:]) for line in response.text.split("\n\n") if line.startswith("data: {")]
        for chunk in chunks:
            lp = chunk["choices"][0].get("logprobs")
            if lp:
                lp["tokens"] = [t + "x" for t in lp["tokens"]]
        body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"})

    prompt = "def f(x):\n    return x\n" * 4
    result = asyncio.run(_generate(fake, prompt, 40, None, "auto", "ngram", handler))
    assert result.text == fake.generate(prompt, 40)[0]
    assert any("did not fit the text of the probe's answer" in n for n in result.stats.notes)
    speculative = [r for r in fake.requests if r.get("prompt") not in PROBE_PROMPTS and (r.get("logprobs") is not None or r.get("echo"))]
    assert not speculative
    # A strategy forced on such a server: decoded plainly too, not refused
    # (the strings are the server's doing, found at run time).
    forced = asyncio.run(_generate(fake, prompt, 40, None, "fanout", "ngram", handler))
    assert forced.text == result.text and forced.stats.rounds == 1


# -- random corruptions: never an error, always the plain text -------------------------


@SETTINGS
@given(prompts, st.integers(1, 60), stops, st.sampled_from(FORMS), st.sampled_from(["auto", "echo", "fanout"]),
       st.sampled_from(["ngram", "suffix"]), st.integers(0, 2**32), st.booleans())
@example("中文本字节测试", 12, None, "vllm-0.10", "auto", "ngram", 0, False)
@example("😀🚀😀🚀😀🚀", 1, None, "llama", "auto", "ngram", 393, True)
def test_corrupted_token_strings_never_fail_and_the_text_is_the_plain_calls(prompt, max_tokens, stop, form, strategy, drafter, seed, copying):
    """Each answer or stream chunk with logprobs is corrupted with
    probability 0.3 (an entry dropped, duplicated, split in two, merged with
    the next, a character moved onto the next, read as "" or U+FFFD,
    ``text_offset`` shifted).  The text is never touched: it is the plain
    call's, whatever the strings say."""
    fake = target(form, rule_of(form), COPYING if copying else MODEL)
    prompt = prompt * 3 if copying else prompt
    if strategy == "echo" and form == "llama":
        strategy = "auto"  # (llama.cpp has no echo)
    handler = corrupting(fake.handle_async, random.Random(seed), 0.3, KINDS)
    result = asyncio.run(_generate(fake, prompt, max_tokens, stop, strategy, drafter, handler))
    assert (result.text, result.finish_reason) == fake.generate(prompt, max_tokens, stop)[:2]


def test_a_stream_listing_two_strings_per_token_does_not_end_the_text_early():
    """Every chunk's one token listed as two strings that still fit the text:
    the count of strings says max_tokens is reached long before it is.  The
    server's tokenizer does not confirm that count, so the plain call ends it."""
    fake = target("vllm", "earliest-end", COPYING)
    fake.echo = "refuse"

    async def handler(request: httpx.Request) -> httpx.Response:
        response = await fake.handle_async(request)
        await response.aread()
        if not json.loads(request.content).get("stream"):
            return response
        chunks = [json.loads(line[6:]) for line in response.text.split("\n\n") if line.startswith("data: {")]
        for chunk in chunks:
            lp = chunk["choices"][0].get("logprobs")
            if lp and len(lp["tokens"]) == 1 and len(lp["tokens"][0]) > 1:
                t = lp["tokens"][0]
                lp["tokens"], lp["token_logprobs"], lp["top_logprobs"] = [t[:1], t[1:]], [None, None], [None, None]
        body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"})

    prompt = "the there then integer in int " * 6
    result = asyncio.run(_generate(fake, prompt, 50, None, "auto", "ngram", handler))
    assert (result.text, result.finish_reason) == fake.generate(prompt, 50)[:2]
    assert any("does not confirm" in n for n in result.stats.notes)


def test_more_strings_than_tokens_are_refused_where_the_usage_says_so():
    fake = target("vllm", "earliest-end")

    async def run(handler):
        from blackbox_spec._target import TargetAPI

        with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
            router.post("/completions").mock(side_effect=handler)
            api = TargetAPI(BASE_URL, API_KEY, "fake-model")
            try:
                return await api.complete("the there then " * 3, max_tokens=8, logprobs=1, echo=True)
            finally:
                await api.aclose()

    async def split_first(request):
        data = (await fake.handle_async(request)).json()
        lp = data["choices"][0]["logprobs"]
        t = lp["tokens"][0]
        lp["tokens"][0:1] = [t[:1], t[1:]]
        lp["token_logprobs"][0:1] = [None, None]
        lp["top_logprobs"][0:1] = [None, None]
        lp["text_offset"][0:1] = [0, 1]
        return httpx.Response(200, json=data)

    assert asyncio.run(run(fake.handle_async)).prompt_units
    with pytest.raises(AlignmentError, match="token strings for a prompt of"):
        asyncio.run(run(split_first))


# -- the CLI, as a new user meets a vLLM 0.10 server --------------------------------------


def test_bspec_run_against_a_vllm_010_server_succeeds_with_the_plain_text(tmp_path):
    fake = FakeTarget(model=FakeModel(FakeTokenizer(byte_level=True), deviate_every=1000, eos_every=10000), token_form="vllm-0.10",
                      stop_rule="earliest-end", api_key=API_KEY)
    prompt = "Repeat exactly: 🚀😀🎉 龘靐齉 🚀😀🎉 龘靐齉\n" * 3
    path = write(tmp_path, "prompt.txt", prompt)
    with over_http(fake) as (_, url):
        common = ("--base-url", url, "--api-key", API_KEY, "--model", "fake-model", "--max-tokens", "80")
        plain = bspec("run", path, *common, "--drafter", "none", "--json")
        spec = bspec("run", path, *common, "--json")
        shown = bspec("run", path, *common)
    assert plain.returncode == 0 and spec.returncode == 0 and shown.returncode == 0, spec.stderr.decode()
    expected = fake.generate(prompt, 80)[0]
    assert json.loads(plain.stdout)["text"] == json.loads(spec.stdout)["text"] == expected
    assert json.loads(spec.stdout)["stats"]["token_strings_failed"]
    assert shown.stderr.decode().count("without logprobs") == 1
    assert API_KEY not in (spec.stdout + spec.stderr + shown.stderr).decode()


# -- a plain restart never splices two answers ---------------------------------------------


def test_a_restart_that_writes_other_text_raises_with_what_was_emitted():
    """A server that breaks its plain stream part-way, then answers the same
    request with other text: the restart from the prompt does not start
    with what was already emitted, so the generation fails, keeping that
    text (a splice of the two answers would pass for one)."""
    first, second = FakeTarget(), FakeTarget(model=FakeModel(deviate_every=3))
    prompt = "The model reads the text and the model writes the text. " * 3
    calls = []

    async def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) == 1:
            full = await first.handle_async(request)
            await full.aread()
            lines = [line for line in full.text.split("\n\n") if line.startswith("data: {")][:6]
            return httpx.Response(200, content=("\n\n".join(lines) + "\n\n").encode(), headers={"content-type": "text/event-stream"})
        return await second.handle_async(request)

    async def run():
        with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
            router.post("/completions").mock(side_effect=handler)
            async with client_for(drafter=None) as client:
                return await client.generate(prompt, max_tokens=40)

    with pytest.raises(NondeterministicTargetError) as caught:
        asyncio.run(run())
    partial = caught.value.partial.text
    assert partial and first.generate(prompt, 40)[0].startswith(partial)
    assert not second.generate(prompt, 40)[0].startswith(partial)


def test_a_restart_that_writes_the_same_text_goes_on():
    fake = FakeTarget()
    prompt = "The model reads the text and the model writes the text. " * 3
    calls = []

    async def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        full = await fake.handle_async(request)
        await full.aread()
        if len(calls) == 1:
            lines = [line for line in full.text.split("\n\n") if line.startswith("data: {")][:6]
            return httpx.Response(200, content=("\n\n".join(lines) + "\n\n").encode(), headers={"content-type": "text/event-stream"})
        return full

    async def run():
        with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
            router.post("/completions").mock(side_effect=handler)
            async with client_for(drafter=None) as client:
                return await client.generate(prompt, max_tokens=40)

    result = asyncio.run(run())
    assert result.text == fake.generate(prompt, 40)[0]
    assert result.stats.failed_rounds == 1


# -- llama.cpp: a character max_tokens cut, in plain streams ------------------------------


@pytest.mark.parametrize("known", [True, False], ids=["server-known", "fresh-client"])
@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5])
def test_a_plain_stream_on_llama_cpp_shows_a_cut_character_as_its_plain_answer_does(known, max_tokens):
    """llama.cpp drops from a stream the character max_tokens cut, which its
    non-streamed answer shows as U+FFFD: the plain stream now ends as that
    answer does (from its per-token timings once the server is known; from
    its tokenizer's count before)."""
    fake = target("llama", "earliest-start", COPYING)
    prompt = "字节中文中字节中文中\r\n\r\n字节中文\r\n\r\n字节中文" * 3

    async def run():
        with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
            router.post("/completions").mock(side_effect=fake.handle_async)
            router.post(ROOT + "/tokenize").mock(side_effect=fake.handle_async)
            async with client_for(drafter=None) as client:
                if known:
                    await client.generate("hello", max_tokens=2)
                return await client.generate(prompt, max_tokens=max_tokens)

    result = asyncio.run(run())
    assert (result.text, result.finish_reason) == fake.generate(prompt, max_tokens)[:2]


# -- bspec serve: a reason that quotes the server stays a valid header ------------------


def test_a_fallback_reason_with_any_text_makes_a_latin1_header():
    from blackbox_spec import GenerationResult, GenerationStats

    stats = GenerationStats(fallback='decoding plainly after 2 failed rounds; last: token 1 ("🚀\\n") does not fit\n')
    value = _spec_headers(GenerationResult("", stats))["x-bspec"]
    value.encode("latin-1")
    assert value.isprintable() and value.count('"') == 2


def test_a_length_end_counted_by_the_server_needs_no_tokenizer_to_agree():
    """A text need not tokenize as it was generated (vLLM: 96 emoji-list
    tokens re-tokenize as 94).  Where one stream from the prompt ran to its
    length end, the server's usage is the count: no plain call again."""
    fake = target("vllm", "earliest-end")
    fake.echo = "refuse"
    prompt = "Write freely about integers. "
    calls = []

    async def tokenize(request: httpx.Request) -> httpx.Response:
        response = await fake.handle_async(request)
        body = json.loads(request.content)
        if body.get("prompt", "") != prompt:  # prompt + text: two tokens fewer than generated
            data = json.loads(response.content)
            data["tokens"], data["count"] = data["tokens"][:-2], len(data["tokens"]) - 2
            return httpx.Response(200, json=data)
        return response

    async def completions(request: httpx.Request) -> httpx.Response:
        calls.append(json.loads(request.content))
        return await fake.handle_async(request)

    async def run():
        with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
            router.post("/completions").mock(side_effect=completions)
            router.post(ROOT + "/tokenize").mock(side_effect=tokenize)
            router.post(ROOT + "/detokenize").mock(side_effect=fake.handle_async)
            async with SpecClient(BASE_URL, API_KEY, "fake-model", strategy="auto", drafter="ngram", profile="off") as c:
                await c.probe()
                calls.clear()
                return await c.generate(prompt, max_tokens=30)

    result = asyncio.run(run())
    assert (result.text, result.finish_reason) == fake.generate(prompt, 30)[:2] and result.finish_reason == "length"
    assert not any("does not confirm" in n for n in result.stats.notes)
    assert len([c for c in calls if c["prompt"] == prompt]) == 1  # the stream only; no plain call from the prompt

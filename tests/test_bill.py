"""The bill (``blackbox_spec._bill``): every request a generation makes is
counted, cancelled streams included, against what the server itself billed
(a simulated server keeps its own count), and priced against one plain call."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import httpx
import pytest
import respx

from blackbox_spec import SpecClient
from blackbox_spec._bill import Bill, Price, PromptSizes, counting, stream_output_estimate
from blackbox_spec._exceptions import ConfigurationError
from blackbox_spec._target import TargetAPI
from blackbox_spec.bench.real_edits import REAL_PROMPTS
from blackbox_spec.testing.fake_target import FakeTarget
from blackbox_spec.testing.sim import SimulatedTarget, load_recordings

RECORDINGS = {r.name: r for r in load_recordings()}


def client(sim, **options) -> SpecClient:
    return SpecClient(f"http://sim-{id(sim)}/v1", "sk-sim", sim.model_name, transport=sim.transport(), profile="off", **options)


def test_a_price_is_read_from_its_short_form_and_bad_ones_are_refused():
    assert Price.parse("in=2.5,cached=1.25,out=10") == Price(2.5, 1.25, 10.0)
    assert Price.parse("input=3, output=15") == Price(3.0, 3.0, 15.0)  # cached defaults to the input price
    bill = Bill(requests=2, prompt_tokens=3_000_000, cached_tokens=1_000_000, output_tokens=500_000)
    assert Price(2.0, 0.5, 8.0).cost(bill) == pytest.approx(2 * 2.0 + 1 * 0.5 + 0.5 * 8.0)
    for bad in ("in=1", "out=4", "in=1,out=x", "in=1;out=4", "in=-1,out=4", "price=3"):
        with pytest.raises(ConfigurationError, match="bad price"):
            Price.parse(bad)


def test_a_stream_closed_early_is_billed_what_it_decoded_until_the_close():
    # 5 tokens arrived over 0.4 s (a step every 0.1 s), closed 0.35 s after the last.
    assert stream_output_estimate(5, [0.0, 0.1, 0.2, 0.3, 0.4], 0.75) == 5 + 3
    assert stream_output_estimate(1, [0.0], 9.0) == 1  # no pace to go by: what arrived
    assert stream_output_estimate(0, [], 1.0) == 0


def test_a_prompt_no_usage_came_for_is_estimated_from_the_reported_ones():
    sizes = PromptSizes()
    assert sizes.estimate("chat", 350) == 100  # nothing reported: ~3.5 characters a token
    sizes.learn("chat", 1000, 300)
    sizes.learn("chat", 3000, 800)
    assert sizes.estimate("chat", 1000) == 300  # reported: exactly
    assert sizes.estimate("chat", 2000) == 550  # between two: on the line through them
    sizes.learn_text(3000, 1000)  # answers run 3 characters a token
    assert sizes.estimate("chat", 3600) == 800 + 200  # past the last: its count plus the rest at that rate
    # A generation's own reported prompts come first (the same prompt, more or less drafted text).
    assert sizes.estimate("chat", 2000, {("chat", 1900): 700}) == 700 + 33


@pytest.mark.parametrize("edit", ["r-deploy-yaml", "r-rename-go"])
async def test_the_clients_bill_matches_what_the_server_billed_cancelled_branches_included(edit):
    recording = RECORDINGS[edit]
    sim = SimulatedTarget.preset("gpu", replay=True, model_name="sim")
    async with client(sim) as c:
        result = await c.generate(recording.prompt, max_tokens=len(recording.tokens) + 1)
    assert result.text.encode() == b"".join(recording.tokens)
    ours, theirs = result.stats.bill, sim.bill
    assert ours.requests == theirs.requests == sim.counts["requests"]
    # Exact where usage came; a closed stream's prompt is estimated (and said to be).
    assert ours.prompt_tokens == pytest.approx(theirs.prompt_tokens, rel=0.05)
    assert ours.output_tokens == pytest.approx(theirs.output_tokens, rel=0.15, abs=3)
    assert (ours.estimated_tokens > 0) == (result.stats.cancelled_calls > 0 or ours.prompt_tokens != theirs.prompt_tokens)
    # Against one plain call: that prompt, that output.
    plain = result.stats.plain_bill
    assert plain.requests == 1 and plain.output_tokens == result.stats.output_tokens == len(recording.tokens) + 1
    assert plain.prompt_tokens == pytest.approx(len(sim.model.tokenizer.encode(recording.prompt)), rel=0.15)
    assert result.stats.bill_ratio == pytest.approx(Price.parse("in=1,cached=0.25,out=4").cost(ours) / Price.parse("in=1,cached=0.25,out=4").cost(plain))


async def test_plain_decoding_bills_exactly_one_plain_call():
    recording = RECORDINGS["r-typos-md"]
    sim = SimulatedTarget.preset("gpu", replay=True, model_name="sim")
    async with client(sim, drafter=None, price="in=2,cached=1,out=8") as c:
        result = await c.generate(recording.prompt, max_tokens=len(recording.tokens) + 1)
    assert result.stats.bill == result.stats.plain_bill == Bill(1, len(sim.model.tokenizer.encode(recording.prompt)), 0, len(recording.tokens) + 1)
    assert sim.bill == result.stats.bill
    assert result.stats.bill_ratio == 1.0
    data = result.stats.to_dict()
    assert data["cost"] == data["plain_cost"] == pytest.approx((data["bill"]["prompt_tokens"] * 2 + data["bill"]["output_tokens"] * 8) / 1e6)


async def test_generations_at_once_on_one_client_keep_their_own_bills():
    names = ["r-rename-go", "r-typos-md", "r-const-js"]
    sim = SimulatedTarget.preset("gpu", replay=True, model_name="sim")
    async with client(sim) as c:
        results = await c.generate_many([RECORDINGS[n].prompt for n in names], max_tokens=200, concurrency=3)
    bills = [r.stats.bill for r in results]
    # Every request the server saw is on exactly one bill (the probe's on one
    # of them).  A call cancelled as it starts may not reach the server, and
    # is billed all the same (a bill may overstate, never understate): seen
    # under the full suite's load, 93 billed against 92 received.
    cancelled = sum(r.stats.cancelled_calls for r in results)
    assert sim.bill.requests <= sum(b.requests for b in bills) <= sim.bill.requests + min(cancelled, 2)
    assert all(b.requests >= 1 and b.output_tokens >= 1 for b in bills)
    for r, name in zip(results, names):
        assert r.stats.bill.prompt_tokens >= len(sim.model.tokenizer.encode(RECORDINGS[name].prompt))


async def test_a_hosted_apis_prefix_cache_shows_in_usage_and_on_the_bill():
    # The hosted preset bills a prompt prefix shared with an earlier request
    # as cached, from 1,024 tokens in steps of 128, as OpenAI does.
    sim = SimulatedTarget.preset("hosted", rtt_s=0.0, decode_s=0.0, model_name="sim")
    long = [{"role": "user", "content": "Summarise these notes. " + " ".join(f"note {k} says item {k * 7} is done." for k in range(260))}]
    async with client(sim, drafter=None, price="in=1,cached=0.25,out=4") as c:
        first = await c.chat(long, max_tokens=8)
        second = await c.chat(long, max_tokens=8)
    prompt = first.stats.bill.prompt_tokens
    assert prompt > 1100 and first.stats.bill.cached_tokens == 0
    assert second.stats.bill.cached_tokens == (prompt - 1) // 128 * 128 or second.stats.bill.cached_tokens == prompt // 128 * 128
    assert second.stats.bill.cached_tokens >= 1024 and sim.bill.cached_tokens == second.stats.bill.cached_tokens
    assert second.stats.to_dict()["cost"] < first.stats.to_dict()["cost"]


@respx.mock
async def test_cached_prompt_tokens_are_read_in_each_providers_form():
    forms = [{"prompt_tokens_details": {"cached_tokens": 1152}}, {"prompt_cache_hit_tokens": 640, "prompt_cache_miss_tokens": 860}, {}]
    api = TargetAPI("http://api.test/v1", "sk-test", "m")
    bill = Bill()
    for extra in forms:
        respx.post("http://api.test/v1/completions").mock(return_value=httpx.Response(200, json={
            "choices": [{"text": " ok", "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1500, "completion_tokens": 1, **extra},
        }))
        with counting(bill):
            c = await api.complete("x" * 100, max_tokens=1)
        assert c.usage.cached_tokens == {0: 1152, 1: 640, 2: None}[forms.index(extra)]
    assert bill == Bill(3, 4500, 1152 + 640, 3)
    await api.aclose()


async def test_a_given_price_is_kept_in_the_servers_profile_for_later_runs():
    fake = FakeTarget()
    url = "http://priced.test/v1"
    async with SpecClient(url, "sk", "fake-model", transport=httpx.MockTransport(fake.handle), price="in=3,out=15") as c:
        first = await c.generate("def add(a, b):", max_tokens=12)
    assert first.stats.price == Price(3.0, 3.0, 15.0)
    async with SpecClient(url, "sk", "fake-model", transport=httpx.MockTransport(fake.handle)) as c:
        later = await c.generate("def add(a, b):", max_tokens=12)
    assert later.stats.price == Price(3.0, 3.0, 15.0) and "cost" in later.stats.to_dict()
    assert "$" in later.stats.bill_summary()


# -- the limit (``max_cost``) ------------------------------------------------------


def test_the_default_limit_follows_the_host():
    from blackbox_spec._budget import default_max_cost

    for private in ("http://127.0.0.1:8000/v1", "http://[::1]:8000/v1", "http://192.168.1.20/v1", "http://gpu-box:8000/v1",
                    "http://vllm.internal/v1", "http://api.test/v1", "http://localhost/v1"):
        assert default_max_cost(private) is None, private
    for paid in ("https://api.openai.com/v1", "https://api.deepseek.com/beta", "http://8.8.8.8/v1"):
        assert default_max_cost(paid) == 2.0, paid
    assert SpecClient("https://api.example/v1", "sk", "m").max_cost is None  # (.example: reserved, never a paid API)
    assert SpecClient("https://api.openai.com/v1", "sk", "m").max_cost == 2.0
    assert SpecClient("https://api.openai.com/v1", "sk", "m", max_cost=float("inf")).max_cost is None
    with pytest.raises(ConfigurationError, match="max_cost must be a number >= 1"):
        SpecClient("http://127.0.0.1:9/v1", "sk", "m", max_cost=0.5)


async def test_a_limit_near_plains_bill_decodes_plainly_with_no_probe():
    # (Below 2x a fresh process's probe and one speculative request would not both fit.)
    recording = RECORDINGS["r-rename-go"]
    for preset, limit in (("gpu", 1.0), ("hosted", 1.6)):
        sim = SimulatedTarget.preset(preset, replay=True, model_name="sim", decode_s=0.005, rtt_s=0.01)
        async with client(sim, max_cost=limit) as c:
            if sim.completions:
                result = await c.generate(recording.prompt, max_tokens=120)
            else:
                prompt = next(p for p in REAL_PROMPTS if p.name == "r-rename-go")
                result = await c.chat(prompt.messages, max_tokens=120)
        assert result.text.encode() == b"".join(recording.tokens[:120])
        assert sim.bill.requests == 1 and result.stats.bill == sim.bill == result.stats.plain_bill, preset
        assert any("max_cost" in note for note in result.stats.notes), preset  # (and says why)


@pytest.mark.parametrize("limit", [2.0, 2.5])
async def test_speculation_keeps_the_bill_within_its_limit(limit):
    # Copies long enough that, unlimited, side branches bill several times
    # plain's prompt (hosted: every request bills its whole prompt, no echo).
    names = ["r-rename-go", "r-typos-md"]
    price = Price.parse("in=1,cached=0.25,out=4")
    for name in names:
        prompt = next(p for p in REAL_PROMPTS if p.name == name)
        budget = len(RECORDINGS[name].tokens) + 1
        bills = {}
        for max_cost in (limit, None):
            # (The hosted preset's shape, a round trip of 6 steps, at a third of its time.)
            sim = SimulatedTarget.preset("hosted", replay=True, model_name="sim", decode_s=0.008, rtt_s=0.048)
            async with client(sim, max_cost=max_cost, price=price) as c:
                await c.probe_chat()  # (a fresh process's probe is the profile's to save; here, apart)
                before, asked = replace(sim.bill), len(sim.requests)
                result = await c.chat(prompt.messages, max_tokens=budget)
            sent = sim.requests[asked:]
            assert result.text.encode() == b"".join(RECORDINGS[name].tokens)
            spent = Bill(*(getattr(sim.bill, k) - getattr(before, k) for k in ("requests", "prompt_tokens", "cached_tokens", "output_tokens")))
            bills[max_cost] = price.cost(spent) / price.cost(result.stats.plain_bill)
            if max_cost is not None:
                # The answer's opening copy goes out with its first request (a
                # branch far into it pays for itself where it lands); weighed
                # on the text so far alone, the first branch waited ~20 tokens.
                first, branch = sent[0]["max_tokens"], sent[1]["max_tokens"]
                assert branch == first and result.stats.jumps >= 1, (name, first, branch)
        assert bills[limit] <= limit * 1.02, (name, bills)
        assert bills[None] > limit, (name, bills)  # (unlimited, it would have spent more)


def test_a_request_is_weighed_where_it_would_land():
    # Plain's bill of the text so far is its prompt alone: a branch that
    # bills a second prompt fits a limit of 2 only counting the text it
    # would confirm (``covers``); and never past what that text pays for.
    from blackbox_spec._bill import PromptSizes
    from blackbox_spec._budget import Budget

    class Text:
        tokens = 0

    price, bill = Price.parse("in=1,cached=0.25,out=4"), Bill()
    budget = Budget(2.0, price, bill, PromptSizes(), ("completions", 350 * 4), Text())
    prompt = budget.plain_cost() * 1e6  # (the prompt's tokens, estimated from its characters)
    assert not budget.affords(prompt + 96)
    assert budget.affords(prompt + 96, covers=96)
    assert not budget.affords(3 * prompt, requests=3, covers=96)
    assert budget.affords(3 * prompt, requests=3, covers=4 * prompt)


def test_a_long_copy_is_not_weighed_past_the_answers_max_tokens():
    # 220 tokens written, a 190-token copy ahead, and a bill that leaves room
    # for one more branch only if the text went on past the answer's end.
    from blackbox_spec._bill import PromptSizes
    from blackbox_spec._budget import Budget
    from blackbox_spec.policy import Policy, ServerCosts

    class Text:
        tokens = 220

    policy = Policy(["branches"], ServerCosts(round_trip_s=0.15))
    policy.context_tokens = 313 + Text.tokens
    spent = Bill(requests=2, prompt_tokens=1000, output_tokens=300)  # 2,200 at relative prices
    policy.budget = Budget(2.0, Price.parse("in=1,cached=0.25,out=4"), spent, PromptSizes(), ("chat", 313 * 7 // 2), Text())
    draft = "x = 1\n" * 110
    assert policy._billed_outlook(draft, 64, 400, None) is not None  # (the answer may go on: it fits)
    assert policy._billed_outlook(draft, 64, 30, None) is None  # 30 tokens left: it does not


async def test_on_a_gpu_server_echo_checks_drafts_instead_of_wide_groups():
    """No limit (a private GPU server): the speed is what counts, but
    groups of 16 side branches, each carrying the whole context, sent 80x
    plain's prompt tokens on this edit for no more speed than one echo
    request a draft (``Tuning.cheap_echo_width``).  (Steps of 30 ms, not
    15: an echo round stays a few steps on a loaded machine.)"""
    recording = RECORDINGS["r-deploy-yaml"]
    sim = SimulatedTarget.preset("gpu", replay=True, model_name="sim")
    async with client(sim) as c:
        result = await c.generate(recording.prompt, max_tokens=len(recording.tokens) + 1)
    assert result.text.encode() == b"".join(recording.tokens)
    stats = result.stats
    assert stats.strategy_rounds.get("echo", 0) >= 2, stats.strategy_rounds
    assert stats.bill.prompt_tokens < 20 * stats.plain_bill.prompt_tokens, stats.bill

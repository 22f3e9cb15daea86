"""Pure pieces: the fake target's own guarantees, fan-out helpers, policy."""

from __future__ import annotations

from blackbox_spec._tokens import Unit
from blackbox_spec.policy import Policy
from blackbox_spec.testing import FakeTarget
from blackbox_spec.verifiers import Plan, Verdict
from blackbox_spec.verifiers.fanout import likely_boundaries, units_through

# -- the fake target is as hard as promised ------------------------------------


def test_fake_prediction_depends_on_tokens_not_text():
    fake = FakeTarget()
    tok = fake.tokenizer
    whole = tok.encode(" the")
    assert len(whole) == 1  # " the" is one token...
    split = tok.encode(" ") + tok.encode("the")
    # ...so a context cut inside it is another state with another prediction
    ctx = tok.encode("Read the text and read")
    a = fake.model.state(ctx + whole).ranked()[0][0]
    b = fake.model.state(ctx + split).ranked()[0][0]
    assert a != b


def test_fake_greedy_paths_are_canonical_and_round_trip():
    fake = FakeTarget()
    for prompt in ["def add(a, b):\n", "你好世界，今天", "Hi 😀 and 🚀", "x"]:
        text, _, ids = fake.generate(prompt, 80)
        ids = [i for i in ids if i != fake.tokenizer.eos_id]
        assert fake.tokenizer.encode(prompt + fake.tokenizer.decode(ids)) == fake.tokenizer.encode(prompt) + ids


def test_fake_shows_partial_bytes_like_vllm():
    tok = FakeTarget().tokenizer
    ids = tok.encode("😀")
    assert len(ids) == 2 and [tok.token_text(i) for i in ids] == ["\ufffd", "\ufffd"]


# -- fan-out helpers -------------------------------------------------------------


def units(*texts: str) -> list[Unit]:
    out, pos = [], 0
    for t in texts:
        out.append(Unit(t, 1, pos))
        pos += len(t)
    return out


def test_units_through_requires_a_boundary_at_the_offset():
    draft = "def f(x): return x"
    assert [u.text for u in units_through(units("def", " f", "(x"), draft, 0, 5)] == ["def", " f"]
    assert units_through(units("def", " f(", "x"), draft, 0, 5) is None  # token crosses the offset
    assert units_through(units("def", " g"), draft, 0, 5) is None  # leaves the draft
    assert units_through(units("def"), draft, 0, 5) is None  # stops short


def test_likely_boundaries_prefer_spaces():
    draft = "alpha beta gamma delta epsilon"
    offsets = likely_boundaries(draft, 3, 10)
    assert offsets[0] == 0 and all(draft[o] == " " for o in offsets[1:])
    assert offsets == sorted(set(offsets))


# -- policy -------------------------------------------------------------------


def verdict(tokens: int, seconds: float) -> Verdict:
    return Verdict([Unit("ab", 1, 2 * i) for i in range(tokens)], seconds=seconds)


def test_policy_tries_each_strategy_then_keeps_the_fastest():
    policy = Policy(["echo", "fanout"], explore_every=100)
    seen = []
    for _ in range(3):
        plan = policy.plan(plain_next=False, remaining=100)
        seen.append(plan.strategy)
        speed = {"echo": (10, 1.0), "fanout": (30, 1.0), "plain": (5, 1.0)}[plan.strategy]
        policy.observe(plan, verdict(*speed), 40, 20)
    assert seen == ["echo", "fanout", "plain"]
    assert policy.plan(plain_next=False, remaining=100).strategy == "fanout"


def test_policy_falls_back_to_plain_when_drafts_do_not_pay():
    policy = Policy(["echo"], explore_every=100)
    for strategy, speed in (("echo", (1, 1.0)), ("plain", (16, 1.0))):
        plan = policy.plan(plain_next=False, remaining=100)
        assert plan.strategy == strategy
        policy.observe(plan, verdict(*speed), 40, 0)
    assert policy.plan(plain_next=False, remaining=100).strategy == "plain"


def test_policy_explores_the_runner_up_now_and_then():
    policy = Policy(["echo"], explore_every=4)
    policy.observe(Plan("echo"), verdict(10, 1.0), 40, 40)
    policy.observe(Plan("plain"), verdict(1, 1.0), 0, 0)
    choices = [policy.choose() for _ in range(8)]
    assert choices.count("plain") == 2 and choices.count("echo") == 6


def test_draft_length_follows_acceptance():
    policy = Policy(["echo"], start_draft_chars=64, min_draft_chars=16, max_draft_chars=256)
    policy.observe(Plan("echo"), verdict(5, 1.0), 64, 64)
    assert policy.draft_chars["echo"] == 128
    policy.observe(Plan("echo"), verdict(1, 1.0), 128, 10)
    assert policy.draft_chars["echo"] == 64
    for _ in range(10):
        policy.observe(Plan("echo"), verdict(1, 1.0), 64, 0)
    assert policy.draft_chars["echo"] == 16


def test_plain_chunks_grow_and_respect_the_budget():
    policy = Policy([])
    sizes = []
    for _ in range(6):
        plan = policy.plain(remaining=1000)
        sizes.append(plan.tokens_per_request)
        policy.observe(plan, verdict(plan.tokens_per_request, 1.0), 0, 0)
    assert sizes == sorted(sizes) and sizes[-1] > sizes[0]
    assert policy.plain(remaining=3).tokens_per_request == 3


def test_forced_and_dropped_strategies():
    policy = Policy(["echo", "fanout"], forced="fanout")
    assert policy.plan(plain_next=False, remaining=10).strategy == "fanout"
    assert policy.plan(plain_next=True, remaining=10).strategy == "plain"
    policy.drop("fanout")
    assert policy.forced is None and policy.strategies == ["echo"]

"""Every branch of one verification round, forced with scripted drafts.

The drafter below proposes a fixed text once, then nothing, so each test
decides exactly what the target is asked to check."""

from __future__ import annotations

import pytest

from blackbox_spec.testing import FakeTarget

from .conftest import PROMPTS, client_for


class ScriptedDrafter:
    name = "scripted"

    def __init__(self, draft: str) -> None:
        self.draft = draft
        self.used = False
        self.updates: list[tuple[str, str, int]] = []

    def start(self, prompt: str) -> None:
        self.used = False

    def propose(self, max_chars: int) -> str:
        if self.used:
            return ""
        self.used = True
        return self.draft

    def update(self, accepted: str, draft: str, accepted_draft_chars: int) -> None:
        self.updates.append((accepted, draft, accepted_draft_chars))


def plain(fake: FakeTarget, prompt: str, max_tokens: int = 60, stop=None) -> str:
    return fake.generate(prompt, max_tokens, stop)[0]


async def spec(prompt, draft, *, strategy, max_tokens=60, stop=None, width=3):
    drafter = ScriptedDrafter(draft)
    async with client_for(drafter=drafter, strategy=strategy, fanout_width=width) as client:
        result = await client.generate(prompt, max_tokens=max_tokens, stop=stop)
    return result, drafter


STRATEGIES = ["echo", "fanout"]


def first_tokens(fake: FakeTarget, prompt: str, k: int) -> str:
    """The text of the target's first ``k`` tokens: a draft that ends on one of its boundaries."""
    _, _, ids = fake.generate(prompt, k)
    return fake.tokenizer.decode(ids)


@pytest.mark.parametrize("strategy", STRATEGIES)
async def test_all_accepted(served, strategy):
    prompt = PROMPTS["code"]
    truth = plain(served, prompt)
    draft = first_tokens(served, prompt, 12)
    result, drafter = await spec(prompt, draft, strategy=strategy)
    assert result.text == truth
    first_round = drafter.updates[0]
    assert first_round[2] == len(draft)  # every drafted character accepted
    assert len(first_round[0]) > len(draft)  # plus the target's own next token(s)
    assert result.stats.accepted_tokens > 0


@pytest.mark.parametrize("strategy", STRATEGIES)
async def test_first_token_rejected(served, strategy):
    prompt = PROMPTS["prose"]
    truth = plain(served, prompt)
    wrong = "\u2603" + truth[1:40]  # a snowman the target never writes
    result, drafter = await spec(prompt, wrong, strategy=strategy)
    assert result.text == truth
    assert drafter.updates[0][2] == 0
    assert result.stats.accepted_tokens == 0


@pytest.mark.parametrize("strategy", STRATEGIES)
async def test_rejected_mid_draft(served, strategy):
    prompt = PROMPTS["code"]
    truth = plain(served, prompt)
    cut = truth.index(" ", 12) if " " in truth[12:] else 12
    wrong = truth[:cut] + "\u2603\u2603" + truth[cut:60]
    result, drafter = await spec(prompt, wrong, strategy=strategy)
    assert result.text == truth
    accepted_chars = drafter.updates[0][2]
    assert 0 < accepted_chars <= cut


@pytest.mark.parametrize("strategy", STRATEGIES)
async def test_empty_draft_just_continues(served, strategy):
    prompt = PROMPTS["prose"]
    result, drafter = await spec(prompt, "", strategy=strategy)
    assert result.text == plain(served, prompt)
    assert result.stats.drafted_chars == 0 and result.stats.accepted_tokens == 0
    assert set(result.stats.strategy_rounds) == {"plain"}


@pytest.mark.parametrize("strategy", STRATEGIES)
async def test_stop_inside_the_draft(served, strategy):
    prompt = PROMPTS["code"]
    truth = plain(served, prompt, 80)
    stop = truth[20:23]  # a stop string that lies inside a correct draft
    expected = plain(served, prompt, 80, [stop])
    assert len(expected) < len(truth)
    result, _ = await spec(prompt, truth, strategy=strategy, max_tokens=80, stop=[stop])
    assert result.text == expected and stop not in result.text
    assert result.finish_reason == "stop"


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("max_tokens", [1, 2, 5, 9])
async def test_max_tokens_inside_the_draft(served, strategy, max_tokens):
    prompt = PROMPTS["code"]
    truth = plain(served, prompt, 60)
    result, _ = await spec(prompt, truth, strategy=strategy, max_tokens=max_tokens)
    assert result.text == plain(served, prompt, max_tokens)
    assert result.stats.output_tokens == max_tokens
    assert result.finish_reason == "length"


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", ["cjk", "emoji", "mixed"])
async def test_unicode_at_the_boundaries(served, strategy, name):
    prompt = PROMPTS[name]
    truth = plain(served, prompt, 60)
    for draft in (truth, truth[:7], truth[:1] + "x" + truth[2:]):
        result, _ = await spec(prompt, draft, strategy=strategy)
        assert result.text == truth
        assert "\ufffd" not in result.text or "\ufffd" in truth


@pytest.mark.parametrize("max_tokens", range(1, 12))
async def test_max_tokens_inside_a_multi_token_character(served, max_tokens):
    """The budget may end inside an emoji the target spreads over tokens:
    the output must still be what the server renders for a plain call."""
    prompt = "🚀🚀🚀🚀🚀🚀 go 🚀🚀🚀🚀🚀🚀 go 🚀🚀"
    truth = plain(served, prompt, max_tokens)
    result, _ = await spec(prompt, plain(served, prompt, 40), strategy="echo", max_tokens=max_tokens)
    assert result.text == truth


async def test_target_ends_its_text_inside_the_draft(served):
    for n in range(300):
        prompt = f"item {n}.\nitem {n + 1}.\n"
        truth, finish, _ = served.generate(prompt, 80)
        if finish == "stop":
            break
    else:
        raise AssertionError("the fake never ended its text for these prompts")
    result, _ = await spec(prompt, truth + " and more text after the end", strategy="echo", max_tokens=80)
    assert result.text == truth and result.finish_reason == "stop"

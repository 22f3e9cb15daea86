"""Issue 17 on real servers: emoji, CJK, stop strings, each server's rules.

Each text is compared with one plain, non-streamed call to the same server
(``bench.exactness.plain_answer``): the reference bspec matches.  The full
run (50+ prompts, three strategies) is ``benchmarks/exactness_real.py``.
"""

from __future__ import annotations

import pytest

from blackbox_spec import SpecClient
from blackbox_spec.bench.exactness import CASES, compare

from .test_real_servers import assert_same

pytestmark = pytest.mark.real

BY_NAME = {c.name: c for c in CASES}
VLLM_AUTO = ["emoji-repeat-cut-2", "emoji-stop-split", "cjk-stop-split", "translate-zh-stop", "code-block-stops",
             "overlapping-stops", "json-cjk", "crlf-lines", "zwj-family"]
VLLM_FORCED = ["emoji-repeat", "cjk-stop-split", "code-block-stops-reversed"]
LLAMA_AUTO = ["emoji-repeat-cut-6", "emoji-stop-split", "translate-zh-stop", "code-block-stops", "json-cjk"]


async def _check(target, strategy: str, name: str) -> None:
    case = BY_NAME[name]
    async with SpecClient(target.base_url, model=target.model, strategy=strategy) as client:
        outcome = await compare(client, case)
    await assert_same(target, name, case.prompt, outcome.plain, outcome.spec, strategy, case.max_tokens)
    if outcome.plain == outcome.spec:
        assert outcome.spec_finish == outcome.plain_finish


@pytest.mark.parametrize("name", VLLM_AUTO)
async def test_vllm_unicode_and_stops_equal_the_plain_call(vllm_target, name):
    await _check(vllm_target, "auto", name)


@pytest.mark.parametrize("strategy", ["echo", "fanout"])
@pytest.mark.parametrize("name", VLLM_FORCED)
async def test_vllm_forced_strategies_on_split_characters(vllm_target, strategy, name):
    await _check(vllm_target, strategy, name)


@pytest.mark.parametrize("name", LLAMA_AUTO)
async def test_llama_server_unicode_and_stops_equal_the_plain_call(llama_target, name):
    await _check(llama_target, "auto", name)


@pytest.mark.parametrize("fixture, rule", [("vllm_target", "earliest-end"), ("llama_target", "earliest-start")])
async def test_each_servers_stop_rule_is_learned(request, fixture, rule):
    """vLLM 0.32 lets the stop string that completes first win, llama.cpp the
    one that starts first: the probe tells them apart in two calls."""
    target = request.getfixturevalue(fixture)
    async with SpecClient(target.base_url, model=target.model) as client:
        assert await client.learn_stop_rule() == rule


@pytest.mark.parametrize("strategy", ["auto", "echo", "fanout"])
async def test_vllm_prompt_ending_inside_a_word_is_decoded_plainly(vllm_target, strategy):
    """"…Par" + "is" comes back as one token: no speculative call is sent.

    In auto the client may never get as far as sending text back (what the
    profile of earlier runs says decides it), so only the forced strategies,
    which always do, must have found the merge."""
    prompt = "The capital of France is Par"
    async with SpecClient(vllm_target.base_url, model=vllm_target.model, strategy=strategy) as client:
        result = await client.generate(prompt, max_tokens=24)
    async with SpecClient(vllm_target.base_url, model=vllm_target.model, drafter=None) as plain:
        expected = await plain.generate(prompt, max_tokens=24)
    assert result.text == expected.text
    if strategy != "auto":
        assert any("become one token" in note for note in result.stats.notes)

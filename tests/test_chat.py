"""Speculation over /v1/chat/completions against the mocked API: exact
against a plain chat call on every kind of server (continues a partial
assistant message when asked, always, or never; a template that trims
whitespace; strict about unknown fields), the probe's verdicts, vLLM's
prompt_logprobs as echo, and Predicted Outputs pass-through."""

from __future__ import annotations

import json

import httpx
import pytest
import respx

from blackbox_spec import ConfigurationError, PromptError
from blackbox_spec._scoring import content_start, prompt_positions
from blackbox_spec.chat import ChatTurn, conversation_text
from blackbox_spec.testing import FakeTarget

from .conftest import BASE_URL, PROMPTS, chat_of, client_for, over_http


def plain_chat(fake: FakeTarget, messages: list[dict], max_tokens: int, stop: list[str] | None = None) -> tuple[str, str]:
    """What one plain temperature-0 chat call answers (the fake, asked directly)."""
    body = {"model": "fake-model", "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    if stop:
        body["stop"] = stop
    answer = fake.handle(httpx.Request("POST", BASE_URL + "/chat/completions", json=body)).json()
    choice = answer["choices"][0]
    return choice["message"]["content"], choice["finish_reason"]


@pytest.mark.parametrize("strategy", ["auto", "echo", "fanout"])
@pytest.mark.parametrize("name", sorted(PROMPTS))
async def test_chat_equals_a_plain_chat_call(served, strategy, name):
    messages = chat_of(PROMPTS[name], system="Repeat the text.")
    truth, finish = plain_chat(served, messages, 80)
    async with client_for(strategy=strategy) as client:
        result = await client.chat(messages, max_tokens=80)
        support = client.chat_support
    assert result.text == truth and result.finish_reason == finish
    assert support is not None and support.speculative and support.prompt_logprobs
    assert support.prefill == {"continue_final_message": True, "add_generation_prompt": False}
    if strategy != "auto":
        assert result.stats.strategy_rounds.get(strategy, 0) >= 1, result.stats.strategy_rounds


async def test_echo_rounds_confirm_drafts_from_prompt_logprobs(served):
    """A conversation the fake copies: echo rounds accept drafted tokens,
    each round one call with prompt_logprobs and a prefilled message."""
    messages = chat_of(PROMPTS["code"] * 3)
    async with client_for(strategy="echo") as client:
        result = await client.chat(messages, max_tokens=120)
    assert result.text == plain_chat(served, messages, 120)[0]
    assert result.stats.accepted_tokens > 0
    prefilled = [r for r in served.requests if r.get("prompt_logprobs") == 1 and r.get("continue_final_message")]
    assert prefilled and all(r["messages"][-1]["role"] == "assistant" for r in prefilled)


@pytest.mark.parametrize("stop_at", [5, 17, 40])
async def test_chat_stop_strings(served, stop_at):
    messages = chat_of(PROMPTS["json"])
    truth = plain_chat(served, messages, 80)[0]
    stop = [truth[stop_at : stop_at + 3]]
    async with client_for() as client:
        result = await client.chat(messages, max_tokens=80, stop=stop)
    assert (result.text, result.finish_reason) == plain_chat(served, messages, 80, stop)


async def test_no_logprobs_on_chat_means_plain_chat(fake):
    served = fake

    def refuse_logprobs(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content).get("logprobs"):
            return httpx.Response(400, json={"error": {"message": "logprobs are not supported"}})
        return served.handle(request)

    messages = chat_of(PROMPTS["prose"])
    with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
        router.post("/chat/completions").mock(side_effect=refuse_logprobs)
        async with client_for() as client:
            result = await client.chat(messages, max_tokens=30)
            assert "no logprobs" in client.chat_support.reason
    assert result.text == plain_chat(served, messages, 30)[0] and result.stats.fallback == "plain chat"


async def test_the_chat_probe_runs_once_per_client(served):
    messages = chat_of(PROMPTS["code"])
    async with client_for() as client:
        await client.chat(messages, max_tokens=20)
        probes = len(served.requests)
        await client.chat(messages, max_tokens=20)
        await client.chat(chat_of(PROMPTS["prose"]), max_tokens=20)
    probe_like = [r for r in served.requests[probes:] if "Count from 1 to 40" in json.dumps(r.get("messages"))]
    assert probes >= 6 and not probe_like


async def test_stream_chat_pieces_add_up(served):
    messages = chat_of(PROMPTS["mixed"])
    async with client_for() as client:
        stream = client.stream_chat(messages, max_tokens=60)
        pieces = [p async for p in stream]
    assert "".join(pieces) == stream.result.text == plain_chat(served, messages, 60)[0]


@pytest.mark.parametrize("messages, message", [
    ([], "non-empty list"),
    ("hello", "non-empty list"),
    ([{"content": "hi"}], "'role'"),
    ([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "text 'content'"),
])
async def test_bad_messages_are_one_line_errors(served, messages, message):
    async with client_for() as client:
        with pytest.raises(PromptError, match=message):
            await client.chat(messages, max_tokens=5)


# -- Predicted Outputs ---------------------------------------------------------------


async def test_prediction_is_sent_and_its_usage_reported(served):
    served.predicted_outputs = True
    messages = chat_of(PROMPTS["code"])
    truth = plain_chat(served, messages, 40)[0]
    prediction = truth[:50] + "something else entirely"
    async with client_for(prediction_mode="server") as client:
        result = await client.chat(messages, max_tokens=40, prediction=prediction)
    sent = [r for r in served.requests if "prediction" in r]
    assert len(sent) == 1 and sent[0]["prediction"] == {"type": "content", "content": prediction}
    assert "continue_final_message" not in sent[0] and not sent[0].get("logprobs")  # plain: the server speculates
    assert result.text == truth
    predicted = served.tokenizer.encode(prediction)
    assert 0 < result.stats.accepted_prediction_tokens < len(predicted)
    assert result.stats.accepted_prediction_tokens + result.stats.rejected_prediction_tokens == len(predicted)
    assert result.stats.to_dict()["accepted_prediction_tokens"] == result.stats.accepted_prediction_tokens


async def test_prediction_counts_absent_when_the_server_says_nothing(served):
    async with client_for() as client:
        result = await client.chat(chat_of(PROMPTS["code"]), max_tokens=20)
    assert result.stats.accepted_prediction_tokens is None and result.stats.rejected_prediction_tokens is None


async def test_prediction_must_be_text(served):
    async with client_for() as client:
        with pytest.raises(ConfigurationError, match="prediction must be a string"):
            await client.chat(chat_of("hi"), max_tokens=5, prediction=["x"])


# -- pure pieces ------------------------------------------------------------------------


def test_prompt_positions_take_the_prompt_token_and_the_first_choice():
    entries = [None, {"5": {"logprob": -0.2, "rank": 1, "decoded_token": "x"}},
               {"8": {"logprob": -3.0, "rank": 4, "decoded_token": " y"}, "2": {"logprob": -0.1, "rank": 1, "decoded_token": " z"}}]
    tokens, lps, tops = prompt_positions(entries)
    assert tokens == [None, "x", " y"] and lps == [None, -0.2, -3.0]
    assert tops[2] == {" z": -0.1, " y": -3.0}


@pytest.mark.parametrize("tokens, content, start", [
    (["<s>", "assistant", "\n", "de", "f"], "def", 3),
    (["<s>", "assistant", "\n", "de", "f"], "\ndef", 2),
    (["<s>", "assistant", "\nde", "f"], "def", None),  # a token across the message's start
    (["<s>", None, "de", "f"], "xdef", None),
    (["\ufffd", "\ufffd", "x"], "好x", None),  # unreadable: the verifier asks plainly
])
def test_content_start(tokens, content, start):
    assert content_start(tokens, content) == start


def test_chat_turn_prompt_is_the_conversation_then_the_partial_message(fake):
    messages = chat_of("hi") + [{"role": "assistant", "content": "Hel"}]
    turn = ChatTurn(None, messages, continue_final=True)  # type: ignore[arg-type]
    assert turn.prompt == conversation_text(messages[:-1]) + "Hel"
    assert turn.messages == messages[:-1]
    plain = ChatTurn(None, messages)  # type: ignore[arg-type]
    assert plain.prompt == plain.head == conversation_text(messages) and plain.messages == messages


# -- the CLI -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chat_server():
    with over_http(FakeTarget()) as served:
        yield served


def test_bspec_run_chat_equals_a_plain_chat_call(chat_server, tmp_path):
    from .test_cli import bspec, write

    fake, url = chat_server
    path = write(tmp_path, "ask.txt", PROMPTS["code"])
    run = bspec("run", path, "--chat", "--system", "Repeat the text.", "--base-url", url, "--model", "fake-model", "--max-tokens", "60", "--json")
    assert run.returncode == 0, run.stderr.decode()
    data = json.loads(run.stdout)
    assert data["text"] == plain_chat(fake, chat_of(PROMPTS["code"], system="Repeat the text."), 60)[0]
    messages = [{"role": "user", "content": PROMPTS["json"]}, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "again"}]
    path = write(tmp_path, "conversation.json", json.dumps(messages))
    run = bspec("run", path, "--chat", "--base-url", url, "--model", "fake-model", "--max-tokens", "40", "--json")
    assert json.loads(run.stdout)["text"] == plain_chat(fake, messages, 40)[0]


def test_bspec_run_chat_with_a_prediction(chat_server, tmp_path):
    from .test_cli import bspec, write

    fake, url = chat_server
    truth = plain_chat(fake, chat_of(PROMPTS["code"]), 40)[0]
    ask, predicted = write(tmp_path, "ask.txt", PROMPTS["code"]), write(tmp_path, "file.py", truth[:30])
    run = bspec("run", ask, "--chat", "--prediction", predicted, "--base-url", url, "--model", "fake-model", "--max-tokens", "40")
    assert run.returncode == 0, run.stderr.decode()
    assert run.stdout.decode().rstrip("\n") == truth
    assert "prediction tokens accepted" in run.stderr.decode()


@pytest.mark.parametrize("args, needle", [
    (["--system", "x"], "need --chat"),
    (["--prediction-mode", "server"], "needs --chat"),
    (["--continue-final"], "need --chat"),
    (["two.txt", "--chat"], "--chat takes one prompt file"),
])
def test_bspec_run_chat_misuse_is_one_line(tmp_path, args, needle):
    from .test_cli import bspec, one_line_error, write

    path = write(tmp_path, "one.txt", "hi")
    write(tmp_path, "two.txt", "there")
    args = [str(tmp_path / a) if a.endswith(".txt") else a for a in args]
    one_line_error(bspec("run", path, *args, "--base-url", "http://127.0.0.1:9/v1"), needle)


def test_bspec_run_chat_bad_json_is_one_line(tmp_path):
    from .test_cli import bspec, one_line_error, write

    path = write(tmp_path, "c.json", '[{"role": "user", "content": ')
    one_line_error(bspec("run", path, "--chat", "--base-url", "http://127.0.0.1:9/v1"), "not valid JSON")



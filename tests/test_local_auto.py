"""``--gamma auto``: the draft length and tree depth chosen from measured
costs (``blackbox_spec.local.costs``), the measurement itself
(``calibrate``), and what must not change when γ changes from round to
round: the output distribution, greedy text, and a seeded run."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch", reason="local mode needs the hf extra (torch): pip install 'blackbox-spec[hf]'")
pytestmark = pytest.mark.torch

from blackbox_spec import ConfigurationError, GenerationStats
from blackbox_spec.local import CachedLM, LocalSpeculator, LocalStats, SamplingParams
from blackbox_spec.local.costs import (
    EXPLORE_GAP, MARGIN, MAX_EXPLORE_GAP, Acceptance, Costs, DepthChooser, GammaChooser, RoundTimes, best_depth, best_gamma, chain_speedup,
    expected_tokens, tree_speedup,
)
from blackbox_spec.local.calibrate import load_costs, save_costs
from blackbox_spec.local.sampling import NO_TOKEN, as_generator
from blackbox_spec.local.static import StaticLM

from .chi_square import chi_square_p_value, joint_counts
from .test_local_engine import DEVICE, PROMPT, SETTINGS, VOCAB, small_vocab_pair, target_joint
from .tiny_models import tiny_model

CHEAP = Costs({1: 1.0, 2: 1.02, 3: 1.04, 4: 1.06, 5: 1.08, 6: 1.1, 7: 1.12}, draft_s=0.02)  # a GPU-like machine
DEAR = Costs({1: 1.0, 2: 2.0, 3: 2.7, 4: 3.4, 5: 4.1, 6: 4.8, 7: 5.5}, draft_s=0.4)  # wide steps cost what they carry


# -- the math ------------------------------------------------------------------------------------


def test_the_best_gamma_is_the_best_of_a_brute_force_over_measured_costs():
    for alpha, costs in itertools.product([0.0, 0.3, 0.6, 0.8, 0.95, 1.0], [CHEAP, DEAR, Costs({1: 0.3, 4: 0.45, 8: 0.9}, draft_s=0.1)]):
        gamma, speed = best_gamma(alpha, costs)
        by_hand = [sum(alpha**i for i in range(g + 1)) * costs.plain_s / (g * costs.draft_s + costs.verify(g + 1)) if g else 1.0 for g in range(7)]
        if max(by_hand) >= MARGIN:
            assert speed == pytest.approx(max(by_hand), abs=1e-3) and by_hand[gamma] == pytest.approx(max(by_hand))
        else:  # drafting must win by a margin, or plain it is
            assert (gamma, speed) == (0, 1.0)
    assert best_gamma(0.9, DEAR) == (0, 1.0)  # never worse than plain by the model's own account
    assert best_gamma(0.9, CHEAP)[0] >= 5
    assert expected_tokens(0.8, 0) == 1.0 and chain_speedup(0.8, 0, DEAR) == 1.0


def test_measured_widths_interpolate_and_extrapolate_linearly():
    costs = Costs({1: 1.0, 3: 2.0, 9: 3.5}, draft_s=0.0)
    assert [costs.verify(w) for w in (1, 2, 3, 5, 9, 13)] == pytest.approx([1.0, 1.5, 2.0, 2.5, 3.5, 4.5])
    assert Costs({1: 2.0}).verify(4) == 8.0  # one width: proportional
    assert Costs.from_dict(costs.to_dict()) == costs


def test_the_chooser_follows_alpha_and_looks_again_while_plain_wins():
    """Plain wins at the prior α but would lose to drafts at an optimistic
    one: a round with drafts now and then, further apart each time.  Where
    even an optimistic α cannot win (DEAR), no look at all."""
    assert set(GammaChooser(DEAR).next_gamma() for _ in range(80)) == {0}
    chooser = GammaChooser(Costs({1: 1.0, 2: 1.5, 3: 1.8, 4: 2.1, 5: 2.4, 6: 2.7, 7: 3.0}, draft_s=0.3))
    plain_run = [chooser.next_gamma() for _ in range(80)]
    explored = [i for i, g in enumerate(plain_run) if g]
    # Every EXPLORE_GAP-th round at first, the gap doubling up to MAX_EXPLORE_GAP.
    gaps = [b - a for a, b in zip([-1] + explored, explored)]
    assert set(plain_run) > {0} and gaps == [EXPLORE_GAP, 2 * EXPLORE_GAP, 4 * EXPLORE_GAP, MAX_EXPLORE_GAP], gaps
    # A look must be cheap against what is left: not near the end of a short answer.
    short = GammaChooser(chooser.costs)
    assert set(short.next_gamma(remaining=20) for _ in range(80)) == {0}
    long = GammaChooser(chooser.costs)
    assert set(long.next_gamma(remaining=1000) for _ in range(80)) != {0}
    cheap = GammaChooser(Costs({1: 1.0, 2: 1.1, 3: 1.2, 4: 1.3, 5: 1.4, 6: 1.5, 7: 1.6}, draft_s=0.05))
    first = cheap.next_gamma()
    for _ in range(20):
        cheap.observe(0.0, 3)  # drafts never right
    assert cheap.next_gamma() == 0 < first
    for _ in range(20):
        cheap.observe(0.97 * 3, 3)
    assert cheap.next_gamma() >= 5 and cheap.summary()["gamma_rounds"]["0"] == 1


def test_costs_fitted_to_the_rounds_own_times_change_the_choice():
    """Rounds that take longer than the scratch steps said (a draft step at
    twice its measured time) move γ down; a catch-up (draft time 0) and
    plain rounds' nothing-to-see leave the draft's estimate alone."""
    measured = Costs({1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0, 6: 1.0, 7: 1.0}, draft_s=0.2)
    chooser = GammaChooser(measured, times=RoundTimes())
    chooser.alpha.observe(0.8 * 40, 40)
    before = chooser.next_gamma()
    for _ in range(30):
        chooser.observe(0.8 * 3, 3, gamma=3, draft_s=3 * 0.4, verify_s=1.0)
        chooser.observe(0.0, 0, gamma=2, draft_s=0.0, verify_s=1.0)  # a catch-up: the verify counts, the draft does not
    fitted = chooser.current_costs
    assert fitted.draft_s == pytest.approx(0.4, rel=0.1) and fitted.verify(4) == pytest.approx(1.0, rel=0.05)
    assert chooser.next_gamma() < before and chooser.summary()["costs_fitted_to_rounds"]
    assert GammaChooser(measured).current_costs is measured  # seeded runs: the measured costs as they are


def test_costs_must_be_positive_and_cover_a_plain_step():
    for bad in ({}, {2: 1.0}, {1: 0.0}, {1: 1.0, 3: -1.0}):
        with pytest.raises(ValueError, match="positive seconds"):
            Costs(bad, 0.1)
    assert Costs({1: 1.0, 2: 0.5}).verify(9) == 0.5  # extrapolating down stops at the cheapest measured step


def test_acceptance_starts_from_its_prior_and_older_rounds_fade():
    estimate = Acceptance(prior=0.6, weight=2.0)
    assert estimate.value == 0.6
    estimate.observe(0.0, 10)
    assert estimate.value < 0.15
    for _ in range(40):
        estimate.observe(10.0, 10)
    assert estimate.value > 0.97  # the early zeros have faded


def test_a_tree_is_cut_where_the_deeper_levels_do_not_pay_and_whole_now_and_then():
    costs = Costs({1: 1.0, 2: 1.1, 5: 1.3, 9: 1.6, 17: 4.0}, draft_s=0.1)
    nodes = [4, 8, 16]
    assert best_depth([0.8, 0.6, 0.4], nodes, costs)[0] == 2  # the 16-node level costs more than it brings
    assert tree_speedup([0.8, 0.6, 0.4], 2, nodes, costs) > 1 > tree_speedup([0.8, 0.6, 0.4], 3, nodes, costs)  # whole, it loses to plain
    assert best_depth([0.05, 0.01, 0.0], nodes, costs) == (0, 1.0)
    chooser = DepthChooser(costs)
    chooser.observe(3, 3, nodes, draft_s=0.1)  # a whole tree, all accepted
    for _ in range(30):
        chooser.observe(2, 2)
    depths = [chooser.next_depth(3) for _ in range(16)]
    assert depths.count(3) >= 1 and depths.count(2) >= 12, depths
    assert chooser.reach()[0] > 0.9


def test_costs_are_kept_on_disk_per_key_and_too_old_ones_are_measured_again(tmp_path):
    save_costs("k", CHEAP, tmp_path)
    assert load_costs("k", tmp_path) is None  # measured_at 0: a day old and more
    fresh = Costs(dict(CHEAP.verify_s), CHEAP.draft_s, measured_at=__import__("time").time())
    save_costs("k", fresh, tmp_path)
    assert load_costs("k", tmp_path) == fresh and load_costs("other", tmp_path) is None
    (tmp_path / "local-k.json").write_text("{not json")
    assert load_costs("k", tmp_path) is None


# -- the engine ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pair():
    return small_vocab_pair()


def test_auto_gamma_changing_round_to_round_keeps_the_output_distribution(pair):
    """100k rows at T=0.7 under --gamma auto: a plain first round, then γ
    from the given costs and the acceptance seen, varying by round."""
    target, draft = pair
    params = SETTINGS["T=0.7"]
    engine = LocalSpeculator(target, draft, None, gamma="auto", costs=CHEAP)
    stats, local = GenerationStats(), LocalStats()
    samples = engine.sample_tokens(PROMPT, max_tokens=3, sampling=params, generator=as_generator(99, DEVICE), rows=100_000, stats=stats, local=local).cpu()
    assert (samples != NO_TOKEN).all()
    joint = target_joint(target, params)
    assert chi_square_p_value(joint_counts(samples, VOCAB), joint) > 0.01
    assert chi_square_p_value(joint_counts(samples, VOCAB), target_joint(draft, params)) < 1e-6
    assert local.auto["costs"] == "given" and set(local.auto["gamma_rounds"]) >= {"1"} and stats.accepted_tokens > 10_000


@pytest.mark.parametrize("costs", [CHEAP, DEAR], ids=["cheap", "dear"])
@pytest.mark.parametrize("kind", ["static", "eager"])
def test_auto_gamma_at_temperature_zero_writes_plain_greedy(costs, kind):
    """Where wide steps are dear, an unrelated draft leaves plain steps (and
    a γ = 1 round now and then); where they are cheap, a draft that is the
    target itself gets the longest γ."""
    target, tokenizer = tiny_model(1)
    target = target.to(DEVICE)
    draft = target if costs is CHEAP else tiny_model(2)[0].to(DEVICE)
    plain = LocalSpeculator(target, None, tokenizer, engine=kind).generate("def add(a, b):", max_tokens=40, sampling=SamplingParams(0))
    auto = LocalSpeculator(target, draft, tokenizer, gamma="auto", costs=costs, engine=kind).generate("def add(a, b):", max_tokens=40, sampling=SamplingParams(0))
    assert auto.text == plain.text
    rounds = auto.local.auto["gamma_rounds"]
    if costs is DEAR:
        assert set(rounds) <= {"0", "1"} and rounds["0"] > 3 * rounds.get("1", 0), rounds
    else:
        assert auto.local.target_forwards < plain.local.target_forwards / 4 and max(map(int, rounds)) == 6, rounds


def test_measuring_costs_leaves_caches_and_a_seeded_stream_as_they_were(tmp_path):
    target, tokenizer = tiny_model(1)
    draft = tiny_model(2)[0]
    measured = LocalSpeculator(target.to(DEVICE), draft.to(DEVICE), tokenizer, gamma="auto", costs_root=tmp_path)
    first = measured.generate("The model", max_tokens=30, seed=5, sampling=SamplingParams(0.8))
    assert first.local.auto["costs"].startswith("measured in ")
    again = measured.generate("The model", max_tokens=30, seed=5, sampling=SamplingParams(0.8))
    assert again.local.auto["costs"] == "measured earlier in this process" and again.text == first.text
    stored = LocalSpeculator(target, draft, tokenizer, gamma="auto", costs_root=tmp_path).generate("The model", max_tokens=30, seed=5, sampling=SamplingParams(0.8))
    assert stored.local.auto["costs"] == "stored" and stored.text == first.text
    (costs_file,) = tmp_path.glob("local-*.json")
    given = LocalSpeculator(target, draft, tokenizer, gamma="auto", costs=Costs.from_dict(__import__("json").loads(costs_file.read_text())))
    assert given.generate("The model", max_tokens=30, seed=5, sampling=SamplingParams(0.8)).text == first.text


@pytest.mark.parametrize("wrap", [CachedLM, StaticLM], ids=["eager", "static"])
def test_a_scratch_step_leaves_the_cache_as_it_was(pair, wrap):
    target, _ = pair
    model = wrap(target)
    model.reset(2, 32)
    prompt = torch.tensor([PROMPT, PROMPT[::-1]], device=DEVICE)
    model.forward(prompt, torch.ones_like(prompt, dtype=torch.bool), last=1)
    step = torch.tensor([[1], [2]], device=DEVICE)
    before = model.forward(step, torch.ones_like(step, dtype=torch.bool), last=1)
    model.forget_last(torch.tensor([1, 1], device=DEVICE))
    lengths, forwards = model.lengths.clone(), model.forwards
    assert model.scratch_forward(5).shape == (2, 5, VOCAB)
    assert torch.equal(model.lengths, lengths) and model.forwards == forwards
    assert torch.allclose(model.forward(step, torch.ones_like(step, dtype=torch.bool), last=1), before, atol=1e-9)


def test_bad_gammas_are_refused_with_a_reason(pair):
    target, draft = pair
    for bad in (0, -2, True, 1.5, "fast"):
        with pytest.raises(ConfigurationError, match="auto or a whole number"):
            LocalSpeculator(target, draft, None, gamma=bad)


# -- trees ---------------------------------------------------------------------------------------


def medusa_engine(costs: Costs):
    from blackbox_spec.local.heads import MedusaHeads, MedusaProposer

    target, tokenizer = tiny_model(1)
    target = target.to(DEVICE)
    heads = MedusaHeads(target.config.hidden_size, 3, target.get_output_embeddings())
    return LocalSpeculator(target, None, tokenizer, gamma="auto", costs=costs, proposer=MedusaProposer(heads.eval(), shape=(2, 2, 1)))


@pytest.mark.parametrize("costs", [Costs({1: 1.0, 2: 1.0, 16: 1.0}, draft_s=0.0), DEAR], ids=["free-tree", "dear-tree"])
def test_auto_depth_writes_plain_greedy_and_cuts_dear_trees(costs):
    engine = medusa_engine(costs)
    plain = LocalSpeculator(engine.target.model, None, engine.tokenizer).generate("x = [", max_tokens=30, sampling=SamplingParams(0))
    result = engine.generate("x = [", max_tokens=30, sampling=SamplingParams(0))
    assert result.text == plain.text
    rounds = result.local.auto["depth_rounds"]
    if costs is DEAR:  # untrained heads are seldom right: plain steps, a whole tree now and then
        assert rounds.get("0", 0) > sum(n for d, n in rounds.items() if d != "0"), rounds
    else:
        assert "0" not in rounds, rounds
    assert engine.proposer.depth == 3


def test_a_tree_deeper_than_gamma_is_bounded_by_its_own_depth():
    """Positions reach prompt + max_tokens + the tree's depth + 1: a request
    that fits with γ = 2 but not with a 3-deep tree is refused, not overrun."""
    engine = medusa_engine(CHEAP)
    prompt = list(range(1, 21))
    limit = engine.max_positions
    with pytest.raises(ConfigurationError, match="positions"):
        engine._check_request(prompt, limit - len(prompt) - 3, 1, as_generator(0, DEVICE))
    engine._check_request(prompt, limit - len(prompt) - 4, 1, as_generator(0, DEVICE))


def test_keeping_a_path_moves_only_the_accepted_entries():
    """The eager cache keeps its storage: the context is not copied each round."""
    from blackbox_spec.local.engine import _cache_tensors
    from blackbox_spec.local.tree import DraftTree

    target, _ = tiny_model(1)
    model = CachedLM(target.to(DEVICE))
    model.read_prompt(list(range(3, 40)))
    tree = DraftTree(torch.tensor([5, 6, 7, 8]), torch.tensor([-1, -1, 1, 2]))
    model.forward_tree(9, tree)
    before = [keys.data_ptr() for keys, _, _ in _cache_tensors(model._cache)]
    kept = [keys[..., 39:41, :].clone() for keys, _, _ in _cache_tensors(model._cache)]  # nodes 1 and 2 (37 prompt tokens, the root)
    model.keep_path([1, 2])
    after = list(_cache_tensors(model._cache))
    assert [keys.data_ptr() for keys, _, _ in after] == before and model.lengths.tolist() == [40]
    assert all(torch.equal(keys[..., 38:40, :], old) for (keys, _, _), old in zip(after, kept)) and after[0][0].shape[-2] == 40

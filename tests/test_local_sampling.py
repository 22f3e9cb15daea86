"""The speculative sampling rule on explicit p and q tables.

Each test draws 100k samples in one batch and checks the output against the
target's distribution with a chi-square test (p > 0.01), for the first
token and for the joint of the first three, at several sampling settings.
A control with a deliberately wrong q shows that the same test rejects a
rule that is not exact.  Seeds are fixed, so the outcome is reproducible.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="local mode needs the hf extra (torch): pip install 'blackbox-spec[hf]'")
pytestmark = pytest.mark.torch

from blackbox_spec.local.sampling import (
    NO_TOKEN,
    SamplingParams,
    expected_acceptance,
    leviathan_speedup,
    rejection_sample,
    sampling_probs,
)

from .chi_square import chi_square_p_value, joint_counts

SAMPLES = 100_000
VOCAB = 6
GAMMA = 3
SETTINGS = {
    "T=1.0": SamplingParams(temperature=1.0),
    "T=0.7": SamplingParams(temperature=0.7),
    "top-k=3": SamplingParams(temperature=1.0, top_k=3),
    "top-p=0.8": SamplingParams(temperature=1.0, top_p=0.8),
}


def toy_tables(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Position-dependent logits [positions, V] for p and for q: the target
    writes token j from P[j] whatever came before, a context model of the
    simplest kind (the rule is exact for any conditionals).  q is p plus
    noise, so drafts are often but not always right."""
    generator = torch.Generator().manual_seed(seed)
    positions = 3 + GAMMA + 1
    p_logits = 1.2 * torch.randn((positions, VOCAB), generator=generator, dtype=torch.float64)
    q_logits = p_logits + 1.0 * torch.randn((positions, VOCAB), generator=generator, dtype=torch.float64)
    return p_logits, q_logits


def speculative_samples(P, Q, generator, *, n_tokens=3, q_told=None, rows=SAMPLES) -> torch.Tensor:
    """Rows of n_tokens tokens made round by round with :func:`rejection_sample`:
    drafts sampled from Q at each row's position, p rows from P.  ``q_told``
    (default Q) is what the rule is told q was: the control lies here."""
    q_told = Q if q_told is None else q_told
    last = P.shape[0] - 1
    out = torch.full((rows, n_tokens + GAMMA + 1), NO_TOKEN)
    count = torch.zeros(rows, dtype=torch.int64)
    while bool((count < n_tokens).any()):
        draft_positions = (count.unsqueeze(1) + torch.arange(GAMMA)).clamp(max=last)
        q = Q[draft_positions]
        drafts = torch.multinomial(q.reshape(-1, VOCAB), 1, generator=generator).view(rows, GAMMA)
        p = P[(count.unsqueeze(1) + torch.arange(GAMMA + 1)).clamp(max=last)]
        tokens, n = rejection_sample(drafts, q_told[draft_positions], p, generator)
        slots = count.unsqueeze(1) + torch.arange(GAMMA + 1)
        keep = (torch.arange(GAMMA + 1) < n.unsqueeze(1)) & (count < n_tokens).unsqueeze(1)
        out[keep.nonzero(as_tuple=True)[0], slots[keep]] = tokens[keep]
        count = count + torch.where(count < n_tokens, n, 0)
    return out[:, :n_tokens]


def joint_target(P: torch.Tensor, n_tokens: int = 3) -> torch.Tensor:
    joint = P[0]
    for j in range(1, n_tokens):
        joint = joint.unsqueeze(-1) * P[j]
    return joint


@pytest.mark.parametrize("setting", SETTINGS)
def test_output_follows_the_target_first_token_and_first_three(setting):
    params = SETTINGS[setting]
    p_logits, q_logits = toy_tables()
    P, Q = sampling_probs(p_logits, params), sampling_probs(q_logits, params)
    samples = speculative_samples(P, Q, torch.Generator().manual_seed(1))
    assert (samples >= 0).all()
    assert int((P[0] > 0).sum()) >= 2  # a real choice, even after top-k / top-p
    first = torch.bincount(samples[:, 0], minlength=VOCAB)
    assert chi_square_p_value(first, P[0]) > 0.01
    assert chi_square_p_value(joint_counts(samples, VOCAB), joint_target(P)) > 0.01
    # Not trivially so: the draft's own distribution is far from the target's.
    assert chi_square_p_value(joint_counts(samples, VOCAB), joint_target(Q)) < 1e-6


def test_a_rule_told_the_wrong_q_is_caught():
    """The control: drafts come from Q but the rule is told they came from a
    sharper Q' (a temperature bug).  The same test must reject it."""
    p_logits, q_logits = toy_tables()
    P, Q = sampling_probs(p_logits, SETTINGS["T=1.0"]), sampling_probs(q_logits, SETTINGS["T=1.0"])
    wrong = sampling_probs(q_logits, SamplingParams(temperature=0.5))
    samples = speculative_samples(P, Q, torch.Generator().manual_seed(1), q_told=wrong)
    assert chi_square_p_value(joint_counts(samples, VOCAB), joint_target(P)) < 1e-6


def test_one_round_emits_accepted_then_recovered_or_bonus():
    """Shapes and the three kinds of token, on hand-made one-hot cases."""
    one_hot = torch.eye(4, dtype=torch.float64)
    p = one_hot[[1, 2, 3, 0]].unsqueeze(0).repeat(3, 1, 1)  # the target writes 1, 2, 3, then 0
    drafts = torch.tensor([[1, 2, 3], [1, 0, 3], [2, 2, 3]])
    tokens, n = rejection_sample(drafts, one_hot[drafts], p, torch.Generator().manual_seed(0))
    assert n.tolist() == [4, 2, 1]
    assert tokens.tolist() == [[1, 2, 3, 0], [1, 2, NO_TOKEN, NO_TOKEN], [1, NO_TOKEN, NO_TOKEN, NO_TOKEN]]
    # No draft: the bonus row alone, i.e. plain sampling.
    tokens, n = rejection_sample(drafts[:, :0], p[:, :0], p[:, :1], torch.Generator().manual_seed(0))
    assert n.tolist() == [1, 1, 1] and tokens[:, 0].tolist() == [1, 1, 1]


def test_acceptance_probability_is_min_p_over_q():
    """P(accept x) = min(1, p(x)/q(x)) for a fixed draft token, measured."""
    p = torch.tensor([[[0.2, 0.8], [0.5, 0.5]]], dtype=torch.float64).repeat(SAMPLES, 1, 1)
    q = torch.tensor([[[0.6, 0.4]]], dtype=torch.float64).repeat(SAMPLES, 1, 1)
    drafts = torch.zeros((SAMPLES, 1), dtype=torch.int64)  # token 0: p/q = 1/3
    _, n = rejection_sample(drafts, q, p, torch.Generator().manual_seed(3))
    rate = float((n == 2).double().mean())
    assert abs(rate - 1 / 3) < 4 * (1 / 3 * 2 / 3 / SAMPLES) ** 0.5
    # A rejected token 0 is recovered from (p - q)+ = [0, 0.4]: always token 1.
    tokens, n = rejection_sample(drafts, q, p, torch.Generator().manual_seed(3))
    assert (tokens[n == 1, 0] == 1).all()


def test_same_seed_same_tokens_other_seed_other_tokens():
    p_logits, q_logits = toy_tables()
    P, Q = sampling_probs(p_logits, SETTINGS["T=1.0"]), sampling_probs(q_logits, SETTINGS["T=1.0"])
    a = speculative_samples(P, Q, torch.Generator().manual_seed(5), rows=500)
    b = speculative_samples(P, Q, torch.Generator().manual_seed(5), rows=500)
    c = speculative_samples(P, Q, torch.Generator().manual_seed(6), rows=500)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_sampling_probs_against_brute_force():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.5, -1.0]], dtype=torch.float64)
    base = torch.softmax(logits, -1)[0]
    top_k = sampling_probs(logits, SamplingParams(top_k=2))[0]
    assert torch.allclose(top_k, torch.tensor([base[0], base[1], 0, 0, 0], dtype=torch.float64) / (base[0] + base[1]))
    ties = sampling_probs(logits, SamplingParams(top_k=3))[0]  # the 3rd and 4th tie: both stay
    assert (ties > 0).tolist() == [True, True, True, True, False]
    # top-p: keep the most likely tokens until their mass reaches p.
    for top_p in (0.3, 0.6, 0.8, 0.95, 1.0):
        kept, mass = [], 0.0
        for index in torch.argsort(base, descending=True, stable=True).tolist():
            if mass >= top_p:
                break
            kept.append(index)
            mass += float(base[index])
        expected = torch.zeros_like(base)
        expected[kept] = base[kept] / base[kept].sum()
        assert torch.allclose(sampling_probs(logits, SamplingParams(top_p=top_p))[0], expected), top_p
    hot = sampling_probs(logits, SamplingParams(temperature=0.5))[0]
    assert torch.allclose(hot, torch.softmax(logits[0] / 0.5, -1))
    assert sampling_probs(logits, SamplingParams(temperature=0))[0].tolist() == [1, 0, 0, 0, 0]


def test_greedy_is_the_limit_case():
    """At temperature 0 the rule accepts exactly the drafts that equal the
    target's argmax and recovers the argmax: prefix matching."""
    generator = torch.Generator().manual_seed(0)
    p_logits = torch.randn((200, GAMMA + 1, 7), generator=generator, dtype=torch.float64)
    drafts = torch.randint(0, 7, (200, GAMMA), generator=generator)
    drafts[:100] = p_logits[:100, :GAMMA].argmax(-1)  # half of them right throughout
    greedy = SamplingParams(temperature=0)
    p = sampling_probs(p_logits, greedy)
    q = torch.nn.functional.one_hot(drafts, 7).to(torch.float64)
    tokens, n = rejection_sample(drafts, q, p, generator)
    argmax = p_logits.argmax(-1)
    for row in range(200):
        matched = 0
        while matched < GAMMA and drafts[row, matched] == argmax[row, matched]:
            matched += 1
        assert int(n[row]) == matched + 1
        assert tokens[row, : matched + 1].tolist() == argmax[row, : matched + 1].tolist()


def test_invalid_sampling_settings_say_why():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=-2)


def test_expected_acceptance_and_the_paper_formula():
    p = torch.tensor([0.5, 0.5, 0.0])
    q = torch.tensor([0.25, 0.25, 0.5])
    assert float(expected_acceptance(p, q)) == pytest.approx(0.5)
    # alpha = 1: every round emits gamma + 1 tokens for gamma c + 1 target steps.
    assert leviathan_speedup(1.0, 4, 0.0) == 5.0
    assert leviathan_speedup(0.0, 4, 0.0) == 1.0


def test_the_speedup_formula_matches_simulated_rounds():
    """Leviathan's expected speed-up against rounds drawn with i.i.d.
    acceptance alpha: the first rejection ends a round, every round emits
    one token of the target's own, and costs gamma c + 1 target steps."""
    generator = torch.Generator().manual_seed(3)
    for alpha, gamma, c in ((0.6, 3, 0.05), (0.9, 5, 0.1), (0.3, 2, 0.0)):
        accepted = torch.rand(200_000, gamma, generator=generator) < alpha
        emitted = accepted.int().cumprod(dim=1).sum(dim=1) + 1
        simulated = float(emitted.double().mean()) / (gamma * c + 1)
        assert leviathan_speedup(alpha, gamma, c) == pytest.approx(simulated, rel=0.01)


def test_the_exponential_race_draws_each_token_with_its_probability():
    """``sample`` (argmax p/E, no host sync): rows need not sum to 1, a zero
    probability is never drawn, and a wrong table is caught by the same test."""
    from blackbox_spec.local.sampling import sample

    weights = torch.tensor([3.0, 0.0, 1.0, 0.5, 0.0, 5.5])  # sums to 10, two zeros
    generator = torch.Generator().manual_seed(13)
    for dtype in (torch.float32, torch.float64):
        draws = sample(weights.to(dtype).expand(SAMPLES, -1), generator)
        counts = torch.bincount(draws, minlength=VOCAB).to(torch.float64)
        assert counts[1] == 0 and counts[4] == 0
        assert chi_square_p_value(counts, weights.double() / weights.sum()) > 0.01
        wrong = torch.tensor([3.2, 0.0, 0.9, 0.5, 0.0, 5.4])
        assert chi_square_p_value(counts, wrong.double() / wrong.sum()) < 1e-6

"""Pearson's chi-square goodness of fit, without scipy.

Cells whose expected count is below 5 are pooled into one cell (the usual
validity rule), and the p-value is the regularised upper incomplete gamma
function Q(df/2, chi2/2), which torch provides.
"""

from __future__ import annotations

import torch


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """P(X >= chi2) for observed ``counts`` against cell probabilities ``probs`` (same shape)."""
    counts = counts.flatten().to(torch.float64)
    expected = probs.flatten().to(torch.float64) * counts.sum()
    small = expected < min_expected
    if bool((counts[expected == 0] > 0).any()):
        return 0.0  # an impossible outcome happened
    observed = torch.cat([counts[~small], counts[small].sum().unsqueeze(0)])
    expected = torch.cat([expected[~small], expected[small].sum().unsqueeze(0)])
    keep = expected > 0
    observed, expected = observed[keep], expected[keep]
    statistic = ((observed - expected) ** 2 / expected).sum()
    df = len(expected) - 1
    if df == 0:
        return 1.0  # one possible outcome, and nothing else happened
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), statistic / 2))


def joint_counts(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """Counts of each row's first ``tokens.shape[1]`` tokens as one cell of V^n."""
    n = tokens.shape[1]
    index = torch.zeros(tokens.shape[0], dtype=torch.int64)
    for j in range(n):
        index = index * vocab + tokens[:, j]
    return torch.bincount(index, minlength=vocab**n)

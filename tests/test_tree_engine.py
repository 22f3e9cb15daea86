"""The tree speculation loop itself (:func:`speculate_tree`): its output is
distributed exactly as the target's at T=1, T=0.7, top-k and top-p, and at
temperature 0 it writes the target's plain greedy text.

``test_tree.py`` checks the multi-draft rule on tables, and
``test_local_engine.py`` the loop with a transformers target (6k samples:
one call each is slow).  Here the target is a table, cheap enough for 100k
calls: the next token's logits depend on the last two tokens, so a node's
distribution depends on its parent (looked up through the tree) and on
the context the loop kept (through ``keep_path``).  The toy tracks its own
context as the real cache does and checks that ``keep_path`` gets a path
from the root, and the proposers check that ``features`` and ``following``
line up, so a slip in the loop's bookkeeping shows.

Each distribution test draws 100,000 outputs of 4 tokens (the first from
the prompt, then rounds of a depth-2 tree: 2 children of the root, 2 below
the first and 1 below the second) with one seeded generator, and compares
their joint with the target's, enumerated over all V^4 sequences, by
chi-square (p > 0.01).  Children are sampled from a draft table (repeats
allowed; q is the row each came from) or picked as the draft's top-k (q
one-hot, as Medusa).  A control swaps in a walk with an indexing slip (a
node's children judged against p after the node's parent), and the same
test must reject it (p < 1e-6).

One call costs ~0.7 ms on a CPU core (mostly the walk's tiny tensor ops),
so each 100k case is drawn in two processes (~40 s on two cores); the
top-k proposer runs its distribution case at T=1 only, and the control
(in-process: it patches the walk) draws 20k (its p is 0 from 3k on).
"""

from __future__ import annotations

import bisect
import itertools
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Callable

import pytest

torch = pytest.importorskip("torch", reason="local mode needs the hf extra (torch): pip install 'blackbox-spec[hf]'")
pytestmark = pytest.mark.torch

from blackbox_spec._stats import GenerationStats
from blackbox_spec.local import tree_engine
from blackbox_spec.local.engine import LocalStats
from blackbox_spec.local.sampling import SamplingParams, as_generator, multi_draft_rejection, sample, sampling_probs
from blackbox_spec.local.tree import ROOT, DraftTree
from blackbox_spec.local.tree_engine import speculate_tree

from .chi_square import chi_square_p_value, joint_counts
from .test_local_sampling import SETTINGS  # T=1.0, T=0.7, top-k=3, top-p=0.8

SAMPLES = 100_000
VOCAB = 5
MAX_TOKENS = 4  # the first token, then one round can accept a depth-2 path and a bonus
PROMPT = [2, 0, 3]
PARENTS = torch.tensor([ROOT, ROOT, 0, 0, 1])  # 2 children of the root; 2 below the first, 1 below the second


def toy_tables(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Target and draft logits [V, V, V]: the next token's, given the last
    two.  The draft is the target plus noise: often right, not always."""
    generator = torch.Generator().manual_seed(seed)
    target = 1.5 * torch.randn((VOCAB, VOCAB, VOCAB), generator=generator, dtype=torch.float64)
    return target, target + 1.0 * torch.randn((VOCAB, VOCAB, VOCAB), generator=generator, dtype=torch.float64)


class TableTarget:
    """A target with :class:`CachedLM`'s tree interface over a logits table.

    A "hidden state" [n, 2] is the (previous token, token) pair of a
    position, so :meth:`logits` is a lookup.  The context (the cache) grows
    only through :meth:`keep_path`, by the root and the kept nodes, and a
    tree forward reads its last token, as attention over the cache would.
    Plain lists inside: one speculate_tree call must cost little.
    """

    device = torch.device("cpu")

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table
        self.context: list[int] = []
        self.pending: tuple[int, list[int], list[int]] | None = None  # the root, the tree's tokens and parents

    def read_prompt(self, prompt_ids: list[int]) -> torch.Tensor:
        """Row j: after prompt token j (the first counts as its own predecessor)."""
        self.context, self.pending = list(prompt_ids), None
        return torch.tensor(list(zip(self.context[:1] + self.context[:-1], self.context)))

    def forward_tree(self, root: int, tree: DraftTree) -> torch.Tensor:
        """Row 0: after the root; row i + 1: after node i, whose predecessor
        is its parent's token (the root's for depth 1)."""
        assert self.pending is None, "a tree forward before keep_path of the last one"
        tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
        before = [root if parent == ROOT else tokens[parent] for parent in parents]
        self.pending = (root, tokens, parents)
        return torch.tensor([(self.context[-1], root)] + list(zip(before, tokens)))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [n, V] after each (previous token, token) row of ``hidden``."""
        return self.table[hidden[:, 0], hidden[:, 1]]

    def keep_path(self, nodes: list[int]) -> None:
        """Keep the root and ``nodes``, which must be a path from the root."""
        assert self.pending is not None, "keep_path without a tree forward"
        root, tokens, parents = self.pending
        assert [parents[n] for n in nodes] == ([ROOT] + nodes)[: len(nodes)], f"not a path from the root: {nodes}"
        self.context += [root] + [tokens[n] for n in nodes]
        self.pending = None


def inverse_cdf(running_sums: list[float], u: float) -> int:
    """The token a uniform ``u`` in [0, 1) picks; never one of probability 0."""
    return bisect.bisect_right(running_sums, u * running_sums[-1])


class TableProposer:
    """A fixed tree shape (:data:`PARENTS`) below the root, from a draft
    table over the last two tokens: each node's children ``sampled`` i.i.d.
    from the draft's distribution after the node (q: that row), or picked
    as its ``top-k`` (q: one-hot at the pick, as Medusa)."""

    def __init__(self, table: torch.Tensor, pick: str) -> None:
        self.table, self.pick = table, pick
        self.ranked = table.argsort(dim=-1, descending=True).tolist()  # the draft's logits rank its tokens at any temperature
        self.probs: dict[SamplingParams, tuple[torch.Tensor, list]] = {}
        self.last: int | None = None

    def reset(self) -> None:
        """A new text: no root seen yet."""
        self.last = None

    def check_bookkeeping(self, features: list[list[int]], following: list[int]) -> None:
        """Feature j is after the token before ``following[j]``; the first
        feature is after the last call's root."""
        assert len(features) == len(following) and [f[1] for f in features[1:]] == following[:-1]
        assert self.last is None or features[0][1] == self.last
        self.last = following[-1]

    def draft(self, sampling: SamplingParams) -> tuple[torch.Tensor, list]:
        """The draft's probabilities [V, V, V] under ``sampling``, and their running sums as lists."""
        if sampling not in self.probs:
            probs = sampling_probs(self.table, sampling)
            self.probs[sampling] = probs, probs.cumsum(-1).tolist()
        return self.probs[sampling]

    def propose(self, features: torch.Tensor, following: torch.Tensor, sampling: SamplingParams,
                generator: torch.Generator) -> tuple[DraftTree, torch.Tensor]:
        """The tree below the root ``following[-1]``, whose predecessor is
        the token of the newest feature, and each node's q."""
        following_list = following.tolist()
        self.check_bookkeeping(features.tolist(), following_list)
        before, root = features[-1, 1].item(), following_list[-1]
        probs, sums = self.draft(sampling)
        if self.pick == "sampled":
            u = torch.rand(len(PARENTS), generator=generator, dtype=torch.float64).tolist()
            first = [inverse_cdf(sums[before][root], u[0]), inverse_cdf(sums[before][root], u[1])]
            tokens = first + [inverse_cdf(sums[root][first[0]], u[2]), inverse_cdf(sums[root][first[0]], u[3]),
                              inverse_cdf(sums[root][first[1]], u[4])]
            q = probs[[before, before, root, root, root], [root, root, first[0], first[0], first[1]]]
        else:
            first = self.ranked[before][root][:2]
            tokens = first + self.ranked[root][first[0]][:2] + self.ranked[root][first[1]][:1]
            q = torch.eye(VOCAB, dtype=probs.dtype)[tokens]
        return DraftTree(torch.tensor(tokens), PARENTS), q


def target_joint(table: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """P(t1, t2, t3, t4 | PROMPT) [V, V, V, V] under plain sampling with
    ``params``, enumerated from the table."""
    probs = sampling_probs(table, params)
    a, b = PROMPT[-2:]
    return probs[a, b][:, None, None, None] * probs[b][:, :, None, None] * probs[:, :, :, None] * probs[None]


def tree_outputs(pick: str, params: SamplingParams, seed: int, samples: int = SAMPLES) -> tuple[torch.Tensor, LocalStats]:
    """``samples`` outputs of :data:`MAX_TOKENS` tokens from speculate_tree,
    one seeded generator for all, and the rounds' stats together."""
    target_table, draft_table = toy_tables()
    target, proposer = TableTarget(target_table), TableProposer(draft_table, pick)
    generator, stats, local = as_generator(seed), GenerationStats(), LocalStats()
    with torch.inference_mode():  # ~25% off each call's many tiny tensor ops
        rows = [speculate_tree(target, proposer, PROMPT, max_tokens=MAX_TOKENS, sampling=params, generator=generator, ends=set(),
                               stats=stats, local=local) for _ in range(samples)]
    return torch.tensor(rows), local


@pytest.fixture(scope="module")
def workers():
    """Two processes (CI's machine has two cores, and runs one test at a
    time): each case draws half its samples in each, from its own seed."""
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield pool


def tree_outputs_in_halves(pool: ProcessPoolExecutor, pick: str, params: SamplingParams, seed: int) -> tuple[torch.Tensor, LocalStats]:
    """:func:`tree_outputs` of SAMPLES outputs, half in each worker (two
    seeds: still independent draws), with their stats added up."""
    halves = [pool.submit(tree_outputs, pick, params, seed + i, SAMPLES // 2) for i in range(2)]
    (first, a), (second, b) = (half.result() for half in halves)
    total = LocalStats(draft_forwards=a.draft_forwards + b.draft_forwards, target_forwards=a.target_forwards + b.target_forwards,
                       rejections=a.rejections + b.rejections,
                       accepted_per_depth=[x + y for x, y in itertools.zip_longest(a.accepted_per_depth, b.accepted_per_depth, fillvalue=0)])
    return torch.cat([first, second]), total


def p_value_against_target(samples: torch.Tensor, params: SamplingParams, table: torch.Tensor | None = None) -> float:
    """Chi-square of the samples' 4-token joint against ``table``'s (the target's by default)."""
    return chi_square_p_value(joint_counts(samples, VOCAB), target_joint(toy_tables()[0] if table is None else table, params))


# Every setting with sampled children; top-k picks (one-hot q) at T=1
# (~70 s each here).
DISTRIBUTION_CASES = [("sampled", name) for name in SETTINGS] + [("top-k", "T=1.0")]


@pytest.mark.parametrize("pick,setting", DISTRIBUTION_CASES)
def test_tree_loop_output_follows_the_target(workers, pick, setting):
    """100k outputs of the loop follow the target's joint of 4 tokens, and
    not the draft's; drafts were refused at both depths and taken to leaves."""
    params = SETTINGS[setting]
    samples, local = tree_outputs_in_halves(workers, pick, params, seed=2024)
    assert len(samples) == SAMPLES
    p_value = p_value_against_target(samples, params)
    print(f"{pick} {setting}: p = {p_value:.4f}, accepted per depth {local.accepted_per_depth}, rejections {local.rejections}")
    assert p_value > 0.01
    # Not trivially: the draft's own joint is measurably different ...
    assert p_value_against_target(samples, params, table=toy_tables()[1]) < 1e-6
    # ... and the walk went every way: rejected at depth 1 and 2, and through to a leaf.
    rounds = local.draft_forwards  # tree rounds (the prompt's is a target forward too)
    assert 0.1 * rounds < local.accepted_per_depth[1] < local.accepted_per_depth[0] < 0.9 * rounds, local.accepted_per_depth
    assert local.rejections == rounds - local.accepted_per_depth[1]


def walk_judging_children_by_the_parents_p(tree: DraftTree, q: torch.Tensor, p_after: Callable[[int], torch.Tensor],
                                           generator: torch.Generator) -> tuple[list[int], int]:
    """walk_tree with one indexing slip: p after a node's parent instead of
    after the node (the root's children are still judged right)."""
    accepted: list[int] = []
    node = ROOT
    while True:
        kids = tree.children(node)
        row = p_after(ROOT if node == ROOT else int(tree.parents[node]))
        if not kids:
            return accepted, int(sample(row, generator))
        index = torch.tensor(kids)
        chosen, token = multi_draft_rejection(row, tree.tokens[index].unsqueeze(0), q[index].unsqueeze(0), generator)
        if int(chosen) < 0:
            return accepted, int(token)
        node = kids[int(chosen)]
        accepted.append(node)


def test_a_walk_with_an_indexing_slip_is_caught(monkeypatch):
    """The control: the same loop, sample count and test reject a walk
    that reads the wrong row of the tree forward."""
    monkeypatch.setattr(tree_engine, "walk_tree", walk_judging_children_by_the_parents_p)
    params = SETTINGS["T=1.0"]
    samples, _ = tree_outputs("sampled", params, seed=2024, samples=20_000)  # p underflows to 0 from 3k on
    p_value = p_value_against_target(samples, params)
    print(f"control: p = {p_value:.3g}")
    assert p_value < 1e-6


def greedy_chain(table: torch.Tensor, prompt: list[int], max_tokens: int, ends: set[int]) -> list[int]:
    """Plain greedy decoding of the table: argmax after the last two tokens."""
    out: list[int] = []
    while len(out) < max_tokens and not (out and out[-1] in ends):
        before, last = (prompt + out)[-2:]
        out.append(int(table[before, last].argmax()))
    return out


@pytest.mark.parametrize("pick", ["sampled", "top-k"])
def test_at_temperature_zero_the_tree_loop_is_plain_greedy(pick):
    """Greedy: each round's argmax path through the tree, then a bonus; the
    text equals plain greedy decoding, for any length and with an end token."""
    target_table, draft_table = toy_tables()
    target, proposer = TableTarget(target_table), TableProposer(draft_table, pick)
    generator, greedy, local = as_generator(0), SamplingParams(temperature=0.0), LocalStats()
    for prompt in ([2, 0, 3], [4, 4], [1, 3, 0, 2, 2]):
        for max_tokens in (1, 2, 7, 20):
            tokens = speculate_tree(target, proposer, prompt, max_tokens=max_tokens, sampling=greedy, generator=generator, ends=set(),
                                    stats=GenerationStats(), local=local)
            assert tokens == greedy_chain(target_table, prompt, max_tokens, set()), (prompt, max_tokens)
        end = greedy_chain(target_table, prompt, 20, set())[4]
        tokens = speculate_tree(target, proposer, prompt, max_tokens=20, sampling=greedy, generator=generator, ends={end},
                                stats=GenerationStats(), local=local)
        assert tokens == greedy_chain(target_table, prompt, 20, {end}) and tokens[-1] == end and len(tokens) <= 5
    # Drafts were taken down to depth 2 and refused: both ways of the walk ran.
    assert 0 < local.accepted_per_depth[1] and local.rejections > 0 and local.tokens_per_target_forward > 1.3, local.to_dict()


def test_the_loop_counts_what_it_did():
    """Per call: the rounds' tokens add up to the output after the first
    token (sampled from the prompt, before any round), acceptance per depth
    never grows with depth, and a round ends at a leaf or a rejection."""
    target_table, draft_table = toy_tables()
    target, proposer = TableTarget(target_table), TableProposer(draft_table, "sampled")
    generator = as_generator(5)
    for max_tokens in (1, 3, 20) * 30:
        stats, local = GenerationStats(), LocalStats()
        tokens = speculate_tree(target, proposer, PROMPT, max_tokens=max_tokens, sampling=SETTINGS["T=0.7"], generator=generator, ends=set(),
                                stats=stats, local=local)
        assert len(tokens) == max_tokens
        assert sum(local.round_tokens) == stats.output_tokens == len(tokens)
        rounds = len(local.round_tokens) - 1  # tree rounds; the prompt's round wrote the first token
        assert local.target_forwards == stats.rounds == rounds + 1 and local.draft_forwards == rounds
        assert local.round_tokens[0] == 1 and all(1 <= n <= 3 for n in local.round_tokens[1:])
        depths = local.accepted_per_depth
        assert all(a >= b for a, b in zip(depths, depths[1:])) and len(depths) <= 2
        # (A last round cut by max_tokens emits fewer than it accepted.)
        assert stats.accepted_tokens <= sum(depths) and local.examined_positions == sum(depths) + rounds
        assert stats.drafted_tokens == len(PARENTS) * rounds
        assert local.rejections == rounds - (depths[1] if len(depths) > 1 else 0)

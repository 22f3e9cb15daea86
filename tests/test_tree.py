"""Draft trees (Medusa, EAGLE): the multi-draft rejection rule on explicit p
and q tables, the tree mask and positions against single-path forwards, and
the greedy walk against plain greedy.

The distribution tests draw 100k rows in one batch.  The target and draft are
Markov tables P[prev, next] and Q[prev, next] (a child's tokens depend on
its parent's, as in a real tree), and every round builds a tree of 3
children below the last token and 2 below each of those, drawn from Q
(i.i.d., so siblings repeat often: 6 tokens), or picked as Q's top-k.  The
output's first token and the joint of its first three are checked against P
with a chi-square test (p > 0.01), and a control with a rule told the wrong
q must be rejected (p < 1e-6).
"""

from __future__ import annotations

import copy
import math
import json

import pytest

torch = pytest.importorskip("torch", reason="local mode needs the hf extra (torch): pip install 'blackbox-spec[hf]'")
pytestmark = pytest.mark.torch

from blackbox_spec.local.sampling import NO_TOKEN, SamplingParams, multi_draft_rejection, sampling_probs
from blackbox_spec.local.tree import ROOT, DraftTree, ancestor_mask, depths, greedy_walk, tree_positions

from .chi_square import chi_square_p_value, joint_counts

SAMPLES = 100_000
VOCAB = 6
WIDTHS = (3, 2)  # children of the root, then of each of those
START = 0  # the token before the first round
SETTINGS = {
    "T=1.0": SamplingParams(temperature=1.0),
    "T=0.7": SamplingParams(temperature=0.7),
    "top-k=3": SamplingParams(temperature=1.0, top_k=3),
    "top-p=0.8": SamplingParams(temperature=1.0, top_p=0.8),
}


def markov_tables(params: SamplingParams, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """P and Q [V, V]: the next token's distribution given the last one; q
    is p plus noise, so drafts are often but not always right."""
    generator = torch.Generator().manual_seed(seed)
    p_logits = 1.2 * torch.randn((VOCAB, VOCAB), generator=generator, dtype=torch.float64)
    q_logits = p_logits + 1.0 * torch.randn((VOCAB, VOCAB), generator=generator, dtype=torch.float64)
    return sampling_probs(p_logits, params), sampling_probs(q_logits, params)


def children(Q: torch.Tensor, parents: torch.Tensor, width: int, generator, *, top_k: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``width`` children below each of ``parents`` [rows, ...] and the q
    each was drawn from: i.i.d. from Q[parent], or Q[parent]'s top-k with q
    one-hot at the pick (a deterministic choice)."""
    rows = Q[parents]  # [..., V]
    if top_k:
        picks = rows.topk(width, dim=-1).indices
        q = torch.nn.functional.one_hot(picks, VOCAB).to(Q.dtype)
    else:
        picks = torch.multinomial(rows.reshape(-1, VOCAB), width, replacement=True, generator=generator).view(*parents.shape, width)
        q = rows.unsqueeze(-2).expand(*parents.shape, width, VOCAB)
    return picks, q


def tree_samples(P, Q, generator, *, n_tokens=3, top_k=False, q_told=None, rows=SAMPLES) -> torch.Tensor:
    """Rows of ``n_tokens`` tokens made round by round: a two-level tree
    below each row's last token, walked with :func:`multi_draft_rejection`
    level by level, and a bonus token from P after a leaf.  ``q_told``
    (default: the q the children came from) is what the rule is told."""
    out = torch.full((rows, n_tokens + len(WIDTHS) + 1), NO_TOKEN)
    count = torch.zeros(rows, dtype=torch.int64)
    last = torch.full((rows,), START)
    every = torch.arange(rows)
    while bool((count < n_tokens).any()):
        level1, q1 = children(Q, last, WIDTHS[0], generator, top_k=top_k)
        level2, q2 = children(Q, level1, WIDTHS[1], generator, top_k=top_k)  # [rows, 3, 2]
        if q_told is not None:
            q1, q2 = q_told[last].unsqueeze(1).expand_as(q1), q_told[level1].unsqueeze(2).expand_as(q2)
        walking = count < n_tokens
        state, kids, q = last, level1, q1
        for depth in range(len(WIDTHS) + 1):
            if depth == len(WIDTHS):  # past a leaf: the bonus token
                chosen, token = torch.full((rows,), -1), torch.multinomial(P[state], 1, generator=generator).squeeze(-1)
            else:
                chosen, token = multi_draft_rejection(P[state], kids, q, generator)
            out[every[walking], count[walking]] = token[walking]
            state = torch.where(walking, token, state)
            if depth < len(WIDTHS) - 1:
                pick = chosen.clamp_min(0)
                kids, q = level2[every, pick], q2[every, pick]
            count = count + walking.long()
            walking = walking & (chosen >= 0)
        last = state
    return out[:, :n_tokens]


def joint_target(P: torch.Tensor, n_tokens: int = 3) -> torch.Tensor:
    joint = P[START]
    for _ in range(1, n_tokens):
        joint = joint.unsqueeze(-1) * P  # P[prev, next] broadcast on the last token
    return joint


@pytest.mark.parametrize("setting", SETTINGS)
def test_a_tree_walk_follows_the_target_first_token_and_first_three(setting):
    P, Q = markov_tables(SETTINGS[setting])
    samples = tree_samples(P, Q, torch.Generator().manual_seed(1))
    assert (samples >= 0).all()
    assert chi_square_p_value(torch.bincount(samples[:, 0], minlength=VOCAB), P[START]) > 0.01
    assert chi_square_p_value(joint_counts(samples, VOCAB), joint_target(P)) > 0.01
    # Not trivially so: the draft's own distribution is far from the target's.
    assert chi_square_p_value(joint_counts(samples, VOCAB), joint_target(Q)) < 1e-6


@pytest.mark.parametrize("setting", ["T=1.0", "top-p=0.8"])
def test_deterministic_top_k_children_with_one_hot_q_follow_the_target(setting):
    P, Q = markov_tables(SETTINGS[setting])
    samples = tree_samples(P, Q, torch.Generator().manual_seed(2), top_k=True)
    assert chi_square_p_value(joint_counts(samples, VOCAB), joint_target(P)) > 0.01


def test_a_rule_told_the_wrong_q_is_caught():
    """The control: children come from Q, but the rule is told they came
    from a sharper Q' (a temperature bug).  The same test must reject it."""
    P, Q = markov_tables(SETTINGS["T=1.0"])
    _, sharper = markov_tables(SamplingParams(temperature=0.5))
    samples = tree_samples(P, Q, torch.Generator().manual_seed(1), q_told=sharper)
    assert chi_square_p_value(joint_counts(samples, VOCAB), joint_target(P)) < 1e-6


def test_at_temperature_zero_the_walk_is_greedy():
    P, Q = markov_tables(SamplingParams(temperature=0))
    samples = tree_samples(P, Q, torch.Generator().manual_seed(3), rows=500)
    greedy = [START]
    for _ in range(3):
        greedy.append(int(P[greedy[-1]].argmax()))
    assert (samples == torch.tensor(greedy[1:])).all()


def test_a_child_is_accepted_with_the_chance_the_rule_gives():
    """One child drawn from q: accepted with probability Σ min(p, q), the
    paper's β; two one-hot picks: the first with p(x1), else the second with
    p(x2) / (1 - p(x1))."""
    generator = torch.Generator().manual_seed(4)
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64).expand(SAMPLES, 3)
    q = torch.tensor([0.2, 0.2, 0.6], dtype=torch.float64)
    x = torch.multinomial(q.expand(SAMPLES, 3), 1, generator=generator)
    chosen, _ = multi_draft_rejection(p, x, q.expand(SAMPLES, 1, 3), generator)
    assert abs(float((chosen == 0).double().mean()) - float(torch.minimum(p[0], q).sum())) < 0.01
    picks = torch.tensor([[0, 1]]).expand(SAMPLES, 2)
    chosen, _ = multi_draft_rejection(p, picks, torch.eye(3, dtype=torch.float64)[[0, 1]].expand(SAMPLES, 2, 3), generator)
    assert abs(float((chosen == 0).double().mean()) - 0.5) < 0.01
    assert abs(float((chosen == 1).double().mean()) - 0.5 * 0.3 / 0.5) < 0.01
    missing = torch.tensor([[NO_TOKEN, NO_TOKEN]])
    chosen, token = multi_draft_rejection(p[:1], missing, q.expand(1, 2, 3), generator)
    assert int(chosen) == -1 and 0 <= int(token) < 3  # no children: a draw from p


# -- the tree's shape, mask and positions ------------------------------------------


def random_tree(generator: torch.Generator, nodes: int = 12, vocab: int = 40) -> DraftTree:
    parents = [ROOT] + [int(torch.randint(-1, i, (1,), generator=generator)) for i in range(1, nodes)]
    return DraftTree(torch.randint(0, vocab, (nodes,), generator=generator), torch.tensor(parents))


def test_the_mask_lets_a_node_see_exactly_its_path():
    tree = random_tree(torch.Generator().manual_seed(5))
    mask = ancestor_mask(tree.parents)
    for node in range(len(tree)):
        seen = {int(j) - 1 for j in mask[node + 1].nonzero().flatten()}
        assert seen == {ROOT, *tree.path(node)}
        assert len(tree.path(node)) == int(depths(tree.parents)[node])
    assert tree_positions(tree.parents, 7)[0] == 7


def test_a_tree_whose_parent_comes_later_is_refused():
    with pytest.raises(ValueError, match="earlier node"):
        DraftTree(torch.tensor([1, 2]), torch.tensor([1, ROOT]))


def test_one_tree_forward_equals_a_forward_of_each_path():
    """The target over the root and all nodes at once (a 4D mask, tree
    positions, after a cached context) gives every node the logits a plain
    forward of its own path gives."""
    from .tiny_models import tiny_model

    model, _ = tiny_model()
    tree = random_tree(torch.Generator().manual_seed(6), nodes=10, vocab=200)
    context, root = torch.tensor([[5, 9, 13, 20, 7]]), 33
    with torch.inference_mode():
        cache = model(input_ids=context, use_cache=True).past_key_values
        n, past = len(tree), context.shape[1]
        allowed = torch.cat([torch.ones((n + 1, past), dtype=torch.bool), ancestor_mask(tree.parents)], dim=1)
        mask = torch.zeros((1, 1, n + 1, past + n + 1), dtype=torch.float64).masked_fill(~allowed, torch.finfo(torch.float64).min)
        ids = torch.cat([torch.tensor([root]), tree.tokens]).unsqueeze(0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=tree_positions(tree.parents, past).unsqueeze(0),
                       past_key_values=copy.deepcopy(cache), use_cache=True).logits[0]
        for node in range(ROOT, n):
            path = [] if node == ROOT else tree.path(node)
            alone = model(input_ids=torch.cat([context[0], torch.tensor([root]), tree.tokens[path]]).unsqueeze(0)).logits[0, -1]
            assert torch.allclose(logits[node + 1], alone, atol=1e-9)


def test_the_greedy_walk_is_plain_greedy_on_the_tiny_model():
    """Greedy over a tree of the model's own top-2 guesses yields the same
    tokens as plain greedy decoding, and more than one token per forward."""
    from .tiny_models import tiny_model

    model, _ = tiny_model()
    context = torch.tensor([5, 9, 13, 20, 7])
    with torch.inference_mode():
        def next_of(seq):
            return int(model(input_ids=seq.unsqueeze(0)).logits[0, -1].argmax())

        plain = context.clone()
        for _ in range(3):
            plain = torch.cat([plain, torch.tensor([next_of(plain)])])
        # A tree of the true first token and a wrong one, each with its true
        # successor and a wrong one.
        first = next_of(context)
        second = next_of(torch.cat([context, torch.tensor([first])]))
        tree = DraftTree(torch.tensor([(first + 1) % 300, first, second, (second + 1) % 300]), torch.tensor([ROOT, ROOT, 1, 1]))
        # The tree's root is the last context token; its targets' tokens:
        target_next = []
        for node in range(ROOT, len(tree)):
            path = [] if node == ROOT else tree.path(node)
            target_next.append(next_of(torch.cat([context, tree.tokens[path]])))
        accepted, bonus = greedy_walk(tree, torch.tensor(target_next))
    assert accepted == [1, 2]
    assert [int(t) for t in tree.tokens[accepted]] + [bonus] == plain[len(context):].tolist()


# -- the tree loop in local target mode --------------------------------------------


class GuessingProposer:
    """A tree of depth 3 below the root: on one branch the target's own
    greedy tokens (found by running the tiny target, as a perfect head
    would), beside it wrong siblings; q one-hot at each pick."""

    def __init__(self, model, context: list[int], wrong_every: int = 3):
        self.model, self.context, self.rounds, self.wrong_every = model, list(context), 0, wrong_every

    def reset(self):
        pass

    def propose(self, features, following, sampling, generator):
        self.rounds += 1
        seq, tokens, parents = self.context_so_far + [int(following[-1])], [], []
        parent = ROOT
        for depth in range(3):
            with torch.inference_mode():
                right = int(self.model(input_ids=torch.tensor([seq])).logits[0, -1].argmax())
            if self.rounds % self.wrong_every == 0 and depth == 1:
                right = (right + 1) % 300  # this round's draft breaks at depth 2
            tokens += [(right + 7) % 300, right]
            parents += [parent, parent]
            parent = len(tokens) - 1
            seq.append(right)
        tree = DraftTree(torch.tensor(tokens), torch.tensor(parents))
        return tree, torch.nn.functional.one_hot(tree.tokens, self.model.config.vocab_size).double()


def test_tree_speculation_at_temperature_zero_writes_plain_greedy():
    from blackbox_spec._stats import GenerationStats
    from blackbox_spec.local.engine import CachedLM, LocalStats
    from blackbox_spec.local.tree_engine import speculate_tree

    from .tiny_models import tiny_model

    model, _ = tiny_model()
    prompt = [5, 9, 13, 20, 7]
    plain = list(prompt)
    with torch.inference_mode():
        for _ in range(20):
            plain.append(int(model(input_ids=torch.tensor([plain])).logits[0, -1].argmax()))
    proposer = GuessingProposer(model, prompt)
    written: list[int] = []

    def on_tokens(new):
        written.extend(new)
        proposer.context_so_far = prompt + written[:-1]  # the root is the newest token

    proposer.context_so_far = list(prompt)
    local = LocalStats()
    tokens = speculate_tree(CachedLM(model), proposer, prompt, max_tokens=20, sampling=SamplingParams(temperature=0),
                            generator=torch.Generator().manual_seed(0), ends=set(), stats=GenerationStats(), local=local, on_tokens=on_tokens)
    assert tokens == plain[len(prompt):] == written
    assert local.tokens_per_target_forward > 2.0  # most rounds accept 3 nodes + a bonus
    assert local.accepted_per_depth[0] >= local.accepted_per_depth[2] > 0


def test_tree_logits_and_the_kept_path_match_plain_forwards():
    from blackbox_spec.local.engine import CachedLM

    from .tiny_models import tiny_model

    model, _ = tiny_model()
    lm = CachedLM(model)
    context = torch.tensor([[5, 9, 13, 20, 7]])
    lm.forward(context, torch.ones_like(context, dtype=torch.bool), last=1)
    tree = random_tree(torch.Generator().manual_seed(8), nodes=9, vocab=200)
    hidden = lm.forward_tree(33, tree)
    deepest = max(range(len(tree)), key=lambda i: len(tree.path(i)))
    path = tree.path(deepest)
    with torch.inference_mode():  # logits from the kept hidden states are the forward's own
        alone = model(input_ids=torch.cat([context[0], torch.tensor([33]), tree.tokens[path]]).unsqueeze(0)).logits[0, -1]
    assert torch.allclose(lm.logits(hidden[deepest + 1]), alone, atol=1e-9)
    lm.keep_path(path)
    logits = lm.forward(torch.tensor([[44]]), torch.ones((1, 1), dtype=torch.bool), last=1)[0, -1]
    with torch.inference_mode():
        whole = torch.cat([context[0], torch.tensor([33]), tree.tokens[path], torch.tensor([44])]).unsqueeze(0)
        assert torch.allclose(logits, model(input_ids=whole).logits[0, -1], atol=1e-9)


# -- Medusa heads -----------------------------------------------------------------


def test_medusa_heads_are_refused_for_another_target_and_untrained_heads_stay_exact(tmp_path):
    from blackbox_spec._exceptions import ConfigurationError
    from blackbox_spec._stats import GenerationStats
    from blackbox_spec.local.engine import CachedLM, LocalStats
    from blackbox_spec.local.heads import MedusaHeads, MedusaProposer, load_medusa, save_heads, target_identity
    from blackbox_spec.local.tree_engine import speculate_tree

    from .tiny_models import tiny_model

    model, tokenizer = tiny_model()
    heads = MedusaHeads(model.config.hidden_size, 3, model.get_output_embeddings())
    hidden = torch.randn(4, model.config.hidden_size, dtype=torch.float64)
    with torch.inference_mode():  # a new head is the identity: it guesses what the LM head would
        assert torch.allclose(heads(hidden)[1], model.get_output_embeddings()(hidden))
    save_heads(tmp_path / "heads", heads, "medusa", target_identity(model.config, tokenizer), hidden=model.config.hidden_size, heads=3)
    loaded = load_medusa(tmp_path / "heads", model, tokenizer)
    other, _ = tiny_model(seed=1)
    other.config.num_hidden_layers = 3  # another target: another config
    with pytest.raises(ConfigurationError, match="trained for another target"):
        load_medusa(tmp_path / "heads", other, tokenizer)
    with pytest.raises(ConfigurationError, match="no heads"):
        load_medusa(tmp_path / "nothing", model, tokenizer)

    prompt = [5, 9, 13, 20, 7]
    plain = list(prompt)
    with torch.inference_mode():
        for _ in range(12):
            plain.append(int(model(input_ids=torch.tensor([plain])).logits[0, -1].argmax()))
    tokens = speculate_tree(CachedLM(model), MedusaProposer(loaded), prompt, max_tokens=12, sampling=SamplingParams(temperature=0),
                            generator=torch.Generator().manual_seed(0), ends=set(), stats=GenerationStats(), local=LocalStats())
    assert tokens == plain[len(prompt):]
    # With held-out accuracies per rank, the tree is Medusa's sparse one, and still exact.
    loaded.rank_accuracy = [[0.5, 0.2, 0.1], [0.6, 0.3, 0.05], [0.7, 0.2, 0.1]]
    sparse = MedusaProposer(loaded, nodes=7)
    # Path scores 0.5, 0.3, 0.21, 0.2, 0.15, 0.12, 0.105; next would be (2,) at 0.1.
    assert sparse.paths == [(0,), (0, 0), (0, 0, 0), (1,), (0, 1), (1, 0), (0, 1, 0)]
    tree, _ = sparse.propose(torch.randn(1, model.config.hidden_size, dtype=torch.float64), torch.tensor([3]), SamplingParams(temperature=0),
                             torch.Generator())
    assert tree.parents.tolist() == [-1, 0, 1, -1, 0, 3, 4]
    tokens = speculate_tree(CachedLM(model), sparse, prompt, max_tokens=12, sampling=SamplingParams(temperature=0),
                            generator=torch.Generator().manual_seed(0), ends=set(), stats=GenerationStats(), local=LocalStats())
    assert tokens == plain[len(prompt):]
    assert MedusaProposer(loaded, shape=(2, 1, 1)).paths is None  # an explicit shape wins


def test_medusa_heads_trained_on_the_targets_own_text_guess_it_better_and_resume(tmp_path):
    """Self-distillation on a tiny target: the data are its own greedy
    continuations (so its LM head's top-1 on them is ~1), trained heads
    guess the tokens further ahead better than untrained ones, a run
    resumes from its checkpoint, and a checkpoint of other data is refused."""
    from blackbox_spec._exceptions import ConfigurationError
    from blackbox_spec.local.heads import MedusaHeads, load_medusa
    from blackbox_spec.local.train_heads import accuracy, distill, greedy_continuations, train_medusa

    from .tiny_models import tiny_model

    model, tokenizer = tiny_model()
    prompts = ["def add(a, b):", "The model reads", "你好", "def f(x):\n    return", "The answer"]
    answers = greedy_continuations(model, tokenizer, prompts, max_tokens=24)
    assert all(answers)
    data = distill(model, tokenizer, prompts, answers, heads=2)
    assert data.hidden.shape[0] == data.following.shape[0] > 50 and data.following.shape[1] == 3
    before = accuracy(MedusaHeads(data.hidden.shape[1], 2, model.get_output_embeddings()), data)
    assert before.lm_head_top1 > 0.9  # the data are the target's own greedy choices
    details = train_medusa(model, tokenizer, data, data, tmp_path / "heads", heads=2, epochs=40, batch=64, lr=3e-3)
    assert details["held_out_top1"][0] > max(2 * before.top1[0], before.top1[0] + 0.1)  # memorised, at least (a 32-wide head)
    assert torch.load(tmp_path / "heads" / "checkpoint.pt", weights_only=True)["epoch"] == 40
    again = train_medusa(model, tokenizer, data, data, tmp_path / "heads", heads=2, epochs=40)
    assert again["train_seconds"] == details["train_seconds"]  # resumed at the end: nothing more to train
    loaded = load_medusa(tmp_path / "heads", model, tokenizer)
    for j, row in enumerate(loaded.rank_accuracy):  # per rank, recorded for the sparse tree: they add up to top-1 and top-10
        assert math.isclose(row[0], details["held_out_top1"][j], abs_tol=1e-3) and math.isclose(sum(row), details["held_out_top10"][j], abs_tol=2e-3)
    other = distill(model, tokenizer, prompts[:2], answers[:2], heads=2)
    with pytest.raises(ConfigurationError, match="another training run"):
        train_medusa(model, tokenizer, other, other, tmp_path / "heads", heads=2, epochs=41)


def test_bspec_heads_train_writes_a_heads_folder_and_refuses_a_missing_target(tmp_path, capsys):
    from blackbox_spec.cli import main

    from .tiny_models import tiny_model

    model, tokenizer = tiny_model()
    model.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    assert main(["heads", "train", "--target", str(tmp_path / "target"), "--out", str(tmp_path / "heads"),
                 "--prompts", "3", "--max-tokens", "8", "--epochs", "1", "--heads", "2"]) == 0
    info = json.loads((tmp_path / "heads" / "heads.json").read_text())
    assert info["kind"] == "medusa" and info["heads"] == 2 and len(info["held_out_top1"]) == 2
    assert main(["heads", "train", "--target", str(tmp_path / "nothing"), "--out", str(tmp_path / "h2")]) != 0
    err = capsys.readouterr().err
    assert "does not exist" in err and "Traceback" not in err


def test_bspec_heads_train_takes_continuations_from_a_server_running_the_target(tmp_path, capsys):
    """``--continuations-from``: a vLLM-like server writes the continuations
    (token ids through ``return_tokens_as_token_ids``); texts from another
    model, or a server that lists no ids, are refused with one line."""
    import httpx
    import respx

    from blackbox_spec.cli import main
    from blackbox_spec.local.train_heads import greedy_continuations

    from .tiny_models import tiny_model

    model, tokenizer = tiny_model()
    model.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    seen: list[dict] = []

    def server(answer_of):
        def completions(request: httpx.Request) -> httpx.Response:
            body = json.loads(request.content)
            seen.append(body)
            tokens = answer_of(body)
            return httpx.Response(200, json={"choices": [{"text": "", "logprobs": {"tokens": tokens}}]})
        return completions

    def own(body: dict) -> list[str]:
        ids = greedy_continuations(model, tokenizer, [body["prompt"]], body["max_tokens"])[0]
        return [f"token_id:{t}" for t in ids]

    def other(body: dict) -> list[str]:
        return [f"token_id:{(7 * k + 3) % 100}" for k in range(body["max_tokens"])]

    args = ["heads", "train", "--target", str(tmp_path / "target"), "--prompts", "4", "--max-tokens", "8", "--epochs", "1", "--heads", "2",
            "--continuations-from", "http://vllm.test/v1"]
    for name, answer_of, code, message in (("own", own, 0, None), ("other", other, 1, "not this target's own greedy text"),
                                            ("no-ids", lambda body: ["a", "b"], 1, "does not list token ids")):
        with respx.mock(assert_all_called=False) as mock:
            mock.get("http://vllm.test/v1/models").respond(200, json={"data": [{"id": "tiny"}]})
            mock.post("http://vllm.test/v1/completions").mock(side_effect=server(answer_of))
            assert main(args + ["--out", str(tmp_path / name)]) == code, name
        err = capsys.readouterr().err
        assert "Traceback" not in err
        if message:
            assert message in err and len(err.strip().splitlines()) == 1, err
    assert seen and all(b["temperature"] == 0 and b["return_tokens_as_token_ids"] and b["model"] == "tiny" for b in seen)
    info = json.loads((tmp_path / "own" / "heads.json").read_text())
    assert info["kind"] == "medusa" and info["trained_vocabulary"] > 0
    assert not (tmp_path / "other" / "heads.json").exists()


def test_bspec_run_local_with_medusa_heads_writes_plain_greedy_and_refuses_misuse(tmp_path, capsys):
    """``bspec run --local --drafter medusa --heads DIR``: at temperature 0
    the text is the target's plain greedy text; heads without --local, with
    a draft model, or for another target are one-line errors."""
    from blackbox_spec.cli import main
    from blackbox_spec.local.heads import MedusaHeads, save_heads, target_identity

    from .tiny_models import tiny_model

    model, tokenizer = tiny_model()
    model.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    heads = MedusaHeads(model.config.hidden_size, 2, model.get_output_embeddings())
    save_heads(tmp_path / "heads", heads, "medusa", target_identity(model.config, tokenizer), hidden=model.config.hidden_size, heads=2)
    other, _ = tiny_model(seed=1)
    other.config.num_hidden_layers = 1
    save_heads(tmp_path / "other", heads, "medusa", target_identity(other.config, tokenizer), hidden=model.config.hidden_size, heads=2)
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("def add(a, b):")
    common = ["run", str(prompt), "--local", "--target-model", str(tmp_path / "target"), "--temperature", "0", "--max-tokens", "16", "--json", "--quiet"]
    assert main(common + ["--drafter", "none"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(common + ["--drafter", "medusa", "--heads", str(tmp_path / "heads")]) == 0
    tree = json.loads(capsys.readouterr().out)
    assert tree["text"] == plain["text"] and tree["stats"]["local"]["target_forwards"] >= 1
    for args, message in (
        (["run", str(prompt), "--drafter", "medusa", "--base-url", "http://127.0.0.1:9/v1"], "needs --local"),
        (common + ["--drafter", "medusa"], "--drafter medusa|eagle --heads DIR"),
        (common + ["--drafter", "medusa", "--heads", str(tmp_path / "heads"), "--draft-model", str(tmp_path / "target")], "no --draft-model"),
        (common + ["--drafter", "medusa", "--heads", str(tmp_path / "other")], "trained for another target"),
    ):
        assert main(args) != 0, args
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (args, err)


def test_a_larger_corpus_reuses_every_cached_answer_and_hidden_state_and_an_eagle_head_starts_from_another(tmp_path, capsys, monkeypatch):
    """The caches are keyed by prompt: going from 3 to 5 prompts asks the
    target for 2 answers and 2 forwards, keeps the first 3 rows as they
    were, and ``--init`` starts an EAGLE head from a trained one."""
    from blackbox_spec import cli
    from blackbox_spec.local import train_heads
    from blackbox_spec.local.train_heads import Sequences, offline_corpus, prompt_key

    from .tiny_models import tiny_model

    model, tokenizer = tiny_model()
    model.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    asked: list[int] = []
    original = train_heads.greedy_continuations, train_heads.distill_sequences

    def counting_continuations(model, tokenizer, prompts, max_tokens, progress=None):
        asked.append(len(prompts))
        return original[0](model, tokenizer, prompts, max_tokens, progress)

    def counting_forwards(model, tokenizer, prompts, continuations, progress=None):
        asked.append(-len(prompts))
        return original[1](model, tokenizer, prompts, continuations, progress)

    monkeypatch.setattr(train_heads, "greedy_continuations", counting_continuations)
    monkeypatch.setattr(train_heads, "distill_sequences", counting_forwards)
    args = ["heads", "train", "--target", str(tmp_path / "target"), "--kind", "eagle", "--max-tokens", "6", "--epochs", "1"]
    assert cli.main(args + ["--prompts", "3", "--out", str(tmp_path / "small")]) == 0
    first = torch.load(tmp_path / "small" / "hidden-6.pt", weights_only=True)
    (tmp_path / "big").mkdir()
    for name in ("answers-6.json", "hidden-6.pt"):
        (tmp_path / "big" / name).write_bytes((tmp_path / "small" / name).read_bytes())
    assert cli.main(args + ["--prompts", "5", "--out", str(tmp_path / "big"), "--init", str(tmp_path / "small")]) == 0
    assert asked == [3, -3, 2, -2]
    prompts = offline_corpus(5)
    answers = json.loads((tmp_path / "big" / "answers-6.json").read_text())
    assert sorted(answers) == sorted(prompt_key(p) for p in prompts)
    grown = torch.load(tmp_path / "big" / "hidden-6.pt", weights_only=True)
    assert grown["keys"][:3] == first["keys"] == [prompt_key(p) for p in prompts[:3]]
    old, new = Sequences(**first["sequences"]), Sequences(**grown["sequences"])
    assert torch.equal(new.pick([0, 1, 2]).hidden, old.hidden) and torch.equal(new.pick([2, 0]).tokens, old.pick([2, 0]).tokens)
    info = json.loads((tmp_path / "big" / "heads.json").read_text())
    assert info["started_from"] == str(tmp_path / "small") and info["epochs"] == 1
    assert cli.main(args[:4] + ["--kind", "medusa", "--out", str(tmp_path / "m"), "--init", str(tmp_path / "small")]) != 0
    assert cli.main(args + ["--out", str(tmp_path / "e"), "--init", str(tmp_path / "nothing")]) != 0
    err = capsys.readouterr().err
    assert "--init starts an EAGLE head" in err and "Traceback" not in err


def test_the_offline_corpus_holds_edits_sql_questions_and_prose_but_no_bench_prompt_and_no_repeat():
    from blackbox_spec.bench.workloads import PROMPTS
    from blackbox_spec.local.train_heads import offline_corpus

    corpus = offline_corpus(1400)
    assert len(corpus) == len(set(corpus)) == 1400
    assert not {p.text for p in PROMPTS} & set(corpus)
    assert offline_corpus(700) == corpus[:700]  # a larger corpus extends a smaller one: caches grow
    for marker, least in (("Add type hints to this function", 80), ("Port this function to JavaScript", 80),
                          ("Rename the function", 80), ("SQL query", 60), ("short story", 60), ("What is Python's `", 80)):
        assert sum(marker in p for p in corpus) >= least, marker

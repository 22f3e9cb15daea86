"""EAGLE in local target mode (``blackbox_spec/local/eagle.py``): the head's
cache and tree rows against single-path forwards from scratch, the tree loop
equal to plain greedy at T=0 and following the target's distribution at
T=1, training on a tiny target's own text, and the heads folder's checks.
Tiny random-init models built here (no downloads)."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch", reason="local mode needs the hf extra (torch): pip install 'blackbox-spec[hf]'")
pytestmark = pytest.mark.torch

from blackbox_spec._stats import GenerationStats
from blackbox_spec.local.sampling import SamplingParams
from blackbox_spec.local.tree import ROOT

from .tiny_models import tiny_model

GREEDY = SamplingParams(temperature=0)


def noisy_head(model, seed: int = 3, vocab=None):
    """A head for ``model`` with its layer perturbed, so it guesses
    differently from the target's own last layer (and often wrong)."""
    from blackbox_spec.local.eagle import new_head

    vocab = torch.arange(model.config.vocab_size) if vocab is None else vocab
    head = new_head(model, vocab)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in head.named_parameters():
            if parameter.requires_grad:
                parameter.add_(0.3 * torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype))
    return head.eval()


def prompt_features(model, ids):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]


def chain_logprobs(head, features, tokens, path_tokens):
    """From scratch, no cache: the confirmed pairs, then the path's tokens
    fed one after another with the feature the head predicted before each.
    Returns the draft log-probabilities after the root and after each path
    token."""
    from blackbox_spec.local.eagle import causal

    feats, toks = list(features), list(tokens)
    out = []
    with torch.inference_mode():
        for step in range(len(path_tokens) + 1):
            T = len(toks)
            predicted, _ = head(torch.stack(feats)[None], torch.tensor([toks]), torch.arange(T)[None], causal(T))
            out.append(head.draft_logits(predicted[0, -1]).log_softmax(-1))
            if step < len(path_tokens):
                feats.append(predicted[0, -1])
                toks.append(path_tokens[step])
    return out


def test_each_tree_node_scores_what_a_single_path_forward_from_scratch_gives():
    """The proposer's cache (filled in two calls) and its tree rows (each
    node sees the confirmed rows and its ancestors, at its depth's position)
    give every node the path confidence that a forward from scratch over
    the context and that one path gives."""
    from blackbox_spec.local.eagle import EagleProposer

    model, _ = tiny_model()
    head = noisy_head(model)
    proposer = EagleProposer(head, depth=4, expand=3, nodes=12)
    ids = [5, 9, 13, 20, 7, 11, 30]
    features = prompt_features(model, ids + [40, 41])
    # The prompt, then two accepted tokens (40, 41) with 42 pending.
    proposer.propose(features[: len(ids)], torch.tensor(ids[1:] + [40]), GREEDY, torch.Generator())
    tree, q = proposer.propose(features[len(ids):], torch.tensor([41, 42]), GREEDY, torch.Generator())
    confirmed_features, confirmed_tokens = features, ids[1:] + [40, 41, 42]
    assert len(tree) == 12 and q.shape == (12, model.config.vocab_size)
    assert torch.equal(q.argmax(-1), tree.tokens) and bool((q.sum(-1) == 1).all())
    assert max(node.depth for node in proposer.drafted) == 4 and len(proposer.drafted) > 12
    index = {node: i for i, node in enumerate(proposer.kept)}
    for node in range(len(proposer.drafted)):  # kept or not: deep ones read their ancestors' tree rows
        path, at = [], node
        while at != ROOT:
            path.append(proposer.drafted[at].token)
            at = proposer.drafted[at].parent
        path = path[::-1]
        logprobs = chain_logprobs(head, confirmed_features, confirmed_tokens, path[:-1])
        expected = sum(float(lp[token]) for lp, token in zip(logprobs, path))
        assert math.isclose(proposer.drafted[node].score, expected, abs_tol=1e-6), (path, proposer.drafted[node].score, expected)
        # siblings are the parent's best children: this one is among its top `expand`
        assert path[-1] in logprobs[-1].topk(3).indices.tolist()
        parent = proposer.drafted[node].parent
        if node in index:
            assert int(tree.parents[index[node]]) == (ROOT if parent == ROOT else index[parent])


def test_the_eagle_tree_loop_at_temperature_zero_writes_plain_greedy_text():
    from blackbox_spec.local.eagle import EagleProposer
    from blackbox_spec.local.engine import CachedLM, LocalStats
    from blackbox_spec.local.tree_engine import speculate_tree

    model, _ = tiny_model()
    prompt = [5, 9, 13, 20, 7]
    plain = list(prompt)
    with torch.inference_mode():
        for _ in range(24):
            plain.append(int(model(input_ids=torch.tensor([plain])).logits[0, -1].argmax()))
    # An untouched head starts as the target's own last layer: it guesses
    # right often, so long paths get accepted and rolled back.
    for head in (noisy_head(model), noisy_head(model, seed=9)):
        proposer = EagleProposer(head, depth=4, expand=3, nodes=10)
        for _ in range(2):  # the proposer starts afresh on a new text
            stats, local = GenerationStats(), LocalStats()
            tokens = speculate_tree(CachedLM(model), proposer, prompt, max_tokens=24, sampling=GREEDY,
                                    generator=torch.Generator().manual_seed(0), ends=set(), stats=stats, local=local)
            assert tokens == plain[len(prompt):]
            assert local.target_forwards < 24


def test_the_tree_loop_with_an_eagle_head_samples_what_the_target_does():
    """The whole loop at T=1 (tree forwards, the multi-draft rule over
    EAGLE's top picks, the kept path, the head's cache across rounds): its
    first three tokens follow the target's joint over an 8-token vocabulary."""
    from blackbox_spec.local.eagle import EagleProposer
    from blackbox_spec.local.engine import LocalSpeculator, LocalStats
    from blackbox_spec.local.sampling import as_generator

    from .chi_square import chi_square_p_value, joint_counts
    from .test_local_engine import DEVICE, SETTINGS, VOCAB, small_vocab_pair, speculate_tree_row, target_joint

    target, _ = small_vocab_pair()
    head = noisy_head(target, seed=4).to(DEVICE)
    engine = LocalSpeculator(target, None, None, proposer=EagleProposer(head, depth=2, expand=2, nodes=4))
    params, samples = SETTINGS["T=1.0"], 6000
    generator = as_generator(78, DEVICE)
    rows, accepted, forwards = [], 0, 0
    for _ in range(samples):
        stats, local = GenerationStats(), LocalStats()
        rows.append(speculate_tree_row(engine, params, generator, stats, local)[:3])
        accepted, forwards = accepted + stats.accepted_tokens, forwards + local.target_forwards
    counts = joint_counts(torch.tensor(rows), VOCAB)
    joint = target_joint(target, params)
    assert chi_square_p_value(counts.view(VOCAB, -1).sum(1), joint.sum((1, 2))) > 0.01  # first token
    assert chi_square_p_value(counts, joint) > 0.01  # the first three
    assert 0.2 * forwards < accepted < 1.8 * forwards, (accepted, forwards)  # drafts were taken and refused


def test_an_eagle_head_trained_on_the_targets_own_text_guesses_it_better_resumes_and_is_refused_elsewhere(tmp_path):
    from blackbox_spec._exceptions import ConfigurationError
    from blackbox_spec.local.eagle import load_eagle
    from blackbox_spec.local.heads import load_medusa
    from blackbox_spec.local.train_heads import distill_sequences, eagle_accuracy, greedy_continuations, train_eagle

    model, tokenizer = tiny_model()
    prompts = ["def add(a, b):", "The model reads", "你好", "def f(x):\n    return", "The answer"]
    answers = greedy_continuations(model, tokenizer, prompts, max_tokens=24)
    data = distill_sequences(model, tokenizer, prompts, answers)
    assert int(data.lengths.sum()) == len(data.tokens) == len(data.hidden)
    assert data.medusa(2).following.shape[1] == 3
    before = eagle_accuracy(noisy_head(model, vocab=torch.unique(data.tokens)), data)
    details = train_eagle(model, tokenizer, data, data, tmp_path / "eagle", epochs=30, batch=1, lr=3e-3)
    assert details["held_out_top1"][0] > max(0.6, before[0] + 0.2), (before, details)
    assert torch.load(tmp_path / "eagle" / "checkpoint-eagle.pt", weights_only=True)["epoch"] == 30
    again = train_eagle(model, tokenizer, data, data, tmp_path / "eagle", epochs=30)
    assert again["train_seconds"] == details["train_seconds"]  # resumed at the end
    head = load_eagle(tmp_path / "eagle", model, tokenizer)
    assert math.isclose(eagle_accuracy(head, data)[0], details["held_out_top1"][0], abs_tol=1e-3)
    info = json.loads((tmp_path / "eagle" / "heads.json").read_text())
    assert info["kind"] == "eagle" and info["draft_vocabulary"] == model.config.vocab_size  # the BPE's first 32k: all of a tiny one
    other, _ = tiny_model(seed=1)
    other.config.num_hidden_layers = 3
    with pytest.raises(ConfigurationError, match="trained for another target"):
        load_eagle(tmp_path / "eagle", other, tokenizer)
    with pytest.raises(ConfigurationError, match="'eagle' heads, not medusa"):
        load_medusa(tmp_path / "eagle", model, tokenizer)
    with pytest.raises(ConfigurationError, match="another training run"):
        train_eagle(model, tokenizer, distill_sequences(model, tokenizer, prompts[:2], answers[:2]), data, tmp_path / "eagle", epochs=31)


def test_bspec_run_local_with_an_eagle_head_writes_plain_greedy_and_refuses_medusa_heads(tmp_path, capsys):
    from blackbox_spec.cli import main
    from blackbox_spec.local.heads import MedusaHeads, save_heads, target_identity

    model, tokenizer = tiny_model()
    model.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    head = noisy_head(model)
    save_heads(tmp_path / "eagle", head, "eagle", target_identity(model.config, tokenizer))
    medusa = MedusaHeads(model.config.hidden_size, 2, model.get_output_embeddings())
    save_heads(tmp_path / "medusa", medusa, "medusa", target_identity(model.config, tokenizer), hidden=model.config.hidden_size, heads=2)
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("def add(a, b):")
    common = ["run", str(prompt), "--local", "--target-model", str(tmp_path / "target"), "--temperature", "0", "--max-tokens", "16", "--json", "--quiet"]
    assert main(common + ["--drafter", "none"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(common + ["--drafter", "eagle", "--heads", str(tmp_path / "eagle")]) == 0
    tree = json.loads(capsys.readouterr().out)
    assert tree["text"] == plain["text"] and tree["stats"]["local"]["target_forwards"] >= 1
    for args, message in (
        (common + ["--drafter", "eagle", "--heads", str(tmp_path / "medusa")], "'medusa' heads, not eagle"),
        (["run", str(prompt), "--drafter", "eagle", "--base-url", "http://127.0.0.1:9/v1"], "needs --local"),
    ):
        assert main(args) != 0, args
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (args, err)


def test_training_chains_see_what_a_drafted_node_sees():
    """The training-time test's pass s at row j reads the chain the head
    drafted from the confirmed text up to j - s + 1: equal to feeding that
    chain from scratch (``chain_logprobs``), so training sees what drafting
    will."""
    from blackbox_spec.local.train_heads import chain_passes

    model, _ = tiny_model()
    head = noisy_head(model)
    ids = [5, 9, 13, 20, 7, 11, 30, 41, 42, 43]
    features = prompt_features(model, ids)
    with torch.inference_mode():
        passes = chain_passes(head, features[:-1], torch.tensor(ids[1:]), chain=3)
    for s, j in ((2, 4), (3, 6), (3, 8), (2, 8)):
        start = j - s + 1  # the last confirmed row
        expected = chain_logprobs(head, features[: start + 1], ids[1 : start + 2], ids[start + 2 : j + 2])[-1]
        got = head.draft_logits(passes[s - 1][j]).log_softmax(-1)
        assert torch.allclose(got, expected, atol=1e-8), (s, j)


def test_soft_labels_of_one_hot_distributions_give_the_hard_label_loss_and_train_a_head(tmp_path):
    """EAGLE's soft labels (the target's whole next-token distribution) are
    the hard-label loss when that distribution is one-hot, and a head trained
    on them learns the target's own text as the hard-label one does."""
    from blackbox_spec.local.train_heads import _chain_losses, distill_sequences, eagle_accuracy, greedy_continuations, train_eagle

    model, tokenizer = tiny_model()
    head = noisy_head(model)
    ids = [5, 9, 13, 20, 7, 11, 30, 41, 42, 43]
    features = prompt_features(model, ids)
    labels = torch.tensor([3, 17, 2, 40, 40, 9, 1, 0, 8])
    one_hot = torch.nn.functional.one_hot(labels, model.config.vocab_size).float()
    with torch.inference_mode():
        hard = _chain_losses(head, features[:-1], torch.tensor(ids[1:]), features[1:], labels, chain=2, classify=0.1)
        soft = _chain_losses(head, features[:-1], torch.tensor(ids[1:]), features[1:], one_hot, chain=2, classify=0.1)
        spread = _chain_losses(head, features[:-1], torch.tensor(ids[1:]), features[1:], one_hot * 0.5 + 0.5 / one_hot.shape[1], chain=2, classify=0.1)
    assert all(torch.allclose(h, s) for h, s in zip(hard, soft))
    assert not torch.allclose(hard[0], spread[0])  # the distribution is read, not its argmax

    prompts = ["def add(a, b):", "The model reads", "你好", "def f(x):\n    return", "The answer"]
    data = distill_sequences(model, tokenizer, prompts, greedy_continuations(model, tokenizer, prompts, max_tokens=24))
    before = eagle_accuracy(noisy_head(model, vocab=torch.unique(data.tokens)), data)
    details = train_eagle(model, tokenizer, data, data, tmp_path / "soft", epochs=30, batch=1, lr=3e-3, soft=True)
    assert details["labels"] == "soft"
    # A random tiny target's distributions are nearly flat, so soft labels
    # say less about the argmax here than on a real model: it still learns.
    assert details["held_out_top1"][0] > before[0] + 0.3, (before, details)

"""Local target mode end to end: a tiny random-init transformers pair built
here (no downloads), its rollback KV caches, the output distribution of the
whole engine (100k samples, chi-square), seeds, and the CLI."""

from __future__ import annotations

import copy
import json
import os

import pytest

torch = pytest.importorskip("torch", reason="local mode needs the hf extra (torch): pip install 'blackbox-spec[hf]'")
pytestmark = pytest.mark.torch
transformers = pytest.importorskip("transformers", reason="local mode needs the hf extra (torch): pip install 'blackbox-spec[hf]'")

from blackbox_spec import ConfigurationError, GenerationStats
from blackbox_spec.cli import main
from blackbox_spec.local import CachedLM, LocalSpeculator, LocalStats, SamplingParams, check_same_tokenizer
from blackbox_spec.local.sampling import NO_TOKEN, as_generator, sampling_probs

from .chi_square import chi_square_p_value, joint_counts
from .tiny_models import tiny_model, tiny_tokenizer

# CPU in CI; the device run (benchmarks/local_gpu.sh) sets BSPEC_TEST_DEVICE=cuda
# so the same assertions check the engine's CUDA path.
DEVICE = torch.device(os.environ.get("BSPEC_TEST_DEVICE", "cpu"))
SAMPLES = 100_000
VOCAB = 8
PROMPT = [3, 1, 4, 1, 5]
SETTINGS = {
    "T=1.0": SamplingParams(temperature=1.0),
    "T=0.7": SamplingParams(temperature=0.7),
    "top-k=3": SamplingParams(temperature=1.0, top_k=3),
    "top-p=0.8": SamplingParams(temperature=1.0, top_p=0.8),
}


def small_vocab_pair():
    """A target and a draft over 8 tokens, so that the joint of three tokens
    has 512 cells.  Weights are drawn wide (std 0.3) for peaked, context-
    dependent distributions; the draft is the target plus noise, so drafts
    are accepted often but not always."""
    config = transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, initializer_range=0.3, eos_token_id=None, bos_token_id=None,
        pad_token_id=None, tie_word_embeddings=False,
    )
    torch.manual_seed(11)
    target = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float64).eval()
    draft = copy.deepcopy(target)
    with torch.no_grad():
        for weight in draft.parameters():
            weight.add_(0.05 * torch.randn_like(weight))
    return target.to(DEVICE), draft.to(DEVICE)


def target_joint(model, params: SamplingParams) -> torch.Tensor:
    """P(t1, t2, t3 | PROMPT) from forwards from scratch over all 64 prefixes."""
    pairs = torch.cartesian_prod(torch.arange(VOCAB), torch.arange(VOCAB))
    ids = torch.cat([torch.tensor(PROMPT).expand(len(pairs), -1), pairs], 1).to(DEVICE)
    with torch.no_grad():
        probs = sampling_probs(model(ids).logits[:, -3:], params).cpu()  # rows for t1, t2, t3
    p1 = probs[0, 0]
    p2 = probs[:, 1].view(VOCAB, VOCAB, VOCAB)[:, 0]  # depends on t1 only
    p3 = probs[:, 2].view(VOCAB, VOCAB, VOCAB)
    return p1[:, None, None] * p2[:, :, None] * p3


@pytest.fixture(scope="module")
def pair():
    return small_vocab_pair()


# The static-cache path (the default for these Qwen2 models) in every
# setting; transformers' own cache (the fallback for other architectures) in one.
ENGINE_SETTINGS = [("static", name) for name in SETTINGS] + [("eager", "T=0.7")]


@pytest.mark.parametrize("kind,setting", ENGINE_SETTINGS)
def test_engine_output_follows_the_target(pair, kind, setting):
    target, draft = pair
    params = SETTINGS[setting]
    engine = LocalSpeculator(target, draft, None, gamma=3, engine=kind)
    assert engine.engine == kind or engine.engine.startswith(kind + " ")
    stats, local = GenerationStats(), LocalStats()
    samples = engine.sample_tokens(PROMPT, max_tokens=3, sampling=params, generator=as_generator(2024, DEVICE), rows=SAMPLES, stats=stats, local=local).cpu()
    assert (samples != NO_TOKEN).all()
    joint = target_joint(target, params)
    counts = joint_counts(samples, VOCAB)
    assert chi_square_p_value(counts.view(VOCAB, -1).sum(1), joint.sum((1, 2))) > 0.01  # first token
    assert chi_square_p_value(counts, joint) > 0.01  # the first three
    # The draft alone is measurably different, so agreeing means something.
    assert chi_square_p_value(counts, target_joint(draft, params)) < 1e-6
    # Both paths of the rule ran: many drafts accepted, many rejected.
    assert 0.4 < local.alpha < 0.97, local.alpha
    assert stats.accepted_tokens > 0.3 * SAMPLES and local.rejections > 0.1 * SAMPLES


def test_engine_caches_match_forwards_from_scratch(pair):
    """Rows that accepted different numbers of tokens share one cache with
    holes; each row's logits equal a forward from scratch over its tokens."""
    target, _ = pair
    model = CachedLM(target)
    model.reset(3)
    prompt = torch.tensor([PROMPT] * 3, device=DEVICE)
    model.forward(prompt, torch.ones_like(prompt, dtype=torch.bool), last=1)
    drafts = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 0, 1]], device=DEVICE)
    model.forward(drafts, torch.ones_like(drafts, dtype=torch.bool), last=3)
    model.forget_last(torch.tensor([0, 2, 1], device=DEVICE))  # row 0 keeps all, row 1 one, row 2 two
    pending = torch.tensor([[2, 6], [0, 6], [0, 5]], device=DEVICE)
    valid = torch.tensor([[True, True], [False, True], [False, True]], device=DEVICE)
    logits = model.forward(pending, valid, last=1)[:, -1]
    rows = [PROMPT + [1, 2, 3, 2, 6], PROMPT + [4, 6], PROMPT + [7, 0, 5]]
    for row, tokens in enumerate(rows):
        with torch.no_grad():
            scratch = target(torch.tensor([tokens], device=DEVICE)).logits[0, -1]
        assert torch.allclose(logits[row], scratch, atol=1e-9), row
    assert model.lengths.tolist() == [len(r) for r in rows]
    # One row: forgetting is a plain rollback, the cache shrinks.
    model.reset(1)
    ids = torch.tensor([PROMPT], device=DEVICE)
    model.forward(ids, torch.ones_like(ids, dtype=torch.bool), last=1)
    model.forget_last(torch.tensor([2], device=DEVICE))
    assert model.mask.shape[1] == len(PROMPT) - 2


@pytest.mark.parametrize("kind", ["static", "eager"])
def test_temperature_zero_equals_plain_greedy(kind):
    target, tokenizer = tiny_model(1)
    target, draft = target.to(DEVICE), tiny_model(2)[0].to(DEVICE)
    spec = LocalSpeculator(target, draft, tokenizer, gamma=4, engine=kind).generate("def add(a, b):", max_tokens=40, sampling=SamplingParams(0))
    self_draft = LocalSpeculator(target, target, tokenizer, gamma=4, engine=kind).generate("def add(a, b):", max_tokens=40, sampling=SamplingParams(0))
    ids = tokenizer("def add(a, b):", return_tensors="pt")["input_ids"]
    tokens = ids[0].tolist()
    while len(tokens) < ids.shape[1] + 40:
        with torch.no_grad():
            tokens.append(int(target(torch.tensor([tokens], device=DEVICE)).logits[0, -1].argmax()))
        if tokens[-1] == tokenizer.eos_token_id:
            tokens.pop()
            break
    assert spec.text == self_draft.text == tokenizer.decode(tokens[ids.shape[1]:])
    # A draft that is the target is always right: gamma + 1 tokens per forward.
    assert self_draft.stats.acceptance_rate == 1.0 and self_draft.local.alpha == pytest.approx(1.0)


def test_seeded_runs_reproduce(pair):
    target, draft = pair
    engine = LocalSpeculator(target, draft, None, gamma=3)
    run = lambda seed: engine.sample_tokens(PROMPT, max_tokens=12, sampling=SETTINGS["T=0.7"], generator=as_generator(seed, DEVICE), rows=64)  # noqa: E731
    assert torch.equal(run(7), run(7))
    if DEVICE.type != "cpu":  # a CPU generator for CUDA models: one clear error, not torch's
        with pytest.raises(ConfigurationError, match="as_generator"):
            engine.sample_tokens(PROMPT, max_tokens=4, sampling=SETTINGS["T=0.7"], generator=as_generator(7))
    assert not torch.equal(run(7), run(8))
    tiny, tokenizer = tiny_model(1)
    single = LocalSpeculator(tiny.to(DEVICE), tiny_model(2)[0].to(DEVICE), tokenizer, gamma=3)
    texts = [single.generate("The model", max_tokens=20, seed=s).text for s in (3, 3, 4)]
    assert texts[0] == texts[1] != texts[2]


def test_end_token_stops_a_row(pair):
    target, draft = pair
    engine = LocalSpeculator(target, draft, None, gamma=3)
    engine.ends = torch.tensor([0], device=DEVICE)
    out = engine.sample_tokens(PROMPT, max_tokens=10, sampling=SETTINGS["T=1.0"], generator=as_generator(1, DEVICE), rows=200)
    for row in out.tolist():
        if 0 in row:
            assert all(t == NO_TOKEN for t in row[row.index(0) + 1 :])
        else:
            assert NO_TOKEN not in row


def test_different_tokenizers_are_refused_with_a_reason():
    tokenizer = tiny_tokenizer()
    other = copy.deepcopy(tokenizer)
    other.add_tokens(["<extra-token>"])
    check_same_tokenizer(tokenizer, copy.deepcopy(tokenizer))
    with pytest.raises(ConfigurationError, match="do not share a tokenizer"):
        check_same_tokenizer(tokenizer, other)


@pytest.fixture(scope="module")
def model_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("local-models")
    for name, seed in (("target", 1), ("draft", 2)):
        model, tokenizer = tiny_model(seed)
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    other = copy.deepcopy(tiny_tokenizer())
    other.add_tokens(["<extra-token>"])
    model, _ = tiny_model(3)
    model.save_pretrained(root / "other")
    other.save_pretrained(root / "other")
    return root


# float32 on a GPU too: bf16 (the cuda default) changes the greedy text between
# a 1-token and a (gamma+1)-token forward at near-ties, which is not what this tests.
ON_DEVICE = [] if DEVICE.type == "cpu" else ["--device", DEVICE.type, "--dtype", "float32"]


def _cli(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as exit:  # argparse's own errors (exit status 2)
        code = exit.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_local_json_seeded_and_greedy_equals_plain(model_folders, tmp_path, capsys):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("def add(a, b):")
    common = ["run", str(prompt), "--local", "--target-model", str(model_folders / "target"), "--max-tokens", "24", "--json", *ON_DEVICE]
    draft = ["--draft-model", str(model_folders / "draft")]
    code, out, err = _cli(capsys, *common, *draft, "--temperature", "0.8", "--top-p", "0.9", "--seed", "5")
    assert code == 0, err
    first = json.loads(out)
    # --gamma auto by default: the first run measures the costs, the next one
    # reads them from the profiles folder and, seeded alike, writes the same text.
    auto = first["stats"]["local"]["auto"]
    assert auto["costs"].startswith("measured in ") and sum(auto["gamma_rounds"].values()) == first["stats"]["local"]["target_forwards"]
    assert first["stats"]["target_calls"] == first["stats"]["local"]["target_forwards"]
    assert first["stats"]["output_tokens"] > 0 and first["finish_reason"] in ("stop", "length")
    assert "--gamma auto: timing this machine's steps of 1..7 tokens" in err  # long work is announced
    code, out, err = _cli(capsys, *common, *draft, "--temperature", "0.8", "--top-p", "0.9", "--seed", "5")
    assert json.loads(out)["text"] == first["text"] and json.loads(out)["stats"]["local"]["auto"]["costs"] == "stored"
    assert "timing this machine" not in err
    code, out, _ = _cli(capsys, *common, *draft, "--temperature", "0", "--gamma", "3")
    greedy = json.loads(out)
    code, out, _ = _cli(capsys, *common, "--drafter", "none", "--temperature", "0")
    plain = json.loads(out)
    assert greedy["text"] == plain["text"] and plain["stats"]["rounds"] == plain["stats"]["output_tokens"]
    code, out, _ = _cli(capsys, *common, "--drafter", "none", "--temperature", "0", "--engine", "eager")
    eager = json.loads(out)
    assert eager["text"] == plain["text"]
    assert (plain["stats"]["local"]["engine"], eager["stats"]["local"]["engine"]) == ("static", "eager (asked for)")


def test_cli_local_streams_text_and_a_stats_line(model_folders, tmp_path, capsys):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("The model")
    code, out, err = _cli(capsys, "run", str(prompt), "--local", "--target-model", str(model_folders / "target"),
                          "--draft-model", str(model_folders / "draft"), "--max-tokens", "16", "--seed", "1", *ON_DEVICE)
    assert code == 0
    assert "tokens/round" in err and "alpha" in err and "loading" in err and "engine static" in err
    assert out.endswith("\n") and len(out) > 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--temperature", "0.5"], "--temperature needs --local"),
        (["--local"], "--local needs --target-model"),
        (["--local", "--target-model", "TARGET"], "--local needs --draft-model"),
        (["--local", "--target-model", "TARGET", "--drafter", "suffix"], "--drafter suffix is for the API mode"),
        (["--local", "--target-model", "TARGET", "--draft-model", "DRAFT", "--base-url", "http://x/v1"], "--base-url is for the API mode"),
        (["--local", "--target-model", "TARGET", "--draft-model", "DRAFT", "--stop", "x"], "--stop is not supported with --local"),
        (["--local", "--target-model", "/nonexistent/folder", "--draft-model", "DRAFT"], "does not exist"),
        (["--local", "--target-model", "TARGET", "--draft-model", "OTHER"], "do not share a tokenizer"),
        (["--local", "--target-model", "TARGET", "--draft-model", "DRAFT", "--top-p", "1.5"], "(0, 1]"),
        (["--local", "--target-model", "TARGET", "--draft-model", "DRAFT", "--device", "cuda"], "cuda"),
        (["--engine", "static"], "--engine needs --local"),
        (["--local", "--target-model", "TARGET", "--draft-model", "DRAFT", "--engine", "eager", "--compile", "on"], "--compile on compiles the static"),
        (["--local", "--target-model", "TARGET", "--draft-model", "DRAFT", "--engine", "fast"], "invalid choice: 'fast'"),
    ],
)
def test_cli_local_errors_are_one_line(model_folders, tmp_path, capsys, extra, message):
    if "--device" in extra and torch.cuda.is_available():
        pytest.skip("this machine has CUDA: --device cuda is valid here")
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("hello")
    names = {"TARGET": "target", "DRAFT": "draft", "OTHER": "other"}
    argv = ["run", str(prompt), *[str(model_folders / names[a]) if a in names else a for a in extra]]
    code, out, err = _cli(capsys, *argv)
    assert code != 0
    errors = [line for line in err.splitlines() if not line.startswith("[bspec] loading")]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in err


# -- bad input that crashed (issue 17) ------------------------------------------------


def test_ended_rows_stop_growing_so_learned_positions_stay_in_range(pair):
    """Rows that have ended still go through each batch, as holes: a model
    with learned positions (GPT-2) has no position past the one checked."""
    target, _ = pair
    positions = len(PROMPT) + 10 + 3 + 1
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2, n_positions=positions, initializer_range=0.3,
                                     bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(5)
    gpt = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float64).eval().to(DEVICE)
    draft = copy.deepcopy(gpt)
    with torch.no_grad():
        for weight in draft.parameters():
            weight.add_(0.05 * torch.randn_like(weight))
    engine = LocalSpeculator(gpt, draft, None, gamma=3)
    engine.ends = torch.tensor([0], device=DEVICE)
    out = engine.sample_tokens(PROMPT, max_tokens=10, sampling=SETTINGS["T=1.0"], generator=as_generator(2, DEVICE), rows=64)
    assert out.shape == (64, 10)
    assert int(engine.target.lengths.max()) <= positions and int(engine.draft.lengths.max()) <= positions
    ended = [row for row in out.tolist() if 0 in row]
    assert ended and len(ended) < 64  # rows ended at different rounds


def test_bad_limits_are_configuration_errors_and_a_tiny_temperature_is_greedy(pair):
    target, draft = pair
    engine = LocalSpeculator(target, draft, None, gamma=2)
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ConfigurationError, match="max_tokens"):
            engine.sample_tokens(PROMPT, max_tokens=bad, sampling=SETTINGS["T=1.0"], generator=as_generator(0, DEVICE))
    for bad in (float("inf"), float("nan"), -1.0):
        with pytest.raises(ValueError, match="temperature"):
            SamplingParams(temperature=bad)
    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0 - 1e-6]], dtype=torch.float64)
    probs = sampling_probs(logits, SamplingParams(temperature=1e-40))
    assert not torch.isnan(probs).any() and probs[0].tolist() == [0.0, 1.0, 0.0, 0.0]
    greedy = engine.sample_tokens(PROMPT, max_tokens=6, sampling=SamplingParams(temperature=0), generator=as_generator(0, DEVICE))
    tiny = engine.sample_tokens(PROMPT, max_tokens=6, sampling=SamplingParams(temperature=1e-38), generator=as_generator(0, DEVICE))
    assert torch.equal(greedy, tiny)


def test_the_tree_loop_with_medusa_heads_samples_what_the_target_does(pair):
    """The whole tree loop (``generate`` with heads: tree forwards, the
    multi-draft rule, the kept path in the cache, bonus tokens), sampled at
    T=1: its first three tokens follow the target's joint, with heads that
    guess wrong often (noisy blocks), so both paths of the rule run.  Fewer
    samples than the rule's own tests (100k rows, ``test_tree.py``): one
    continuation per call here."""
    from blackbox_spec.local.heads import MedusaHeads, MedusaProposer

    target, _ = pair
    heads = MedusaHeads(target.config.hidden_size, 2, target.get_output_embeddings())
    torch.manual_seed(5)
    with torch.no_grad():
        for block in heads.blocks:
            block.linear.weight.normal_(0, 0.5)
    engine = LocalSpeculator(target, None, None, proposer=MedusaProposer(heads.eval(), shape=(2, 1)))
    params, samples = SETTINGS["T=1.0"], 6000
    generator = as_generator(77, DEVICE)
    rows, accepted, forwards = [], 0, 0
    for _ in range(samples):
        stats, local = GenerationStats(), LocalStats()
        tokens = speculate_tree_row(engine, params, generator, stats, local)
        rows.append(tokens[:3])
        accepted, forwards = accepted + stats.accepted_tokens, forwards + local.target_forwards
    counts = joint_counts(torch.tensor(rows), VOCAB)
    joint = target_joint(target, params)
    assert chi_square_p_value(counts.view(VOCAB, -1).sum(1), joint.sum((1, 2))) > 0.01  # first token
    assert chi_square_p_value(counts, joint) > 0.01  # the first three
    assert 0.2 * forwards < accepted < 1.5 * forwards, (accepted, forwards)  # drafts were taken and refused


def speculate_tree_row(engine: LocalSpeculator, params: SamplingParams, generator, stats, local) -> list[int]:
    from blackbox_spec.local.tree_engine import speculate_tree

    return speculate_tree(engine.target, engine.proposer, PROMPT, max_tokens=3, sampling=params, generator=generator, ends=set(), stats=stats, local=local)

"""The static-cache fast path of local target mode (``local/static.py``):
its logits against transformers' forwards from scratch, rollback as a
length, tree forwards and kept paths, the buffer growing under a long tree
walk, the compiled steps, and which engine is chosen and reported."""

from __future__ import annotations

import copy
import os

import pytest

torch = pytest.importorskip("torch", reason="local mode needs the hf extra (torch): pip install 'blackbox-spec[hf]'")
pytestmark = pytest.mark.torch
transformers = pytest.importorskip("transformers", reason="local mode needs the hf extra (torch): pip install 'blackbox-spec[hf]'")

from blackbox_spec import ConfigurationError
from blackbox_spec.local import CachedLM, LocalSpeculator, SamplingParams
from blackbox_spec.local.engine import language_model
from blackbox_spec.local.static import StaticLM, static_unsupported
from blackbox_spec.local.tree import ROOT, DraftTree

from .test_tree import random_tree
from .tiny_models import tiny_model

DEVICE = torch.device(os.environ.get("BSPEC_TEST_DEVICE", "cpu"))
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


def tiny_decoder(family: str, seed: int = 3):
    """A float64 decoder with grouped-query attention: Qwen2 (biased q/k/v
    projections) or Llama (with attention and MLP biases, llama3 rope)."""
    common = dict(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=256, initializer_range=0.3, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if family == "qwen2":
        config = transformers.Qwen2Config(**common)
    else:
        config = transformers.LlamaConfig(**common, attention_bias=True, mlp_bias=True, tie_word_embeddings=True,
                                          rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float64).eval().to(DEVICE)


def scratch_logits(model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokens], device=DEVICE)).logits[0, -1]


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_static_steps_match_forwards_from_scratch_after_rollbacks_and_holes(family):
    """Rows accept different numbers of tokens: each rolls back by a length,
    a row feeding one token instead of two leaves a hole, and every row's
    logits still equal transformers' forward over its own tokens."""
    model = tiny_decoder(family)
    assert static_unsupported(model) is None
    lm = StaticLM(model)
    lm.reset(3, capacity=len(PROMPT) + 8)
    prompt = torch.tensor([PROMPT] * 3, device=DEVICE)
    lm.forward(prompt, torch.ones_like(prompt, dtype=torch.bool), last=1)
    drafts = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 0, 1]], device=DEVICE)
    lm.forward(drafts, torch.ones_like(drafts, dtype=torch.bool), last=3)
    lm.forget_last(torch.tensor([0, 2, 1], device=DEVICE))  # row 0 keeps all, row 1 one, row 2 two
    pending = torch.tensor([[2, 6], [0, 6], [0, 5]], device=DEVICE)
    valid = torch.tensor([[True, True], [False, True], [False, True]], device=DEVICE)
    logits = lm.forward(pending, valid, last=1)[:, -1]
    rows = [PROMPT + [1, 2, 3, 2, 6], PROMPT + [4, 6], PROMPT + [7, 0, 5]]
    for row, tokens in enumerate(rows):
        assert torch.allclose(logits[row], scratch_logits(model, tokens), atol=1e-9), row
    assert lm.lengths.tolist() == [len(r) for r in rows]
    # The rejected entries are still in the buffer: rollback copied nothing.
    assert lm.capacity >= len(PROMPT) + 8


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_a_static_tree_forward_equals_a_forward_of_each_path_and_the_kept_path_continues(family):
    """Repeated tokens among siblings included; after keep_path the next
    forward sees the context, the root and the accepted path only; a walk
    longer than the first buffer grows it and keeps what was written."""
    model = tiny_decoder(family)
    lm = StaticLM(model)
    hidden = lm.read_prompt(PROMPT)
    assert torch.allclose(lm.logits(hidden[-1]), scratch_logits(model, PROMPT), atol=1e-9)
    tree = random_tree(torch.Generator().manual_seed(6), nodes=10, vocab=40)
    tree = DraftTree(torch.cat([tree.tokens[:2], tree.tokens[:1], tree.tokens[3:]]), tree.parents)  # a repeat among the first nodes
    root, text = 33, list(PROMPT)
    first_capacity = lm.capacity
    for round_ in range(40):
        logits = lm.logits(lm.forward_tree(root, tree))
        for node in range(ROOT, len(tree)):
            path = [] if node == ROOT else tree.path(node)
            alone = scratch_logits(model, text + [root] + tree.tokens[path].tolist())
            assert torch.allclose(logits[node + 1], alone, atol=1e-9), (round_, node)
        deepest = max(range(len(tree)), key=lambda n: len(tree.path(n)))
        kept = tree.path(deepest)[: round_ % 3]
        lm.keep_path(kept)
        text += [root] + tree.tokens[kept].tolist()
        root = int(logits[(kept[-1] if kept else ROOT) + 1].argmax())
        if len(text) > 120:
            break
    assert lm.capacity > first_capacity, "the walk outgrew the first buffer"
    assert lm.lengths.tolist() == [len(text)]


def test_compiled_steps_give_the_eager_steps_tokens():
    """torch.compile (inductor here; CUDA graphs on a GPU) over the draft
    and verify steps: the same greedy text, a draft model and plain."""
    target, tokenizer = tiny_model(1)
    draft = tiny_model(2)[0]
    target, draft = target.to(DEVICE), draft.to(DEVICE)
    greedy = SamplingParams(0)
    eager = LocalSpeculator(target, draft, tokenizer, gamma=3, compile=False)
    compiled = LocalSpeculator(target, draft, tokenizer, gamma=3, compile=True)
    assert (eager.engine, compiled.engine) == ("static", "static+compiled")
    for prompt in ("def add(a, b):", "The model"):
        want = eager.generate(prompt, max_tokens=24, sampling=greedy)
        got = compiled.generate(prompt, max_tokens=24, sampling=greedy)
        assert got.text == want.text and got.local.target_forwards == want.local.target_forwards
        assert got.local.to_dict()["engine"] == "static+compiled"


def test_both_engines_write_plain_greedy_and_the_choice_is_reported():
    target, tokenizer = tiny_model(1)
    draft = tiny_model(2)[0]
    target, draft = target.to(DEVICE), draft.to(DEVICE)
    greedy = SamplingParams(0)
    texts = {}
    for engine in ("static", "eager"):
        spec = LocalSpeculator(target, draft, tokenizer, gamma=4, engine=engine)
        plain = LocalSpeculator(target, None, tokenizer, engine=engine)
        texts[engine] = spec.generate("def add(a, b):", max_tokens=40, sampling=greedy)
        assert texts[engine].text == plain.generate("def add(a, b):", max_tokens=40, sampling=greedy).text
    assert texts["static"].text == texts["eager"].text
    assert texts["static"].local.to_dict()["engine"] == "static"
    assert texts["eager"].local.to_dict()["engine"] == "eager (asked for)"
    assert isinstance(LocalSpeculator(target, draft, tokenizer).target, StaticLM)  # auto: static where it can


def test_other_architectures_fall_back_to_eager_with_the_reason_and_static_is_refused_in_one_line():
    config = transformers.GPT2Config(vocab_size=40, n_embd=16, n_layer=1, n_head=2, n_positions=64, bos_token_id=None, eos_token_id=None)
    gpt = transformers.AutoModelForCausalLM.from_config(config).eval()
    lm, chosen = language_model(gpt)
    assert isinstance(lm, CachedLM) and chosen == "eager (gpt2 is not a Qwen2/Llama decoder)"
    with pytest.raises(ConfigurationError, match="^the static engine cannot run this model: gpt2 is not a Qwen2/Llama decoder; use --engine eager") as error:
        language_model(gpt, "static")
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigurationError, match="engine must be one of auto, static, eager"):
        language_model(gpt, "fast")
    sliding = tiny_decoder("qwen2")
    sliding = copy.deepcopy(sliding)
    sliding.config.layer_types = ["sliding_attention"] * 2
    assert static_unsupported(sliding) == "it has sliding-window layers"
    mixed = LocalSpeculator(tiny_decoder("qwen2"), None, None)
    assert mixed.engine == "static"

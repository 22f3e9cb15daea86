"""Draft models: the text-level drafter's logic (with a scripted model), KV
reuse against re-evaluation from scratch (a tiny transformers model, and a
real GGUF through llama-cpp-python), and the errors users see."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from blackbox_spec import ConfigurationError, SpecClient
from blackbox_spec.drafters import DrafterFactory
from blackbox_spec.drafters.model import ModelDrafter, PrefixIndex, common_prefix

from .conftest import needs_llama, needs_torch
from .tiny_models import tiny_model

REFERENCE = "The model reads the text and then the model writes the answer. " * 4


class ScriptedModel:
    """A draft model that knows one text: after a prefix of it, it goes on
    with the rest; anywhere else it ends.  Its tokenizer cuts words
    differently from the target's (longest match over a small vocabulary)."""

    name = "scripted"
    VOCAB = ["<end>", "<bos>", "The", " model", " re", "ads", " the", " te", "xt", " and", " then", " wr", "ites", " answer", ".", " "] + [chr(c) for c in range(32, 127)]

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, bool]] = []

    def tokenize(self, text: str) -> list[int]:
        out, i = [1], 0
        while i < len(text):
            best = max((t for t in range(2, len(self.VOCAB)) if text.startswith(self.VOCAB[t], i)), key=lambda t: len(self.VOCAB[t]))
            out.append(best)
            i += len(self.VOCAB[best])
        return out

    def vocabulary(self) -> list[bytes]:
        return [b"", b""] + [v.encode() for v in self.VOCAB[2:]]

    def is_end(self, token: int) -> bool:
        return token == 0

    def greedy(self, tokens, n, first_allowed=None):
        self.calls.append((len(tokens), n, first_allowed is not None))
        text = "".join(self.VOCAB[t] for t in tokens[1:])
        if not REFERENCE.startswith(text):
            return [0]
        rest, out = REFERENCE[len(text) :], []
        if first_allowed is not None:  # the longest allowed token that fits the rest
            fits = [t for t in first_allowed if rest.startswith(self.VOCAB[t])]
            if not fits:
                return [0]
            first = max(fits, key=lambda t: len(self.VOCAB[t]))
            out.append(first)
            rest = rest[len(self.VOCAB[first]) :]
        out += self.tokenize(rest)[1:]
        return out[:n]


def test_common_prefix_and_prefix_index():
    assert common_prefix([], [1]) == 0 and common_prefix([1, 2], [1, 2]) == 2
    index = PrefixIndex([b"", b"re", b"read", b"rea", b"x"])
    assert sorted(index.starting_with(b"re")) == [1, 2, 3]
    assert index.starting_with(b"z") == []


def test_draft_continues_a_word_the_context_ends_inside():
    """Token healing: "…the model rea" is cut "re"+"a" by the draft
    tokenizer, where the text goes on as " re"+"ads"; the draft must still
    continue the word."""
    drafter = ModelDrafter(ScriptedModel(), start_tokens=6)
    drafter.start(REFERENCE[: REFERENCE.index("reads") + 3])
    draft = drafter.propose(1000)
    assert draft and REFERENCE.startswith(drafter.text + draft)
    assert draft.startswith("ds the")
    assert drafter.model.calls[-1][2]  # the first token was constrained


def test_a_draft_the_text_follows_is_not_recomputed():
    model = ScriptedModel()
    drafter = ModelDrafter(model, start_tokens=8)
    drafter.start("The model")
    first = drafter.propose(1000)
    assert drafter.propose(1000) == first and len(model.calls) == 1
    drafter.update(first[:5], "", 0)  # the target wrote what the draft said
    assert drafter.propose(1000) == first[5:] and len(model.calls) == 1
    drafter.update("XYZ", "", 0)  # and now something else
    assert drafter.propose(1000) == "" and len(model.calls) == 2


def test_outcomes_size_the_next_draft():
    model = ScriptedModel()
    drafter = ModelDrafter(model, start_tokens=8, min_tokens=2, max_tokens=32)
    drafter.start("The")
    draft = drafter.propose(1000)
    drafter.outcome(draft, len(draft))  # held to its end: the next may be longer
    assert drafter.length.limit == 16
    drafter.update(draft, draft, len(draft))
    for _ in range(4):
        d = drafter.propose(1000)
        drafter.outcome(d, 0)  # rejected at once, again and again
        drafter.update("?", "", 0)
        drafter.start(drafter.text[:-1])  # keep the text a prefix of the reference
    assert drafter.length.limit == 2
    assert model.calls[-1][1] <= 3  # the model was asked for 2 tokens (+1 to heal)


# -- KV reuse: identical to re-evaluating from scratch -----------------------------

CONTEXT_STEPS = [
    ("start", "def add(a, b):\n    return"),
    ("append", " a + b\n\ndef sub(a, b):"),
    ("append", "\n    ret"),                  # ends inside a word
    ("rewind", 12),                          # the target left the draft: shorter context
    ("append", "The model reads the text"),
    ("append", " 你好世界 😀"),
]


def contexts():
    text = ""
    for kind, value in CONTEXT_STEPS:
        if kind == "rewind":
            text = text[: -value]
        else:
            text = value if kind == "start" else text + value
        yield text


@needs_torch
def test_hf_kv_reuse_matches_recomputation_from_scratch():
    from blackbox_spec.drafters.hf import HFModel

    model, tokenizer = tiny_model()
    reused = HFModel(model=model, tokenizer=tokenizer)
    for text in contexts():
        tokens = reused.tokenize(text)
        scratch = HFModel(model=model, tokenizer=tokenizer)  # an empty cache
        assert reused.greedy(tokens, 12) == scratch.greedy(tokens, 12), text
        assert reused.greedy(tokens[:-1], 5, first_allowed=list(range(40, 90))) == scratch.greedy(tokens[:-1], 5, first_allowed=list(range(40, 90)))
    full = sum(len(reused.tokenize(t)) + 12 + len(reused.tokenize(t)) + 4 for t in contexts())
    assert reused.evaluations < full / 2  # most of each context came from the cache


@needs_torch
def test_hf_drafter_drafts_equal_fresh_drafters_drafts():
    from blackbox_spec.drafters.hf import HFModel

    model, tokenizer = tiny_model(seed=1)
    long_lived = ModelDrafter(HFModel(model=model, tokenizer=tokenizer))
    long_lived.start("")
    for text in contexts():
        long_lived.text = text
        long_lived._draft_at = -1
        fresh = ModelDrafter(HFModel(model=model, tokenizer=tokenizer))
        fresh.start(text)
        assert long_lived.propose(500) == fresh.propose(500), text


@pytest.fixture(scope="module")
def qwen_gguf() -> Path:
    from blackbox_spec.servers.models import ensure_model

    return ensure_model("qwen2.5-coder-0.5b", log=lambda _: None)


# llama.cpp's CPU logits move by up to ~0.3 with how a context is cut into
# batches (see drafters/llama.py); a stale or misplaced cache entry moves
# them by whole units.
LLAMA_NOISE = 1.0


def agree_but_for_near_ties(reused: list[int], scratch: list[int], scratch_gaps: list[float]) -> bool:
    k = common_prefix(reused, scratch)
    return k == min(len(reused), len(scratch)) or scratch_gaps[k] < LLAMA_NOISE


@needs_llama
def test_llama_kv_reuse_matches_recomputation_from_scratch(qwen_gguf):
    from blackbox_spec.drafters.llama import LlamaCppModel

    reused = LlamaCppModel(qwen_gguf, n_ctx=1024)
    scratch = LlamaCppModel(qwen_gguf, n_ctx=1024)
    scratch.record_gaps = True
    evaluated_from_scratch = identical = 0
    for text in contexts():
        tokens = reused.tokenize(text)
        scratch.llm.n_tokens = 0  # forget the cache: evaluate everything again
        before = scratch.evaluations
        scratch.gaps = []
        a, b = reused.greedy(tokens, 8), scratch.greedy(tokens, 8)
        assert agree_but_for_near_ties(a, b, scratch.gaps), (text, a, b, scratch.gaps)
        identical += a == b
        evaluated_from_scratch += scratch.evaluations - before
    assert identical >= len(CONTEXT_STEPS) - 2
    assert reused.evaluations < evaluated_from_scratch * 0.7


@needs_llama
def test_llama_drafter_drafts_equal_fresh_drafters_drafts(qwen_gguf):
    from blackbox_spec.drafters.llama import LlamaCppModel

    model, scratch = LlamaCppModel(qwen_gguf, n_ctx=1024), LlamaCppModel(qwen_gguf, n_ctx=1024)
    drafter = ModelDrafter(model)
    drafter.start("")
    same = 0
    for text in contexts():
        drafter.text, drafter._draft_at = text, -1
        scratch.llm.n_tokens = 0
        fresh = ModelDrafter(scratch)
        fresh.start(text)
        a, b = drafter.propose(300), fresh.propose(300)
        same += a == b
        # Where they differ, they differ late (a near-tie), never from the start.
        assert a == b or common_prefix(a, b) > 0, (text, a, b)
    assert same >= len(CONTEXT_STEPS) - 2


# -- errors users see ---------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"kind": "crystal-ball"}, "unknown drafter"),
        ({"kind": "llama"}, "needs --draft-model"),
        ({"kind": "hf"}, "needs --draft-model"),
        ({"kind": "llama", "draft_model": "/nonexistent/model.gguf"}, "does not exist"),
        ({"kind": "ngram", "draft_model": "x.gguf"}, "is for --drafter llama or hf"),
    ],
)
def test_drafter_configuration_errors(kwargs, message):
    kind = kwargs.pop("kind")
    with pytest.raises(ConfigurationError, match=message):
        DrafterFactory(kind, **kwargs)


@needs_torch
def test_wrong_model_formats_are_named(tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    with pytest.raises(ConfigurationError, match="not a GGUF file"):
        DrafterFactory("llama", draft_model=str(text))
    with pytest.raises(ConfigurationError, match="is a folder"):
        DrafterFactory("llama", draft_model=str(tmp_path))
    factory = DrafterFactory("hf", draft_model=str(text))
    with pytest.raises(ConfigurationError, match="not a transformers folder"):
        factory.load()


def test_client_checks_the_drafter_at_construction():
    with pytest.raises(ConfigurationError, match="needs --draft-model"):
        SpecClient("http://127.0.0.1:9/v1", "k", "m", drafter="llama")


def test_cli_missing_draft_model_is_one_line(tmp_path):
    prompt = tmp_path / "p.txt"
    prompt.write_text("hello")
    done = subprocess.run(
        [sys.executable, "-m", "blackbox_spec.cli", "run", str(prompt), "--base-url", "http://127.0.0.1:9/v1", "--drafter", "llama", "--draft-model", str(tmp_path / "missing.gguf")],
        capture_output=True, text=True,
    )
    assert done.returncode != 0
    assert done.stderr.strip().count("\n") == 0 and "does not exist" in done.stderr
    assert "Traceback" not in done.stderr


class SlowDrafter:
    """Drafts that never hold, at 50 ms each: drafting must stop paying."""

    name = "slow"

    def __init__(self) -> None:
        self.calls = 0

    def start(self, prompt: str) -> None:
        pass

    def propose(self, max_chars: int) -> str:
        import time

        self.calls += 1
        time.sleep(0.05)
        return "zzzz zzzz zzzz"

    def update(self, accepted: str, draft: str, accepted_draft_chars: int) -> None:
        pass


async def test_a_drafter_that_costs_more_than_it_saves_is_paused(served):
    from .conftest import client_for

    drafter = SlowDrafter()
    async with client_for(drafter=drafter) as client:
        result = await client.generate("The model reads the text. " * 3, max_tokens=80)
    assert result.text == served.generate("The model reads the text. " * 3, 80)[0]
    # 0.5 s to try, plus 1% of the time streamed: about ten 50 ms drafts, not 80.
    assert drafter.calls < 20
    assert any("drafting paused" in n for n in result.stats.notes)


@needs_torch
def test_cli_says_it_is_loading_a_draft_model(tmp_path):
    """A draft model takes seconds to load: the CLI says so before the text."""
    from .tiny_models import tiny_model

    model, tokenizer = tiny_model()
    folder = tmp_path / "tiny"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    prompt = tmp_path / "p.txt"
    prompt.write_text("hello")
    done = subprocess.run(
        [sys.executable, "-m", "blackbox_spec.cli", "run", str(prompt), "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
         "--drafter", "hf", "--draft-model", str(folder)],
        capture_output=True, text=True, timeout=300,
    )
    assert "loading the draft model" in done.stderr
    assert done.returncode != 0 and "Traceback" not in done.stderr  # nothing listens on port 9: one error line after it

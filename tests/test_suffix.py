"""The suffix drafter: its automaton against brute force, its drafts'
frequency scoring and adaptivity, and the session index."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blackbox_spec.drafters.base import DraftLength
from blackbox_spec.drafters.suffix import SessionIndex, SuffixAutomaton, SuffixDrafter, split_pieces


def occurrences(seq: list[int]) -> Counter:
    return Counter(tuple(seq[i:j]) for i in range(len(seq)) for j in range(i + 1, len(seq) + 1))


def state_of(automaton: SuffixAutomaton, word: tuple[int, ...]) -> int | None:
    v = 0
    for s in word:
        v = automaton.next[v].get(s)
        if v is None:
            return None
    return v


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=40))
def test_automaton_knows_every_substring_and_how_often_it_occurs(seq):
    automaton = SuffixAutomaton()
    for s in seq:
        automaton.extend(s)
    automaton.check_integrity()
    counts = occurrences(seq)
    for word, n in counts.items():
        v = state_of(automaton, word)
        assert v is not None and automaton.count[v] == n, word
    # Words that never occur are not accepted.
    rng = random.Random(len(seq))
    for _ in range(50):
        word = tuple(rng.randrange(4) for _ in range(rng.randrange(1, 6)))
        assert (state_of(automaton, word) is not None) == (word in counts)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 2), max_size=30), st.lists(st.integers(0, 2), max_size=30))
def test_walk_tracks_the_longest_suffix_of_the_query_found_in_the_index(indexed, query):
    automaton = SuffixAutomaton()
    for s in indexed:
        automaton.extend(s)
    state = matched = 0
    substrings = occurrences(indexed)
    for i, s in enumerate(query):
        state, matched = automaton.walk(state, matched, s)
        done = query[: i + 1]
        expected = max((k for k in range(1, len(done) + 1) if tuple(done[-k:]) in substrings), default=0)
        assert matched == expected


@given(st.text(alphabet="ab \n\t.(_好", max_size=40), st.text(alphabet="ab \n\t.(_好", max_size=10))
def test_pieces_join_back_and_only_the_last_one_changes_when_text_is_added(text, more):
    pieces = split_pieces(text)
    assert "".join(pieces) == text
    assert split_pieces(text + more)[: max(0, len(pieces) - 1)] == pieces[:-1]


def drafter_on(text: str, **kwargs) -> SuffixDrafter:
    d = SuffixDrafter(**kwargs)
    d.start(text)
    return d


def test_drafts_the_continuation_of_the_longest_match():
    source = "def area(w, h):\n    return w * h\n\n"
    d = drafter_on(source + "print(1)\n" + "def area(w, h):\n    ret")
    assert d.propose(100).startswith("urn w * h\n")  # the unfinished piece " ret" is completed
    assert d.last_match > len("def area(w, h):\n")


def test_the_more_frequent_continuation_wins():
    text = "x = load(a)\n" * 3 + "x = load(b)\n" + "x = load("
    assert drafter_on(text).propose(10).startswith("a)")
    text = "x = load(a)\n" + "x = load(b)\n" * 3 + "x = load("
    assert drafter_on(text).propose(10).startswith("b)")


def test_draft_stops_where_the_path_probability_falls_below_the_floor():
    # After "go to" come ten different places: no continuation is likely enough.
    text = "".join(f"go to place{i} now. " for i in range(10)) + "go to"
    assert drafter_on(text, min_probability=0.2).propose(100) == ""
    assert drafter_on(text, min_probability=0.05).propose(100).startswith(" place")


def test_draft_length_grows_with_the_match_length():
    """Adaptivity: past a fork in the history, a short match earns a short
    draft and a long one a long draft; a copy without forks runs on."""
    shared = " ".join(f"a{i}" for i in range(30))
    p_run, q_run = " ".join(f"p{i}" for i in range(30)), " ".join(f"q{i}" for i in range(30))
    # After the shared run, two thirds of the history go on with p, one third with q.
    body = f"x {shared} {p_run} . y {shared} {q_run} . z {shared} {p_run} . "
    short = drafter_on(body + "| a26 a27 a28")  # a two-piece match (" a28" may still grow)
    long = drafter_on(body + "| " + shared[: shared.index(" a29")])  # a 29-piece match
    short_draft, long_draft = split_pieces(short.propose(10_000)), split_pieces(long.propose(10_000))
    assert short_draft[:2] == [" a29", " p0"] and len(short_draft) <= 2 * 2 + 2
    assert long_draft[:2] == [" a29", " p0"] and len(long_draft) > 30
    copy = drafter_on("say " + shared + " | a3 a4 a5")  # no fork anywhere
    assert len(split_pieces(copy.propose(10_000))) > 20


def test_outcomes_size_the_next_draft():
    body = " ".join(f"w{i}" for i in range(300))
    d = drafter_on(body + " | " + " ".join(f"w{i}" for i in range(100)), max_pieces=256)
    full = d.propose(10_000)
    for _ in range(4):
        d.outcome(full, 3)  # the target keeps leaving the draft early
    assert len(split_pieces(d.propose(10_000))) < len(split_pieces(full)) // 4
    for _ in range(4):
        short = d.propose(10_000)
        d.outcome(short, len(short))  # and then follows it to the end
    assert len(split_pieces(d.propose(10_000))) > len(split_pieces(short))


def test_session_index_drafts_from_earlier_outputs():
    session = SessionIndex()
    answer = "Step 1: read the config file.\nStep 2: validate every field against the schema.\n"
    first = SuffixDrafter(session=session)
    first.start("Turn 1. What do you do?\n")
    first.update(answer, "", 0)
    first.finish()
    second = SuffixDrafter(session=session)
    second.start("Turn 2. And now?\nStep 1: read the")
    assert second.propose(200).startswith(" config file.\nStep 2: validate")
    # Without the session's memory there is nothing to copy.
    alone = SuffixDrafter()
    alone.start("Turn 2. And now?\nStep 1: read the")
    assert alone.propose(200) == ""


def test_session_index_is_bounded_and_evicts_the_oldest_outputs_first():
    session = SessionIndex(max_pieces=400)
    for i in range(30):
        session.add(" ".join(f"turn{i}_word{j}" for j in range(50)))
        session.automaton.check_integrity()
        assert session.pieces <= 400 * 5 // 4
    kept = {vocab for output in session.outputs for vocab in output}
    # Eviction rebuilds the vocabulary too: what only evicted outputs held is gone.
    assert " turn0_word1" not in session.vocabulary.ids
    last_piece = session.vocabulary.ids[" turn29_word1"]
    assert last_piece in kept and state_of(session.automaton, (last_piece,)) is not None


def test_session_index_keeps_a_character_budget():
    session = SessionIndex(max_chars=10_000)
    for i in range(40):
        session.add(f"turn{i} " + "y" * 1000)  # few pieces, many characters
        assert session.chars <= 10_000 * 5 // 4
    assert session.chars == sum(len(p) for output in session.outputs for p in map(session.vocabulary.pieces.__getitem__, output))


def test_prompts_pieces_do_not_grow_the_shared_vocabulary_for_good():
    """``bspec serve`` shares one index among all callers: prompts full of
    unique words (which never become outputs) must not pile up in it."""
    session = SessionIndex()
    for i in range(40):
        d = SuffixDrafter(session=session)
        d.start(" ".join(f"p{i}w{j}" for j in range(5000)))
        d.update(" the answer", "", 0)
        d.finish()
        assert len(session.vocabulary.pieces) <= 2 * session.pieces + 50_000 + 5001
    assert session.pieces == 80 and len(session.vocabulary.pieces) < 60_000


def test_a_long_prompt_indexed_in_a_thread_beside_other_generations():
    import threading

    session = SessionIndex(max_pieces=2_000)
    long_prompt = " ".join(f"w{j % 3000}" for j in range(60_000)) + " w1 w2 w3"
    d = SuffixDrafter(session=session)
    worker = threading.Thread(target=d.start, args=(long_prompt,))
    worker.start()
    i = 0
    while worker.is_alive():  # other generations finish meanwhile (and evict, rebuilding the index)
        session.add(" ".join(f"o{i}_{j}" for j in range(300)))
        i += 1
    worker.join()
    assert i > 0
    assert d.propose(20).startswith(" w4 w5")
    session.automaton.check_integrity()
    assert len(set(session.vocabulary.ids.values())) == len(session.vocabulary.ids)  # no id handed out twice


def test_a_drafter_survives_the_session_index_being_rebuilt_under_it():
    session = SessionIndex(max_pieces=100)
    session.add("letters: alpha beta gamma delta epsilon zeta eta theta")
    d = SuffixDrafter(session=session)
    d.start("say: alpha beta gamma")
    for i in range(10):  # another generation's outputs evict and rebuild
        session.add(" ".join(f"x{i}-{j}" for j in range(60)))
    session.add("letters: alpha beta gamma delta epsilon zeta eta theta")
    assert d.propose(100).startswith(" delta epsilon")


def test_drafts_stop_before_chat_control_tokens():
    d = drafter_on("<|im_start|>user\nhi there<|im_end|>\n<|im_start|>user\nhi")
    draft = d.propose(100)
    assert draft == " there"


def test_draft_length_rule():
    n = DraftLength(start=4, low=2, high=16)
    n.observe(4, 4)
    assert n.limit == 8
    n.observe(8, 8)
    n.observe(16, 16)
    assert n.limit == 16
    n.observe(16, 0)
    assert n.limit == 8
    with pytest.raises(ValueError):
        DraftLength(start=1, low=2, high=3)


def test_alternatives_take_the_runner_up_at_the_first_uncertain_piece():
    text = "x = load(a)\ny = 2\n" * 3 + "x = load(b)\nz = 3\n" + "x = load("
    d = drafter_on(text)
    main, second = d.propose_alternatives(100)
    assert main.startswith("a)\ny = 2")
    assert second.startswith("b)\nz = 3")
    # Where the history never forked, there is one draft only.
    assert len(drafter_on("say one two three four five | one two three").propose_alternatives(100)) == 1


def test_first_occurrences_are_tracked():
    automaton = SuffixAutomaton()
    seq = [1, 2, 3, 1, 2, 4, 1, 2, 3]
    for s in seq:
        automaton.extend(s)
    for i in range(len(seq)):
        for j in range(i + 1, len(seq) + 1):
            word = tuple(seq[i:j])
            first = min(k + len(word) for k in range(len(seq)) if tuple(seq[k : k + len(word)]) == word)
            assert automaton.first_end[state_of(automaton, word)] == first


def test_after_an_edit_the_copy_resumes_where_it_was():
    """The target renamed a function mid-copy: the text's ending occurs
    nowhere, but the rest of the copy is obvious."""
    source = "import json\nfrom util import log\n\ndef parseQuery(text):\n    parts = text.split('&')\n    return dict(p.split('=') for p in parts)\n\n"
    d = drafter_on("Code:\n" + source + "Here it is:\n" + "import json\nfrom util import log\n\ndef parseQuery")
    assert d.propose(100).startswith("(text):\n    parts")
    d.update("String", "", 0)  # the edit: not in the source
    assert d.propose(100).startswith("(text):\n    parts = text.split")
    assert d.last_match == -1

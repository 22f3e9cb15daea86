"""The prompt-lookup drafter as a pure function over hand-written text."""

from blackbox_spec.drafters import NGramDrafter, lookup_continuation


def test_copies_what_followed_the_latest_earlier_occurrence():
    text = "a=1; b=2; a=3; b=4; a="
    assert lookup_continuation(text, min_match=2, max_chars=5) == "3; b="


def test_prefers_the_longest_match():
    # "xy" occurs twice; only the longer "wxy" pins down the continuation "1"
    text = "wxy1 zxy2 wxy"
    assert lookup_continuation(text, min_match=2, max_chars=1) == "1"


def test_no_match_is_an_empty_draft():
    assert lookup_continuation("abcdef", min_match=3) == ""
    assert lookup_continuation("", min_match=1) == ""
    assert lookup_continuation("abab", min_match=2, max_chars=0) == ""


def test_drafter_follows_accepted_text():
    d = NGramDrafter(min_match=3)
    d.start("one two three. one tw")
    assert d.propose(6) == "o thre"
    d.update("o three. one", "o thre", 6)
    assert d.propose(5) == " two "

"""The token-boundary rule: aligning logprob token strings over text."""

import pytest

from blackbox_spec._tokens import AlignmentError, align_tokens, is_opaque, looks_special, position_matches

OPAQUE = "\ufffd"


def spans(units):
    return [(u.text, u.tokens, u.start) for u in units]


def test_clean_tokens_are_one_unit_each():
    assert spans(align_tokens("def f", ["def", " f"])) == [("def", 1, 0), (" f", 1, 3)]


def test_opaque_run_becomes_one_unit_of_whole_characters():
    # "好" spread over two byte tokens, emoji over two more
    units = align_tokens("a好😀b", ["a", OPAQUE, OPAQUE, OPAQUE, OPAQUE, "b"])
    assert spans(units) == [("a", 1, 0), ("好😀", 4, 1), ("b", 1, 3)]


def test_opaque_run_at_the_end_takes_the_rest():
    assert spans(align_tokens("x好", ["x", OPAQUE, OPAQUE])) == [("x", 1, 0), ("好", 2, 1)]


def test_text_offset_is_not_trusted_and_repeated_characters_still_align():
    units = align_tokens("好好x", [OPAQUE, OPAQUE, "好", "x"])
    assert spans(units) == [("好", 2, 0), ("好", 1, 1), ("x", 1, 2)]


def test_special_tokens_are_zero_width():
    units = align_tokens("hi", ["<s>", "hi", "<|im_end|>"])
    assert [(u.text, u.special) for u in units] == [("", True), ("hi", False), ("", True)]


def test_misaligned_tokens_raise():
    with pytest.raises(AlignmentError):
        align_tokens("hello", ["help"])
    with pytest.raises(AlignmentError):
        align_tokens("hello", ["hel"])  # does not cover the text


def test_matches_needs_string_and_logprob_of_the_top_entry():
    assert position_matches(" x", -0.1, {" x": -0.1, " y": -2.0})
    assert not position_matches(" x", -2.0, {" x": -2.0, " y": -0.1})
    # colliding opaque keys prove nothing: never a match
    assert not position_matches(OPAQUE, -0.1, {OPAQUE: -0.1})
    assert not position_matches(" x", None, None)


def test_unit_carries_the_correction_at_a_mismatch():
    units = align_tokens("ab", ["a", "b"], [None, -3.0], [None, {"c": -0.1, "b": -3.0}])
    assert units[1].matches is False and units[1].correction == "c"


def test_opaque_and_special_predicates():
    assert is_opaque(OPAQUE) and is_opaque("") and is_opaque("bytes:\\xe4")
    assert not is_opaque("abc")
    assert looks_special("<|endoftext|>") and looks_special("</s>") and not looks_special("hello")


def test_trailing_character_pieces_with_no_text_are_left_out():
    # llama.cpp: max_tokens cut a character; its text is absent, its pieces are not
    units = align_tokens("ab", ["a", "b", "\ufffd", "\ufffd"])
    assert [u.text for u in units] == ["a", "b"]

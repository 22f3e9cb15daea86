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
    assert spans(units) == [("a", 1, 0), ("好", 2, 1), ("😀", 2, 2), ("b", 1, 3)]
    # Two readings of these strings cut between the emoji differently, so no
    # cut there is safe: one unit
    units = align_tokens("a😀😀b", ["a", OPAQUE, OPAQUE * 2, OPAQUE, OPAQUE * 2, "b"])
    assert spans(units) == [("a", 1, 0), ("😀😀", 4, 1), ("b", 1, 3)]


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


def test_a_character_cut_by_max_tokens_is_left_out():
    # older vLLM: the cut character shows as U+FFFD, its pieces are listed
    units = align_tokens("ab\ufffd", ["a", "b", "\ufffd", "\ufffd"])
    assert [u.text for u in units] == ["a", "b"]
    # vLLM 0.32: the text drops it, its pieces show ""
    assert [u.text for u in align_tokens("ab", ["a", "b", "", ""])] == ["a", "b"]
    # llama.cpp: U+FFFD in the text, and no token for it (nor for the pieces)
    assert [u.text for u in align_tokens("ab字\ufffd", ["a", "b"])] == ["a", "b"]


# -- the token strings real servers send (issue 17: each failed before) --------------


def test_a_token_with_a_characters_tail_and_whole_characters_is_placed_by_bytes():
    # "\ufffd文" is the tail of 中 and 文: the run does not end at the first 文
    assert spans(align_tokens("中文文", [OPAQUE, OPAQUE + "文", "文"], partial=True)) == [("中文", 2, 0), ("文", 1, 2)]
    units = align_tokens("中文本文。", [OPAQUE, OPAQUE + "文本", "文", "。"])
    assert spans(units) == [("中文本", 2, 0), ("文", 1, 3), ("。", 1, 4)]


def test_current_vllm_puts_a_characters_pieces_on_the_token_that_completes_it():
    tokens = ["", "🙂", " ", "a", "b", " ", "", "🙂"]
    units = align_tokens("🙂 ab 🙂", tokens, partial=True)
    assert [(u.text, u.tokens) for u in units] == [("🙂", 2), (" ", 1), ("a", 1), ("b", 1), (" ", 1), ("🙂", 2)]
    # what each token showed: nothing for the first piece, then the emoji
    assert units[0].steps == ("", "🙂")
    # a completing token that still starts inside a character
    units = align_tokens("中文", ["", "", OPAQUE * 2 + "文"])
    assert [(u.text, u.tokens) for u in units] == [("中文", 3)]


def test_a_dangling_piece_after_a_split_character_is_not_counted_inside_it():
    # "：" is three bytes; the fourth piece began a character the answer cut.
    # Whether it holds one of them or none, "：" is not a safe unit.
    units = align_tokens("ab：", ["a", "b"] + [OPAQUE] * 4)
    assert sum(u.tokens for u in units) <= 3 and "".join(u.text for u in units) in ("ab", "ab：")
    assert [u.tokens for u in units if u.text == "："] in ([], [3])


def test_exact_byte_forms_and_token_ids():
    # OpenAI's "bytes:" and llama.cpp's "byte: " give the bytes themselves
    units = align_tokens("a中b", ["a", "bytes:\\xe4\\xb8", "byte: \\xad", "b"])
    assert [(u.text, u.tokens, u.sizes) for u in units] == [("a", 1, (1,)), ("中", 2, (2, 1)), ("b", 1, (1,))]
    # ids with no text: one unit with the count, or nothing from a stream yet
    assert spans(align_tokens("ab", ["token_id:64", "token_id:65"])) == [("ab", 2, 0)]
    assert align_tokens("ab", ["token_id:64", "token_id:65"], partial=True) == []


def test_a_tie_with_another_token_confirms_nothing():
    assert not position_matches(" x", -0.5, {" x": -0.5, " y": -0.5})
    assert position_matches(" x", -0.5, {" x": -0.5, " y": -0.6})


def test_a_special_token_inside_the_text_still_counts():
    from blackbox_spec._target import fold_specials

    units = fold_specials(align_tokens("ab", ["a", "<|tool_call|>", "b", "<|endoftext|>"]))
    assert [(u.text, u.tokens) for u in units] == [("a", 1), ("b", 2)]

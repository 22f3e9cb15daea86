"""The prompt-lookup drafter as a pure function over hand-written text."""

import pytest

from blackbox_spec.drafters import NGramDrafter, SuffixDrafter, lookup_continuation
from blackbox_spec.drafters.ngram import copy_from


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


@pytest.mark.parametrize("drafter", [NGramDrafter, SuffixDrafter])
def test_a_repeating_pattern_drafts_past_one_period(drafter):
    """The copy's source meets the current end after one period; copying on
    what it has just written (as LZ77 does) drafts the pattern further."""
    d = drafter()
    d.start("Count: ")
    d.update("tick tock 1, tick tock 1, tick tock 1, tick", "", 0)
    draft = d.propose(120)
    assert len(draft) >= 100
    assert draft.startswith(" tock 1, tick tock 1, tick tock 1,")


@pytest.mark.parametrize("drafter", [NGramDrafter, SuffixDrafter])
def test_text_that_has_not_shown_its_period_is_not_repeated(drafter):
    """A short overlapping match ("    " after three spaces) is no evidence
    of a repeating pattern: the draft stops where its source does."""
    d = drafter()
    d.start("def f():\n    return 1\n\ndef g():\n   ")
    assert len(d.propose(200)) < 40


def test_copy_from_overlaps_only_with_the_period_shown():
    text = "xyz-ab-ab-"
    assert copy_from(text, 7, 10, match=6) == "ab-ab-ab-a"
    assert copy_from(text, 7, 10, match=2) == "ab-"
    assert copy_from(text, 2, 5) == "z-ab-"
    assert copy_from(text, len(text), 5, match=99) == ""


CODE_EDIT_PROMPT = (
    "<|im_start|>user\nModernize the declarations.\n\n```js\n// settings for the loader\nvar a = 1;\nvar b = a + 1;\nconsole.log(b);\n```<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def test_an_answer_that_opens_a_code_fence_drafts_the_prompts_block():
    """The latest "\\n```" is the prompt's closing fence, followed by a
    control token: the draft comes from the opening one instead."""
    d = NGramDrafter(min_match=3)
    d.start(CODE_EDIT_PROMPT)
    d.update("```", "", 0)
    assert d.propose(40) == "js\n// settings for the loader\nvar a = 1;"


def test_a_word_written_over_a_word_resumes_the_copy_after_it():
    """Each "var" the target replaces with "const": the copy resumes after
    the source's "var", not at it (which missed until a suffix matched)."""
    d = NGramDrafter(min_match=3)
    d.start(CODE_EDIT_PROMPT)
    d.update("```", "", 0)
    draft = d.propose(40)
    d.update("js\n// settings for the loader\n", draft, 32)  # a copy followed
    assert d.propose(8) == "var a = "
    d.update("const", "var a = ", 0)
    assert d.propose(12) == " a = 1;\nvar "
    d.update(" a = 1;\nconst", " a = 1;\nvar ", 8)
    assert d.propose(9) == " b = a + "


LOGGING_PROMPT = (
    "<|im_start|>user\nUse logging.\n\n```python\nwhile True:\n    if job is None:\n"
    '        print("worker stopping")\n        return\n    for attempt in range(3):\n'
    "        run(job)\n```<|im_end|>\n<|im_start|>assistant\n"
)


def test_a_suffix_cut_inside_a_word_does_not_re_align_the_copy():
    """"print" became "logging.info": the "ng" of "logging" occurs in
    "stopping" and the "fo" of "info" in "for", both near the copy; neither
    says where it resumes (the real 1.5B logging edit missed three rounds in
    a row on them).  The copy resumes after the source's "print"."""
    d = NGramDrafter(min_match=3)
    d.start(LOGGING_PROMPT)
    d.update("```", "", 0)
    draft = d.propose(60)
    d.update("python\nwhile True:\n    if job is None:\n        ", draft, 40)
    d.update("logging", 'print("', 0)
    assert d.propose(9) == '("worker '
    d.update(".info", '("worker ', 0)
    assert d.propose(9) == '("worker '


def test_a_word_resumes_before_the_full_stop_after_it():
    """"limitaton." fixed to "limitation.": the draft keeps the full stop."""
    d = NGramDrafter(min_match=3)
    d.start("user:\nFix the typos.\n\nThis is a known limitaton.\n\n## License\n\nassistant:\n")
    d.update("This is", "", 0)
    draft = d.propose(16)
    d.update(" a known limitat", draft, 16)  # a copy followed
    draft = d.propose(8)
    d.update("ion", draft, 0)
    assert d.propose(12) == ".\n\n## Licens"


def test_the_answers_first_draft_is_the_pasted_text():
    """Before any answer text the prompt's ending says nothing; the first
    draft copies what the user pasted after the instruction (here a
    Markdown file whose last fenced block is not its start)."""
    prompt = "<|im_start|>user\nFix the typos.\n\n# quickcache\n\nA small cahce.\n\n```py\nc = Cache()\n```<|im_end|>\n<|im_start|>assistant\n"
    d = NGramDrafter(min_match=3)
    d.start(prompt)
    assert d.propose(20) == "# quickcache\n\nA smal"
    assert d.last_match == -1  # a guess: priced as a re-aligned copy


def test_a_free_form_answer_gets_no_first_draft_from_the_prompt():
    d = NGramDrafter(min_match=3)
    d.start("<|im_start|>user\nWrite a story about a fox.<|im_end|>\n<|im_start|>assistant\n")
    assert d.propose(20) == ""


def _walk(d: NGramDrafter, answer: str, until: str) -> None:
    """Feeds ``answer`` up to ``until`` as rounds would: what each draft got
    right, and the next character."""
    done, end = 0, answer.index(until) + len(until)
    while done < end:
        draft, truth = d.propose(200), answer[done:end]
        k = 0
        while k < min(len(draft), len(truth)) and draft[k] == truth[k]:
            k += 1
        d.update(truth[: k + 1], draft, k)
        done += k + 1


def test_a_section_copied_from_elsewhere_in_the_prompt_beats_the_local_copy():
    """A new changelog entry written on top of the old ones: its lines
    re-aligned the copy into the older sections; once the old heading is
    written again, the long match in the prompt says where the copy is."""
    prompt = (
        "user:\nAdd a 2.4.0 entry.\n\n# Changelog\n\n## 2.3.0 - 2026-10-02\n\n- Added `Client.stream()` for events.\n"
        "- Fixed a leak of connections.\n\n## 2.2.1 - 2026-08-14\n\n- Fixed `timeout=None` being zero.\n\nassistant:\n"
    )
    answer = (
        "# Changelog\n\n## 2.4.0 - 2026-12-01\n\n- Added `Client.close()` is now idempotent.\n- Fixed the default timeout.\n\n"
        "## 2.3.0 - 2026-10-02\n\n- Added `Client.stream()` for events.\n"
    )
    d = NGramDrafter()
    d.start(prompt)
    _walk(d, answer, "## 2.3.0 - 2026-10")
    assert d.propose(30) == "-02\n\n- Added `Client.stream()`"


def test_the_pasted_texts_copy_goes_on_after_the_answers_first_tokens():
    """A stream's first tokens can land before the first draft (a chat on a
    hosted API): the answer so far is the pasted text's start, and the
    draft goes on from there, not from a short match elsewhere."""
    d = NGramDrafter(min_match=3)
    d.start(CODE_EDIT_PROMPT)
    d.update("```js\n", "", 0)
    assert d.propose(24) == "// settings for the load"
    assert d.last_match == -1


def test_a_copy_of_the_conversation_ends_where_its_last_turn_does():
    """A chat's text ends with "assistant:" and the answer follows it: a
    copy of the pasted text that ran on past its turn drafted the
    answer's own opening again (a third longer than any answer, and a side
    branch far into it was billed for nothing)."""
    prompt = "user:\nRename.\n\nfoo = 1\nbar = foo\n\nassistant:\n"
    d = NGramDrafter(min_match=3)
    d.start(prompt)
    d.update("foo = 1\nb", "", 0)
    assert d.propose(200) == "ar = foo"

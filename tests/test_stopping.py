"""Stop sequences, replayed token by token as the server applies them."""

from blackbox_spec._stopping import StopScanner, find_stop


def feed_all(scanner, pieces):
    for p in pieces:
        if scanner.feed(p):
            break
    return scanner.text


def test_stop_inside_one_token_cuts_before_it():
    assert feed_all(StopScanner(["END"]), ["a", "bEND", "c"]) == "ab"


def test_stop_across_tokens():
    assert feed_all(StopScanner(["\n\n"]), ["x\n", "\ny"]) == "x"


def test_first_completed_stop_wins_then_list_order():
    assert feed_all(StopScanner(["abc", "b"]), ["a", "b", "c"]) == "a"
    assert find_stop("xab", 3, ["ab", "b"]) == 1
    assert find_stop("xab", 3, ["b", "ab"]) == 2


def test_no_stop_keeps_everything():
    scanner = StopScanner(None)
    assert not scanner.feed("abc") and scanner.safe_length() == 3


def test_safe_length_holds_back_a_possible_stop_prefix():
    scanner = StopScanner(["STOP"])
    scanner.feed("go ST")
    assert scanner.safe_length() == 3
    assert scanner.safe_length(final=True) == 5
    scanner.feed("AY")
    assert scanner.safe_length() == 7


# -- the server's rule (issue 17) ------------------------------------------------------


def test_the_three_rules_on_one_token_that_completes_two_stops():
    # llama.cpp's earliest start vs. vLLM's list order, on stop=["```", "\n```"]
    steps = ["code", "\n```"]
    texts = {rule: feed_all(StopScanner(["```", "\n```"], rule), steps) for rule in ("first-listed", "earliest-end", "earliest-start")}
    assert texts == {"first-listed": "code\n", "earliest-end": "code\n", "earliest-start": "code"}  # both end together: list order
    texts = {rule: feed_all(StopScanner(["c", "abc", "b"], rule), ["x", "abc"]) for rule in ("first-listed", "earliest-end", "earliest-start")}
    assert texts == {"first-listed": "xab", "earliest-end": "xa", "earliest-start": "x"}


def test_llama_cpp_misses_a_stop_inside_text_it_held_back():
    # "文" came with a token that ended inside the next character; the token
    # that completes it is one byte, so the window (stop + 1 byte) misses it
    scanner = StopScanner(["文"], "earliest-start")
    assert not scanner.feed("", 4) and not scanner.feed("文最", 1)
    assert scanner.text == "文最"
    vllm = StopScanner(["文"], "earliest-end")
    vllm.feed("")
    assert vllm.feed("文最") and vllm.text == ""

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

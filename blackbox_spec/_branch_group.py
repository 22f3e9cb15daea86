"""The group of side branches open beside the main stream (one draft's).

``BranchedStream`` (``_branched_stream``) runs the main stream and decides
when a group opens; this is the group's bookkeeping: which branches are
open and where, which ones the main stream has reached or can no longer
reach, branches deferred until the farthest one has prefilled the draft,
groups that the server queues or that outlive their forecast, and, once a
group has no branch left, what its draft delivered (told to the policy,
the stats and the drafter).  The chain rule itself is pure and lives in
``verifiers.branches``.
"""

from __future__ import annotations

import time
from typing import Any

from ._canon import Canon
from ._drafting import tell_outcome
from ._output import Output
from ._stats import GenerationStats
from ._target import StreamPiece
from .drafters.base import Drafter
from .policy import Policy
from .verifiers.base import Plan
from .verifiers.branches import Branch, Streams, draft_agreement, reached, side_left_draft
from .verifiers.fanout import likely_boundaries


class BranchGroup:
    """The side branches of ``draft`` (opened at ``draft_at`` in the text),
    by offset; empty between groups."""

    def __init__(self, streams: Streams, out: Output, policy: Policy, stats: GenerationStats, drafter: Drafter, canon: Canon) -> None:
        self.streams, self.out, self.policy, self.stats, self.drafter, self.canon = streams, out, policy, stats, drafter, canon
        self.branches: list[Branch] = []
        self.draft, self.draft_at, self.kind = "", 0, "short"
        self.started, self.width, self.tokens_at_open = 0.0, 1, 0
        self.deferred: list[Branch] = []  # branches started once the farthest was read, not yet heard from
        self.deferred_count, self.deferred_at = 0, 0.0
        self.silent = 0  # branches reached before they said anything, long after they were sent
        self.unchecked: tuple[str, int | None] | None = None  # (text, tokens) a group was opened at, not yet checked

    # -- opening --------------------------------------------------------------------

    def open_for(self, proposal: str, plan: Plan, kind: str, trims: bool) -> bool:
        """Open the group ``plan`` says for ``proposal``, its branches where a
        token likely ends (``likely_boundaries``, ``trims`` as there);
        False where the draft has no such place."""
        offsets = likely_boundaries(proposal, plan.width, plan.segment_chars, trims)[1:]
        if offsets:
            self.open(proposal, offsets, kind)
        return bool(offsets)

    def open(self, proposal: str, offsets: list[int], kind: str) -> None:
        out = self.out
        self.unchecked = (out.text, out.tokens if out.exact else None)
        self.canon.prefetch(out.text)
        self.draft, self.draft_at, self.kind = proposal[: offsets[-1]], len(out.text), kind
        self.deferred = []
        # The first few branches and the farthest start now; the ones between
        # wait until the farthest has been prefilled, so that they reuse its
        # prefix cache instead of each prefilling the draft again.
        self.branches = [
            self.streams.open(out.context + proposal[:o], self.draft_at + o, out.remaining, start=k < 3 or k == len(offsets) - 1, side=True)
            for k, o in enumerate(offsets)
        ]
        self.started, self.width, self.tokens_at_open = time.perf_counter(), len(self.branches) + 1, out.tokens
        # A branch sends its text back: whether that tokenizes as written is
        # asked now and read when one is reached.
        for o in offsets:
            self.canon.prefetch(out.text + proposal[:o])

    async def sent_texts_held(self) -> bool:
        """Did the text the last group was opened at tokenize as written?
        Asked when it was opened, read before the next one opens: by then
        the answer has come, and the main stream never waits for the
        tokenizer (waiting before each group took 4% of a GPU-like server's
        time).  A branch is checked where it is reached (``jump``), so a
        group from such text costs only its requests, and only one is sent."""
        sent, self.unchecked = self.unchecked, None
        return await self.canon.holds(*sent) if sent is not None else self.canon.broken is None

    # -- while it lives ---------------------------------------------------------------

    def keep(self, branch: Branch, item: Any) -> None:
        """A side branch's item, kept until the main stream reaches it.  If
        its text already left the draft before the next offset, the branches
        after it can never be reached."""
        group = self.branches
        if branch is group[-1] and not branch.buffered:
            # The farthest branch has read the whole draft into the
            # server's prefix cache: the deferred ones now find it there.
            self.deferred = [b for b in group if b.task is None]
            self.deferred_count, self.deferred_at = len(self.deferred), time.perf_counter()
            for b in group:
                self.streams.start(b)
        elif not branch.buffered and any(b is branch for b in self.deferred):
            # What each branch's own prompt tail costs the server to read
            # (the policy prices a group's width with it).
            self.deferred = [b for b in self.deferred if b is not branch]
            if not self.deferred:
                self.policy.costs.observe_branch_start(self.deferred_count, time.perf_counter() - self.deferred_at)
        branch.buffered.append(item)
        self.policy.costs.branch_spoke = True
        if isinstance(item, StreamPiece):
            branch.side_text += item.text
            k = group.index(branch)
            if k + 1 < len(group) and side_left_draft(self.draft, branch.at - self.draft_at, group[k + 1].at - self.draft_at, branch.side_text):
                self.close(k + 1)

    def walk_chain(self) -> Branch | None:
        """After each unit of the main stream: the branch it has reached (on
        the draft and at the end of a token), if any; branches it can no
        longer reach are closed."""
        _, left = draft_agreement(self.draft, self.out.text[self.draft_at :])
        if left:
            self.close()
            return None
        group = self.branches
        passed, promote = reached([b.at for b in group], [bool(b.buffered) for b in group], len(self.out.text))
        now = time.perf_counter()
        for b in group[:passed]:
            if b.task is not None and not b.buffered and now - b.sent_at > self.policy.costs.first_word_s(b.at - self.draft_at, self.policy.chars_per_token):
                self.silent += 1  # reached, silent long after a first token comes: queued?
            self.streams.close(b)
        chosen = group[passed] if promote else None
        del group[: passed + int(promote)]
        return chosen

    def branch_failed(self, branch: Branch, error: BaseException) -> None:
        """Only speed is lost.  The server may be struggling, so no more
        branches in this generation."""
        self.close(self.branches.index(branch))
        self.policy.drop("branches")
        self.stats.note(f"a side branch failed ({error}); continuing on the main stream, without branches")
        self.end()

    def end_if_late(self) -> None:
        policy = self.policy
        # A group that takes far longer than forecast (a server that queues
        # requests beyond its slots) is given up: the main stream never
        # waited for it, so only its batch cost is lost.
        if self.branches and time.perf_counter() - self.started > 3 * policy.forecast_life_s + 0.5:
            self.drop()
            self.stats.note("side branches took far longer than forecast here; closed")
        # Branches that have not said a word long after a request's first
        # token would have come, where no branch ever has: the server queues
        # them (one slot, a rate limit).  They never delay the main stream,
        # which runs first, but they can't help either: priced as whole
        # requests from now on.
        late = self.branches and time.perf_counter() - self.started > policy.costs.first_word_deadline_s(len(self.draft), policy.chars_per_token)
        if not policy.costs.branch_spoke and (self.silent >= 2 or late):
            self.silent = 0
            policy.costs.observe_queueing()
            self.drop()
            self.stats.note(f"the server queued {self.width - 1} side branches behind the main stream (it runs fewer requests at once); closed")

    # -- closing ----------------------------------------------------------------------

    def close(self, from_index: int = 0) -> None:
        for b in self.branches[from_index:]:
            self.streams.close(b)
        del self.branches[from_index:]

    def end(self) -> None:
        """Once a group has no branch left: what its draft delivered is told
        to the policy and the drafter."""
        if self.draft and not self.branches:
            accepted_chars, _ = draft_agreement(self.draft, self.out.text[self.draft_at :])
            observe_group(self.policy, self.stats, self.draft, accepted_chars, self.kind, self.width, time.perf_counter() - self.started, self.out.tokens - self.tokens_at_open)
            tell_outcome(self.drafter, self.draft, accepted_chars)
            self.draft = ""

    def drop(self) -> None:
        self.close()
        self.end()


def observe_group(policy: Policy, stats: GenerationStats, draft: str, accepted_chars: int, kind: str, width: int, seconds: float, produced: int) -> None:
    """A group of side branches has ended: what its draft delivered, and
    what it saved against plain streaming over its life."""
    drafted = round(len(draft) / policy.chars_per_token)
    accepted = round(accepted_chars / policy.chars_per_token)
    missed = accepted_chars < len(draft)
    saved_s = produced * policy.costs.per_token() - seconds
    policy.observe_branches(kind, accepted, missed, saved_s=saved_s)
    policy.costs.drafting.observe_saving(saved_s)
    stats.observe_draft(drafted_tokens=drafted, accepted_tokens=accepted, drafted_chars=len(draft), accepted_chars=accepted_chars, output_tokens=0)
    stats.trace.append(["branches", len(draft), accepted, width, round(seconds, 3)])

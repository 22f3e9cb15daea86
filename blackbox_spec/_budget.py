"""Keep a generation's bill within R times what one plain call would bill.

Plain decoding sends the prompt once and bills each output token once.
Speculation adds requests (side branches, echo rounds, restarted streams),
each billing its whole prompt.  With ``max_cost=R`` every speculative
request is weighed before it is sent: it goes only if what the generation
has spent so far (the requests that ended, as billed; those still running,
their prompt and what they sent) plus this one stays within R times the
plain bill of the text confirmed so far.  The text's own growth pays for
the next request, so a generation never owes the budget anything: a
request the budget can't afford is simply not sent (the stream goes on
plainly), and speculation resumes when the text has earned the room.

Default: no limit on loopback and private networks (the user's own
server: time is what costs there), R = 2 for any other host.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass
from urllib.parse import urlsplit

from ._bill import Bill, Price, PromptSizes, plain_bill

DEFAULT_MAX_COST = 2.0
# Below this limit a generation decodes plainly from the start, with no
# probe: a fresh process's probe (3-10 small requests) and one speculative
# request each cost a third or more of a short answer's plain bill, so
# there is no room for both.  Measured on the hosted sim, real edits (a
# ~470-token prompt, ~250 tokens out, fresh process each): at limits of
# 1.3 and 1.6 every process spent ~1.31x plain's bill, all of it on its
# probe, and sent no speculative request (docs/results.md, "The bill").
PLAIN_BELOW = 2.0
# A request's cost is an estimate (its prompt's tokens from characters, the
# output a cancelled stream bills): weighed this much higher, so the bill
# stays within its limit when the estimate falls short.
ESTIMATE_MARGIN = 1.15
# Names that are never a paid API's: this machine, a private network's
# conventions, and the names reserved for tests and examples (RFC 2606, 6761, 6762).
PRIVATE_SUFFIXES = (".localhost", ".local", ".internal", ".lan", ".home.arpa", ".corp", ".test", ".example", ".invalid")


def default_max_cost(base_url: str) -> float | None:
    """The bill's limit for a server at ``base_url`` when none is given: none
    for loopback, private addresses and private names (a name without a dot,
    or one of ``PRIVATE_SUFFIXES``), ``DEFAULT_MAX_COST`` for any other.

    >>> default_max_cost("http://127.0.0.1:8000/v1"), default_max_cost("http://10.0.0.7/v1"), default_max_cost("http://gpu-box:8000/v1")
    (None, None, None)
    >>> default_max_cost("https://api.openai.com/v1"), default_max_cost("http://8.8.8.8/v1")
    (2.0, 2.0)
    """
    host = (urlsplit(base_url).hostname or "").lower().rstrip(".")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        private = host == "localhost" or "." not in host or host.endswith(PRIVATE_SUFFIXES)
        return None if private else DEFAULT_MAX_COST
    return None if address.is_private or address.is_loopback or address.is_link_local else DEFAULT_MAX_COST


def check_max_cost(value: object) -> float | None:
    """``max_cost`` as given (None or inf: no limit), or a ValueError that says what is wanted."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 1.0:
        raise ValueError(f"max_cost must be a number >= 1 (times plain's bill) or None, not {value!r}")
    return None if math.isinf(value) else float(value)


@dataclass
class Budget:
    """One generation's limit: its bill within ``ratio`` times plain's.

    ``bill`` is the generation's running bill (``_bill``), ``output``
    what counts its confirmed tokens (an ``Output``), ``prompt_size`` the
    endpoint and characters of its prompt (what plain's request carries)."""

    ratio: float
    price: Price
    bill: Bill
    sizes: PromptSizes
    prompt_size: tuple[str, int]
    output: object

    @property
    def output_tokens(self) -> int:
        return int(getattr(self.output, "tokens", 0))

    def plain_cost(self, output_tokens: int | None = None) -> float:
        """What one plain call for the text so far bills (or for ``output_tokens``)."""
        tokens = self.output_tokens if output_tokens is None else output_tokens
        prompt = self.sizes.estimate(*self.prompt_size, self.bill.reported)
        return self.price.cost(plain_bill(prompt, tokens))

    def spent(self) -> float:
        return self.bill.running_cost(self.price, self.sizes)

    def room(self, covers: float = 0.0) -> float:
        """What may still be spent before the bill passes the limit of the
        text so far and ``covers`` tokens more (which the stream writes, and
        bills, too).  What was spent is at least plain's bill for the text
        so far: the main stream's request (sent with the first group,
        perhaps not yet counted) wrote it."""
        n, more = self.output_tokens, int(covers)
        spent = max(self.spent(), self.plain_cost(n)) + more * self.price.output / 1e6
        return self.ratio * self.plain_cost(n + more) - spent

    def affords(self, prompt_tokens: float, requests: int = 1, waste_tokens: float = 0.0, covers: float = 0.0) -> bool:
        """Whether ``requests`` more requests carrying ``prompt_tokens`` in all
        (and ``waste_tokens`` of output thrown away, as a cancelled stream's)
        fit within the limit now, counting the ``covers`` tokens they would
        confirm: a request pays for itself where it lands."""
        cost = (prompt_tokens * self.price.input + waste_tokens * self.price.output) / 1e6
        return requests <= 0 or ESTIMATE_MARGIN * cost <= self.room(covers)


# Spacings (tokens into a draft) of the side branches weighed under a
# budget: one branch far ahead bills one prompt for a long jump, where the
# time-optimal group of near ones bills one per few tokens.
SPACINGS = (12, 24, 48, 96, 192, 384)
MAX_SPACED = 4  # branches in one spaced group


@dataclass(frozen=True)
class SpacedGroup:
    """``branches`` side branches ``spacing``, 2 x ``spacing``, ... tokens
    into a draft, and what they should do."""

    branches: int
    spacing: float
    # Expected: the chain's lead when the stream reaches the first branch,
    # each branch whose draft prefix holds adding a spacing's worth.
    saved_s: float
    prompt_tokens: float  # what they bill as prompt, all together
    # Expected output thrown away: a branch past the draft's first break
    # decodes until the chain reaches the break.
    waste_tokens: float

    @property
    def reach(self) -> float:
        """How far into the draft the last branch starts: the text gets
        that far wherever the group is of any use."""
        return self.branches * self.spacing

    def cost(self, price: Price) -> float:
        return (self.prompt_tokens * price.input + self.waste_tokens * price.output) / 1e6


def spaced_groups(hazard: float, draft_tokens: float, remaining: int, context_tokens: float, step_s: float, request_s: float) -> list[SpacedGroup]:
    """Each group of 1-``MAX_SPACED`` branches at a spacing of ``SPACINGS``
    that a draft of ``draft_tokens`` reaches, priced.  Branch j starts j
    spacings in and is of use if the draft holds that far, with probability
    ``(1-hazard)^offset`` (the run lengths' geometric model); when the
    stream reaches the first branch, the chain jumps a spacing per branch
    that holds, less the first branch's first-token latency ``request_s``
    (the later ones have started by then).  A branch past the first break
    decodes, for nothing, until the chain reaches the break (at most two
    spacings' time).  Pure.

    >>> [(g.branches, g.spacing, round(g.saved_s, 2), round(g.waste_tokens)) for g in spaced_groups(0.01, 100, 500, 400, 0.025, 0.15)]
    [(1, 12, 0.13, 0), (2, 12, 0.37, 1), (3, 12, 0.58, 4), (4, 12, 0.76, 8), (1, 24, 0.35, 1), (2, 24, 0.72, 7), (3, 24, 1.01, 19), (4, 24, 1.24, 34), (1, 48, 0.65, 6), (2, 48, 1.11, 27), (1, 96, 0.86, 21)]
    """
    out = []
    h = min(0.999, max(1e-6, hazard))
    lag = request_s / step_s  # steps before a branch writes anything
    for spacing in SPACINGS:
        saved = prompt = waste = 0.0
        for j in range(1, MAX_SPACED + 1):
            offset = j * spacing
            if offset > draft_tokens or offset >= remaining:
                break
            holds = (1.0 - h) ** offset
            saved += holds * (spacing * step_s - (request_s if j == 1 else 0.0))
            prompt += context_tokens + offset
            waste += max(0.0, _expected_break(h, offset, cap=2 * spacing) - (1 - holds) * lag)
            out.append(SpacedGroup(j, spacing, max(0.0, saved), prompt, waste))
    return out


def _expected_break(h: float, offset: int, cap: float = math.inf) -> float:
    """E[min(run, cap); run < offset] for a run of geometric length (a miss
    with probability ``h`` per token): how far the stream walks before a
    break that comes before ``offset``, weighed by its chance.

    >>> round(_expected_break(0.5, 1), 3), round(_expected_break(0.01, 1000), 1)
    (0.0, 99.0)
    """
    return sum(min(k, cap) * h * (1 - h) ** k for k in range(int(offset)))

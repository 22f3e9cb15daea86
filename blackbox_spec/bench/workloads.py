"""The prompts ``bspec bench`` and the real-server tests run.

Five workloads of the 0.5B replay set (the copy-only extreme: its answers
return the input almost verbatim), from where drafts hit most to where they
rarely do, and the real edits of ``real_edits`` (``real-edit``,
``real-free-form``):

- ``code-edit``: return a given file with a small change (type hints,
  docstrings, a rename) - most of the answer is already in the prompt;
- ``rewrite``: a document with small corrections;
- ``json``: a structured-data transformation;
- ``free-form``: new prose or code, where prompt lookup rarely hits;
- ``agent``: sessions of turns, each a fresh prompt, whose answers repeat
  much of the earlier turns' answers (an agent regenerating a file as it
  grows, a bot filling the same report template): what the suffix drafter's
  memory of earlier outputs is for.  Prompt lookup sees only the prompt.

Prompts use the ChatML template of the Qwen2.5 instruct models, written out
as raw text, because verification needs ``/v1/completions``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

WORKLOADS = ("code-edit", "rewrite", "json", "free-form", "agent", "real-edit", "real-free-form")
# The 1.5B set (``real_edits``): what ``bspec bench --sim`` runs unless told.
REAL_WORKLOADS = ("real-edit", "real-free-form")


@dataclass(frozen=True)
class Prompt:
    name: str
    workload: str
    text: str
    max_tokens: int
    # Turns of one session share the suffix drafter's memory of earlier
    # outputs (an agent that keeps regenerating similar answers).
    session: str | None = None

    @property
    def prediction(self) -> str | None:
        """What a caller would send as Predicted Outputs: the original text
        the answer edits (the file's code block, or the document to correct);
        None for prompts that edit nothing."""
        if self.workload not in ("code-edit", "rewrite", "json"):
            return None
        user = self.text.split("<|im_start|>user\n", 1)[-1].split("<|im_end|>", 1)[0]
        block = re.search(r"```\w*\n.*```", user, flags=re.S)
        if block:
            return block.group(0)
        return user.split(_TEXT, 1)[1] if _TEXT in user else None

    @property
    def messages(self) -> list[dict[str, str]] | None:
        """The same request as chat messages (None for a raw-text prompt)."""
        found = re.findall(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>\n", self.text, flags=re.S)
        if not found or not self.text.endswith("<|im_start|>assistant\n"):
            return None
        return [{"role": role, "content": content} for role, content in found]


def chatml(user: str, system: str = "You are a careful assistant. Follow the instruction exactly.") -> str:
    return f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


INVENTORY_PY = '''\
import json
from pathlib import Path


class Inventory:
    def __init__(self, path):
        self.path = Path(path)
        self.items = {}

    def load(self):
        if self.path.exists():
            self.items = json.loads(self.path.read_text())
        return self.items

    def save(self):
        self.path.write_text(json.dumps(self.items, indent=2, sort_keys=True))

    def add(self, name, count=1):
        self.items[name] = self.items.get(name, 0) + count
        return self.items[name]

    def remove(self, name, count=1):
        left = self.items.get(name, 0) - count
        if left <= 0:
            self.items.pop(name, None)
            return 0
        self.items[name] = left
        return left

    def total(self):
        return sum(self.items.values())


def merge(first, second):
    merged = dict(first.items)
    for name, count in second.items.items():
        merged[name] = merged.get(name, 0) + count
    return merged
'''

STATS_PY = '''\
import math


def mean(values):
    return sum(values) / len(values)


def variance(values):
    m = mean(values)
    return sum((v - m) ** 2 for v in values) / (len(values) - 1)


def stdev(values):
    return math.sqrt(variance(values))


def median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def zscores(values):
    m = mean(values)
    s = stdev(values)
    return [(v - m) / s for v in values]


def histogram(values, bins):
    low, high = min(values), max(values)
    width = (high - low) / bins or 1
    counts = [0] * bins
    for v in values:
        index = min(int((v - low) / width), bins - 1)
        counts[index] += 1
    return counts
'''

SERVER_JS = '''\
const http = require("http");

function parseQuery(url) {
  const result = {};
  const query = url.split("?")[1] || "";
  for (const pair of query.split("&")) {
    if (!pair) continue;
    const [key, value] = pair.split("=");
    result[decodeURIComponent(key)] = decodeURIComponent(value || "");
  }
  return result;
}

function handleRequest(req, res) {
  const query = parseQuery(req.url);
  if (req.url.startsWith("/hello")) {
    res.writeHead(200, { "Content-Type": "text/plain" });
    res.end("Hello, " + (query.name || "world") + "!");
    return;
  }
  res.writeHead(404, { "Content-Type": "text/plain" });
  res.end("Not found");
}

const server = http.createServer(handleRequest);
server.listen(8080, () => console.log("listening on 8080"));
'''

MEETING_NOTES = '''\
Meeting notes - Platform team, 12 March

Attendees: Priya, Tomas, Grace, Ahmed

1. Release planning. The 4.2 release is planed for the end of the month. Tomas
   will freeze the branch on the 24th and Grace will run the full regresion suite.
2. On-call. Ahmed raised that the pager rotation is to heavy for new joiners.
   We agreed to pair every new joiner with an experianced engineer for their first two weeks.
3. Database migration. Priya presented the plan to move the orders table to the
   new cluster. The migration will run in three stages and can be rolled back at
   every stage. Downtime is expected to be under five minutes.
4. Budget. The team is on track. No new spending requests this quarter.

Action items: Tomas freezes the branch; Grace schedules the regression run;
Ahmed writes the on-call pairing guide; Priya books the migration window.
'''

PRODUCT_COPY = '''\
The Aurora desk lamp gives you warm, even light for reading, writing and late-night
work. Its arm folds flat for travel and its base holds your phone while it charges.
Three brightness levels and a colour temperature dial let you set the mood, and the
lamp remembers your last setting. The shade is made from recycled aluminium and the
cable is wrapped in woven cotton. Aurora ships with a two-year warranty and a USB-C
power adapter. Available in sand, slate and forest green.
'''

RECORDS = [
    {"id": 101, "name": "Ada Lovelace", "email": "ada@example.com", "team": "research", "active": True},
    {"id": 102, "name": "Alan Turing", "email": "alan@example.com", "team": "research", "active": False},
    {"id": 103, "name": "Grace Hopper", "email": "grace@example.com", "team": "compilers", "active": True},
    {"id": 104, "name": "Edsger Dijkstra", "email": "edsger@example.com", "team": "algorithms", "active": True},
    {"id": 105, "name": "Barbara Liskov", "email": "barbara@example.com", "team": "languages", "active": True},
]
RECORDS_JSON = json.dumps(RECORDS, indent=2)

CONFIG_JSON = json.dumps(
    {
        "service": "orders",
        "port": 8080,
        "database": {"host": "db.internal", "port": 5432, "name": "orders", "pool_size": 10},
        "cache": {"enabled": True, "ttl_seconds": 300},
        "features": ["refunds", "gift-cards", "express-shipping"],
        "log_level": "info",
    },
    indent=2,
)

_CODE = "Reply with the complete updated file in one code block and nothing else.\n\n"
_TEXT = "Reply with the complete corrected text only.\n\n"
_JSON = "Reply with the JSON only, in one code block.\n\n"

_CLASS_TASK = (
    "Write a Python module with a class `Inventory` that keeps item counts in a dict. "
    "Methods: {methods}. Give every method type hints and a one-line docstring. Reply with the code only, in one code block."
)
_CLASS_TURNS = (
    "add(name, count=1), remove(name, count=1), total()",
    "add(name, count=1), remove(name, count=1), total(), clear()",
    "add(name, count=1), remove(name, count=1), total(), clear(), names() returning the sorted names",
    "add(name, count=1), remove(name, count=1), total(), clear(), names() returning the sorted names, to_json()",
)
_REPORT_TASK = (
    "Fill in this CI status report template and reply with the filled report only.\n\n"
    "Template:\n## Build report\n- Branch: <branch>\n- Result: <passed or failed>\n- Tests: <passed>/<total> passed\n"
    "- Slowest test: <name> (<seconds> s)\n- Next step: <one sentence>\n\n"
    "Facts: branch {branch}; {passed} of {total} tests passed; slowest test {slow} took {seconds} s."
)
_REPORT_TURNS = (
    {"branch": "main", "passed": 412, "total": 412, "slow": "test_checkout_flow", "seconds": 8.2},
    {"branch": "feature/cart", "passed": 409, "total": 412, "slow": "test_checkout_flow", "seconds": 8.9},
    {"branch": "feature/cart", "passed": 412, "total": 412, "slow": "test_search_index", "seconds": 7.4},
)

PROMPTS: tuple[Prompt, ...] = (
    # code edits: most of the answer is in the prompt
    Prompt("hints-inventory", "code-edit", chatml(f"Add type hints to every function and method in this file. {_CODE}```python\n{INVENTORY_PY}```"), 600),
    Prompt("hints-stats", "code-edit", chatml(f"Add type hints to every function in this file. {_CODE}```python\n{STATS_PY}```"), 500),
    Prompt("docstrings-stats", "code-edit", chatml(f"Add a one-line docstring to every function in this file. {_CODE}```python\n{STATS_PY}```"), 600),
    Prompt("rename-inventory", "code-edit", chatml(f"Rename the method `total` to `count_all` everywhere. {_CODE}```python\n{INVENTORY_PY}```"), 600),
    Prompt("rename-js", "code-edit", chatml(f"Rename the function `parseQuery` to `parseQueryString` everywhere. {_CODE}```javascript\n{SERVER_JS}```"), 450),
    Prompt("port-js", "code-edit", chatml(f"Make the port configurable with the PORT environment variable, defaulting to 8080. {_CODE}```javascript\n{SERVER_JS}```"), 450),
    # document rewriting with small changes
    Prompt("typos-notes", "rewrite", chatml(f"Fix the spelling mistakes in these notes. Change nothing else. {_TEXT}{MEETING_NOTES}"), 400),
    Prompt("names-notes", "rewrite", chatml(f"Replace the name Tomas with Tomasz everywhere in these notes. Change nothing else. {_TEXT}{MEETING_NOTES}"), 400),
    Prompt("us-spelling", "rewrite", chatml(f"Convert this text to American spelling. Change nothing else. {_TEXT}{PRODUCT_COPY}"), 250),
    Prompt("rename-product", "rewrite", chatml(f"The product is renamed from Aurora to Borealis. Update the text. Change nothing else. {_TEXT}{PRODUCT_COPY}"), 250),
    Prompt("date-notes", "rewrite", chatml(f"The meeting was on 19 March, not 12 March, and the freeze is on the 26th. Update the notes. {_TEXT}{MEETING_NOTES}"), 400),
    # structured-data transformation
    Prompt("json-add-field", "json", chatml(f"Add a field \"country\": \"UK\" to every record. {_JSON}```json\n{RECORDS_JSON}\n```"), 500),
    Prompt("json-rename-key", "json", chatml(f"Rename the key \"name\" to \"full_name\" in every record. {_JSON}```json\n{RECORDS_JSON}\n```"), 500),
    Prompt("json-filter", "json", chatml(f"Remove the records whose \"active\" is false. {_JSON}```json\n{RECORDS_JSON}\n```"), 450),
    Prompt("json-config", "json", chatml(f"Change the database pool_size to 20 and the log_level to \"debug\". {_JSON}```json\n{CONFIG_JSON}\n```"), 300),
    Prompt("json-to-yaml", "json", chatml(f"Convert this JSON to YAML. Reply with the YAML only, in one code block.\n\n```json\n{CONFIG_JSON}\n```"), 300),
    # free-form: drafts rarely hit
    Prompt("story", "free-form", chatml("Write a short story (about 150 words) about a lighthouse keeper who finds a message in a bottle."), 250),
    Prompt("explain-tcp", "free-form", chatml("Explain how the TCP three-way handshake works, in two short paragraphs."), 250),
    Prompt("fizzbuzz", "free-form", chatml("Write a Python function that returns the FizzBuzz sequence up to n, with a docstring and a short example."), 250),
    Prompt("ideas", "free-form", chatml("List eight names for a coffee shop run by robots, one per line, each with a short reason."), 250),
    Prompt("sql", "free-form", chatml("Write an SQL query that returns the ten customers with the highest total order value in 2024, from tables customers(id, name) and orders(id, customer_id, total, created_at). Explain it briefly."), 250),
    Prompt("haiku-continue", "free-form", "The old pond lies still;\n", 64),
    # agent sessions: later turns repeat earlier answers (run in this order)
    *(
        Prompt(f"agent-class-{i}", "agent", chatml(_CLASS_TASK.format(methods=methods)), 450, session="agent-class")
        for i, methods in enumerate(_CLASS_TURNS, 1)
    ),
    *(
        Prompt(f"agent-report-{i}", "agent", chatml(_REPORT_TASK.format(**facts)), 300, session="agent-report")
        for i, facts in enumerate(_REPORT_TURNS, 1)
    ),
)


def all_prompts() -> tuple[Prompt, ...]:
    """The 0.5B set's prompts, then the real edits' (``real_edits``)."""
    from .real_edits import REAL_PROMPTS

    return PROMPTS + REAL_PROMPTS


def prompts(workloads: tuple[str, ...] | list[str] = WORKLOADS, names: list[str] | None = None) -> list[Prompt]:
    chosen = [p for p in all_prompts() if p.workload in workloads and (not names or p.name in names)]
    return chosen

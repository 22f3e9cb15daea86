"""The offline prompt corpus heads train on: prompts that exist on every
machine (Python's standard library, and instructions about it, prose and
SQL requests), so a large corpus needs no download."""

from __future__ import annotations

import itertools
from pathlib import Path

# The corpus is at version c4 (notes and bench results name versions; the
# caches are keyed by each prompt, so a new version reuses every answer and
# hidden state it shares with an old one).

# Subjects for prose instructions; none is a bench prompt's (those are what
# the heads are measured on, so they stay out of the training data).
PROSE_SUBJECTS = (
    "a clockmaker's apprentice", "a city garden on a rooftop", "the first snow of winter", "a lost library card",
    "a night train across the desert", "a robot learning to paint", "an old bridge being repaired", "a beekeeper's morning",
    "a chess club in a small town", "a ship's cook during a storm", "a map with a missing island", "a bakery at dawn",
    "a violin found in an attic", "a mountain weather station", "a market that opens at midnight", "a letter never sent",
    "a cat that rides the tram", "the last day of school", "a repair shop for radios", "a kite festival",
    "compound interest", "how vaccines train the immune system", "why the sky is blue", "how a hash table works",
    "public-key cryptography", "the water cycle", "how a compiler parses code", "photosynthesis",
    "how GPS finds a position", "garbage collection in managed languages", "the causes of inflation", "how DNS resolves a name",
    "binary search", "version control with git", "how an electric motor works", "the difference between threads and processes",
    "unit testing", "how a refrigerator keeps food cold", "recursion", "the history of the printing press",
)
# More subjects (version c4): prose was the heads' weakest kind after c3.
MORE_PROSE_SUBJECTS = (
    "a fisherman who hears singing under the ice", "a girl who repairs bicycles", "a detective who cannot smell", "a town without clocks",
    "an astronaut's first night home", "a dog waiting at a station", "a gardener who grows only blue flowers", "a museum guard at night",
    "two rivals on a long bus ride", "a scientist whose experiment talks back", "a farmer during a drought", "a child who collects keys",
    "a translator at a peace conference", "a baker who forgets a recipe", "a postman in a mountain village", "a magician's last show",
    "an old tree in a city square", "a sailor lost in fog", "a new teacher's first week", "a lighthouse turned into a hotel",
    "how airplanes stay in the air", "how batteries store energy", "how the heart pumps blood", "why leaves change colour",
    "how a search engine ranks pages", "how solar panels work", "supply and demand", "how earthquakes happen",
    "how a CPU executes instructions", "how memory caches speed up programs", "what an API is", "how encryption protects messages",
    "how databases use indexes", "how a neural network learns", "the difference between TCP and UDP", "how web browsers render a page",
    "how a bill becomes a law", "why we sleep", "how tides work", "how antibiotics work",
    "good habits for writing readable code", "planning a small vegetable garden", "saving money on groceries", "learning a new language",
    "preparing for a job interview", "keeping a houseplant alive", "running a first 5k", "organising a small team meeting",
    "writing a clear email", "debugging a program step by step", "choosing a laptop", "reducing food waste",
    "sorting algorithms", "the history of the internet", "climate and weather", "the solar system",
    "the Roman aqueducts", "the invention of the telephone", "volcanoes", "coral reefs",
)
PROSE_TEMPLATES = (
    "Write a short story (about 120 words) about {}.",
    "Explain {} to a curious teenager, in two short paragraphs.",
    "List six facts or ideas about {}, one per line, each with a short reason.",
    "Write a four-line poem about {}.",
    "Write a short newsletter paragraph about {}.",
    "Give five tips about {}, as a numbered list.",
)

# Tables for SQL requests (the bench's sql prompt uses customers/orders,
# which stay out): (schema, questions about it).
SQL_TABLES = (
    ("employees(id, name, department_id, salary, hired_at) and departments(id, name)",
     ("the average salary per department, highest first", "the three most recently hired employees in each department",
      "departments with more than ten employees", "employees who earn more than their department's average")),
    ("products(id, name, category, price) and order_items(id, order_id, product_id, quantity)",
     ("the five best-selling products by quantity", "total revenue per category", "products that were never ordered",
      "the most expensive product in each category")),
    ("students(id, name, year) and grades(id, student_id, course, score)",
     ("each student's average score", "the top student in every course", "students who failed at least two courses",
      "the number of students per year with an average above 80")),
    ("books(id, title, author_id, published_year) and authors(id, name, country)",
     ("authors with more than three books", "the newest book of every author", "the number of books per country",
      "books published in the same year as another book by the same author")),
    ("flights(id, origin, destination, departs_at, price) and bookings(id, flight_id, passenger, booked_at)",
     ("the ten busiest routes by bookings", "flights with no bookings", "the average price per origin airport",
      "passengers who booked more than five flights in 2023")),
    ("posts(id, user_id, title, created_at) and comments(id, post_id, user_id, body, created_at)",
     ("the posts with the most comments", "users who commented on their own posts", "the number of posts per month in 2024",
      "posts without any comment in their first week")),
    ("patients(id, name, born_on) and visits(id, patient_id, doctor, visited_at, cost)",
     ("total cost per patient", "each doctor's number of distinct patients", "patients with no visit in the last year",
      "the month with the most visits")),
    ("films(id, title, rating, length) and rentals(id, film_id, customer_id, rented_at, returned_at)",
     ("the most rented film per rating", "rentals returned late, after seven days", "the average rental length per film",
      "customers who rented the same film twice")),
    ("sensors(id, location) and readings(id, sensor_id, value, taken_at)",
     ("the latest reading of every sensor", "the daily average per location", "sensors silent for the last 24 hours",
      "the three highest readings per sensor")),
    ("users(id, email, signed_up_at) and logins(id, user_id, logged_in_at, ip)",
     ("users who never logged in", "the number of logins per day for the last week", "users seen from more than three IPs",
      "the first login of every user")),
)
SQL_TEMPLATES = ("Write an SQL query that returns {q}, from tables {t}. Explain it briefly.",
                 "Using tables {t}, write an SQL query for {q}. Add a comment to each clause.")

_EDIT = "Reply with the complete updated code in one code block and nothing else.\n\n"


def _stdlib_instructions(stdlib: Path) -> list[str]:
    """Chat instructions about the standard library's modules and functions
    (summaries of their docstrings, functions to write from one-line specs)."""
    import ast

    out = []
    for path in sorted(stdlib.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        doc = ast.get_docstring(tree)
        if doc and len(doc) > 120:
            out.append(f"Summarize what this Python module does, in plain words:\n\n{doc[:700]}")
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                line = (ast.get_docstring(node) or "").strip().split("\n")[0]
                if len(line) > 20:
                    args = ", ".join(a.arg for a in node.args.args)
                    out.append(f"Write a Python function `{node.name}({args})` that does this: {line} Add a docstring and a short example.")
    return out


def _stdlib_functions(stdlib: Path, *, shortest: int = 6, longest: int = 30):
    """(name, source, source without its docstring) of the standard library's
    top-level functions of ``shortest``..``longest`` lines."""
    import ast

    for path in sorted(stdlib.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = text.splitlines(keepends=True)
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or not shortest <= node.end_lineno - node.lineno + 1 <= longest:
                continue
            source = "".join(lines[node.lineno - 1 : node.end_lineno])
            bare = source
            first = node.body[0]
            if ast.get_docstring(node) and len(node.body) > 1:
                cut = set(range(first.lineno - node.lineno, first.end_lineno - node.lineno + 1))
                bare = "".join(line for i, line in enumerate(source.splitlines(keepends=True)) if i not in cut)
            yield node.name, source, bare


def _stdlib_edits(stdlib: Path) -> list[str]:
    """Code-edit requests on standard-library functions, in turn: type
    hints, docstrings, a rename, a port to JavaScript (the answers copy
    most of the prompt, as users' edits do, and the port writes JS)."""
    out = []
    for i, (name, source, bare) in enumerate(_stdlib_functions(stdlib)):
        task = i % 4
        if task == 0:
            out.append(f"Add type hints to this function. {_EDIT}```python\n{source}```")
        elif task == 1:
            out.append(f"Add a one-line docstring to this function. {_EDIT}```python\n{bare}```")
        elif task == 2:
            out.append(f"Rename the function `{name}` to `{name}_impl` everywhere. {_EDIT}```python\n{source}```")
        else:
            out.append(f"Port this function to JavaScript. Reply with the JavaScript in one code block and nothing else.\n\n```python\n{bare}```")
    return out


def _stdlib_questions(stdlib: Path) -> list[str]:
    """Open questions about the standard library's public modules and
    packages: the answers are prose with a little code, as most chat is."""
    names = sorted({p.stem for p in stdlib.glob("*.py")} | {p.name for p in stdlib.iterdir() if (p / "__init__.py").exists()})
    names = [n for n in names if not n.startswith("_") and n != "this"]
    return [template.format(n) for template in (
        "What is Python's `{}` module for? Explain in two short paragraphs, with one small example.",
        "List five things to know before using Python's `{}` module, one per line, each with a short reason.",
    ) for n in names]


def offline_corpus(count: int, *, lines: int = 30) -> list[str]:
    """Prompts that exist on every machine, in a fixed order, so a large
    corpus needs no download: in turn, the opening of one of Python's own
    standard-library modules (``lines`` lines each; then its packages'
    modules, tests included: ~13,000 files), a chat instruction about the
    standard library, a prose instruction, an open question about a
    standard-library module, code edits of standard-library functions, an
    SQL request and another prose instruction (the target's answers to
    those are what free-form and code-edit requests look like).  Sources
    that run out drop out of the turn.  The bench's own prompts are left
    out: they are what heads are measured on."""
    import sysconfig

    from ..bench.workloads import chatml

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    top = sorted(stdlib.glob("*.py"))
    deeper = sorted(p for p in stdlib.rglob("*.py") if p.parent != stdlib and "site-packages" not in p.parts)

    def openings():
        for path in top + deeper:
            try:
                text = "".join(path.read_text(encoding="utf-8").splitlines(keepends=True)[:lines])
            except (OSError, UnicodeDecodeError):
                continue
            if len(text.strip()) > 40:
                yield text

    instructions = iter(chatml(text) for text in _stdlib_instructions(stdlib))
    prose = itertools.chain((chatml(t.format(s)) for t in PROSE_TEMPLATES for s in PROSE_SUBJECTS),
                            (chatml(t.format(s)) for t in PROSE_TEMPLATES for s in MORE_PROSE_SUBJECTS))
    questions = iter(chatml(text) for text in _stdlib_questions(stdlib))
    edits = iter(chatml(text) for text in _stdlib_edits(stdlib))
    sql = iter(chatml(template.format(q=q, t=t)) for template in SQL_TEMPLATES for t, questions in SQL_TABLES for q in questions)
    # Prose twice a turn: the heads' weakest kind (c3's bench figures).
    sources = [openings(), instructions, prose, questions, edits, edits, sql, prose]
    corpus: dict[str, None] = {}  # ordered, without repeats
    while len(corpus) < count and sources:
        for source in list(sources):
            text = next(source, None)
            if text is None:
                sources.remove(source)
            elif len(corpus) < count:
                corpus[text] = None
    return list(corpus)

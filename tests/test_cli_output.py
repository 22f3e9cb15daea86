"""``bspec run``'s output formats: plain text, colour for text confirmed
from accepted drafts (on a terminal, ``--color``, ``NO_COLOR``), ``--json``,
``--quiet``, and the live status line.  Whatever the format, the text is the
server's plain text byte for byte once the colour codes are taken out."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys

import pytest

from blackbox_spec import Piece
from blackbox_spec._render import DRAFTED, RESET, Renderer, use_color
from blackbox_spec.orchestrator import pieces_between
from blackbox_spec.testing import FakeTarget

from .conftest import PROMPTS, over_http
from .test_cli import bspec, write

ANSI = re.compile(r"\x1b\[[0-9;]*m")
PROMPT = PROMPTS["code"] * 3


@pytest.fixture(scope="module")
def served():
    with over_http(FakeTarget()) as pair:
        yield pair


def run_args(url: str, path: str, *extra: str) -> list[str]:
    # echo rounds: many short verifications, so some text comes from drafts
    return ["run", path, "--base-url", url, "--model", "fake-model", "--max-tokens", "60", "--strategy", "echo", *extra]


def test_piped_output_is_plain_and_exact(served, tmp_path):
    fake, url = served
    run = bspec(*run_args(url, write(tmp_path, "p.txt", PROMPT)))
    assert run.returncode == 0
    assert "\x1b[" not in run.stdout.decode()
    assert run.stdout.decode() == fake.generate(PROMPT, 60)[0] + "\n"
    err = run.stderr.decode()
    assert err.startswith("[bspec] 60 tokens") and "\r" not in err  # no status line into a pipe


def test_color_always_marks_drafted_text_and_strips_to_the_exact_text(served, tmp_path):
    fake, url = served
    run = bspec(*run_args(url, write(tmp_path, "p.txt", PROMPT), "--color", "always"))
    out = run.stdout.decode()
    coloured = re.findall(re.escape(DRAFTED) + r"(.*?)" + re.escape(RESET), out, flags=re.S)
    assert coloured and all(coloured)  # some text came from drafts, none empty
    assert ANSI.sub("", out) == fake.generate(PROMPT, 60)[0] + "\n"
    assert "green" in run.stderr.decode()  # the legend


def run_on_a_terminal(args: list[str], env: dict[str, str]) -> tuple[str, str]:
    """Run the CLI with stdout on a pseudo-terminal (stderr piped)."""
    leader, follower = pty.openpty()
    environment = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")} | env
    process = subprocess.Popen([sys.executable, "-m", "blackbox_spec.cli", *args], stdout=follower, stderr=subprocess.PIPE, env=environment)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not data:
            break
        chunks.append(data)
    err = process.stderr.read().decode()
    process.wait(timeout=60)
    os.close(leader)
    return b"".join(chunks).decode().replace("\r\n", "\n"), err


@pytest.mark.parametrize("env, extra, coloured", [({}, [], True), ({"NO_COLOR": "1"}, [], False), ({}, ["--no-color"], False), ({}, ["--color", "never"], False)])
def test_a_terminal_gets_colour_unless_asked_not_to(served, tmp_path, env, extra, coloured):
    fake, url = served
    out, err = run_on_a_terminal(run_args(url, write(tmp_path, "p.txt", PROMPT), *extra), env)
    assert (DRAFTED in out) == coloured, out[:200]
    assert ANSI.sub("", out) == fake.generate(PROMPT, 60)[0] + "\n"


def test_json_has_no_colour_and_a_forced_status_line(served, tmp_path):
    fake, url = served
    run = bspec(*run_args(url, write(tmp_path, "p.txt", PROMPT), "--json", "--color", "always", "--progress"))
    data = json.loads(run.stdout)
    assert data["text"] == fake.generate(PROMPT, 60)[0] and "\x1b" not in run.stdout.decode()
    err = run.stderr.decode()
    assert "chars/s" in err and "through drafts" in err  # the status line was shown
    assert "speedup_estimate" in data["stats"]


def test_quiet_prints_only_the_text(served, tmp_path):
    fake, url = served
    run = bspec(*run_args(url, write(tmp_path, "p.txt", PROMPT), "--quiet"))
    assert run.returncode == 0 and run.stderr == b""
    assert run.stdout.decode() == fake.generate(PROMPT, 60)[0] + "\n"


# -- the pieces themselves -------------------------------------------------------------


def test_pieces_split_at_drafted_spans():
    text = "abcdefghij"
    pieces = pieces_between(text, [(2, 4), (4, 6), (8, 12)], 1, 9)
    assert "".join(pieces) == text[1:9]
    assert [(p, p.drafted) for p in pieces] == [("b", False), ("cd", True), ("ef", True), ("gh", False), ("i", True)]
    assert isinstance(pieces[0], str) and Piece("x").drafted is False


def test_renderer_status_line_and_clearing():
    import io

    out, err = io.StringIO(), io.StringIO()
    render = Renderer(color=True, progress=True, out=out, err=err, every_s=0.0)
    render.piece(Piece("hello "))
    render.piece(Piece("world", drafted=True))
    render.finish()
    assert out.getvalue() == f"hello {DRAFTED}world{RESET}"
    assert "11 chars" in err.getvalue() and "45% through drafts" in err.getvalue()
    assert err.getvalue().endswith("\r")  # cleared for the summary line
    assert use_color("always", io.StringIO()) and not use_color("auto", io.StringIO())

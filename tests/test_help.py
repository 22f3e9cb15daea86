"""``--help`` for every subcommand, read in-process from the parser: each
option says what it does, and each subcommand's help names what a user
reaches for.  (One subprocess test keeps the real entry point honest.)"""

from __future__ import annotations

import argparse

import pytest

from blackbox_spec.cli import build_parser

# What a user looks for in each subcommand's help.
EXPECTED = {
    "run": ["examples:", "--strategy", "--color", "--no-color", "--progress", "--quiet", "--json", "NO_COLOR"],
    "serve": ["x-bspec", "--max-concurrency"],
    "server": ["vllm", "llama-server"],
    "bench": ["--sim"],
    "probe": ["--base-url"],
    "heads": ["train"],
}


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [action] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    found = dict(action.choices)
    for name, sub in list(found.items()):
        nested = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
        for inner in nested:
            found.update({f"{name} {child}": p for child, p in inner.choices.items()})
    return found


def undocumented(parser: argparse.ArgumentParser) -> list[str]:
    """Options and positionals that a user sees with no help text."""
    return [", ".join(a.option_strings) or a.dest for a in parser._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) and a.help != argparse.SUPPRESS and not (a.help or "").strip()]


def test_every_option_of_every_subcommand_says_what_it_does():
    commands = subcommands(build_parser())
    assert set(EXPECTED) <= set(commands)
    missing = {name: undocumented(parser) for name, parser in commands.items() if undocumented(parser)}
    assert not missing, missing


def test_the_undocumented_check_sees_an_option_without_help():
    parser = argparse.ArgumentParser()
    parser.add_argument("--silent")
    assert undocumented(parser) == ["--silent"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_subcommands_help_names_what_a_user_reaches_for(name):
    text = subcommands(build_parser())[name].format_help()
    assert [needle for needle in EXPECTED[name] if needle not in text] == []


def test_the_installed_entry_point_prints_help():
    from .test_cli import bspec

    run = bspec("--help")
    assert run.returncode == 0 and b"run" in run.stdout and b"serve" in run.stdout

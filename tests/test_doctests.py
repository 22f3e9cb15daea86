"""The examples in the package's docstrings run, module by module.

Run here rather than by ``--doctest-modules`` so that a machine without the
``hf`` extra (torch) still collects the whole suite: the modules of local
mode are skipped there, with the reason, and nowhere else."""

from __future__ import annotations

import doctest
import importlib
import io
import pkgutil

import pytest

import blackbox_spec
from blackbox_spec._exceptions import ConfigurationError


def package_modules() -> list[str]:
    names = [info.name for info in pkgutil.walk_packages(blackbox_spec.__path__, "blackbox_spec.")]
    return sorted(name for name in names if not name.endswith("__main__"))


def has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("name", package_modules())
def test_the_examples_in_a_modules_docstrings_run(name):
    try:
        module = importlib.import_module(name)
    except (ImportError, ConfigurationError):
        if has_torch():
            raise
        pytest.skip(f"{name} needs torch: pip install 'blackbox-spec[hf]'")
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report = io.StringIO()
    for test in doctest.DocTestFinder().find(module, name):
        if test.examples:
            runner.run(test, out=report.write)
    assert runner.failures == 0, report.getvalue()


def test_a_failing_example_is_reported():
    """Control: the runner above fails on a wrong example."""
    wrong = doctest.DocTestParser().get_doctest(">>> 1 + 1\n3\n", {}, "wrong", "wrong.py", 0)
    runner = doctest.DocTestRunner()
    runner.run(wrong, out=io.StringIO().write)
    assert runner.failures == 1

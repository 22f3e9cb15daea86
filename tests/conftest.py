"""Shared fixtures: the fake target served through respx, and prompts."""

from __future__ import annotations

import contextlib
import importlib.util
import os
from typing import Iterator

import pytest
import respx

from blackbox_spec import SpecClient
from blackbox_spec._retry import RetryPolicy
from blackbox_spec.testing import FakeTarget

# LiteLLM fetches its price list from GitHub at import (retrying for ~10 s
# without a network): the copy it ships is enough for the tests.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

BASE_URL = "http://fake.test/v1"


def installed(*modules: str) -> bool:
    return all(importlib.util.find_spec(module) is not None for module in modules)


# Tests of the optional extras, skipped with the reason where the extra is
# not installed (``pip install -e '.[test]'`` alone); CI installs them all.
needs_torch = pytest.mark.skipif(not installed("torch", "transformers"), reason="needs the hf extra (torch, transformers): pip install 'blackbox-spec[hf]'")
needs_llama = pytest.mark.skipif(not installed("llama_cpp"), reason="needs the llama extra (llama-cpp-python, built as README's test command does)")
API_KEY = "sk-test-DO-NOT-LEAK-1234"

# Prompts of every kind the acceptance criteria name: code, prose, CJK, emoji.
PROMPTS = {
    "code": "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "prose": "The model reads the text. The model reads the text and the model writes the",
    "cjk": "你好世界，今天天气很好。我们你好世界，今天天气很好。我们",
    "emoji": "Hello 😀 world 🚀 and Hello 😀 world 🚀 and Hello 😀",
    "json": '{"name": "a", "id": 1}\n{"name": "b", "id": 2}\n{"name": "c", "id":',
    "mixed": "# 注释 🎉\nvalue = 1  # 好\nvalue = 2  # 好\nvalue",
}


def chat_of(prompt: str, system: str | None = None) -> list[dict]:
    """A conversation asking for ``prompt`` (the fake copies from it)."""
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]


@pytest.fixture(autouse=True)
def _own_profiles(tmp_path_factory, monkeypatch) -> None:
    """Each test starts with no stored server profiles (``profile``), and
    never reads or writes the user's own."""
    monkeypatch.setenv("BSPEC_PROFILES", str(tmp_path_factory.mktemp("profiles")))


@pytest.fixture
def fake() -> FakeTarget:
    return FakeTarget()


def mount(fake: FakeTarget, router: respx.MockRouter) -> None:
    router.post("/completions").mock(side_effect=fake.handle)
    router.post("/chat/completions").mock(side_effect=fake.handle)
    router.get("/models").mock(side_effect=fake.handle)


@pytest.fixture
def served(fake: FakeTarget):
    """The fake target answering at BASE_URL through respx."""
    with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
        mount(fake, router)
        yield fake


@contextlib.contextmanager
def over_http(fake: FakeTarget) -> Iterator[tuple[FakeTarget, str]]:
    """``fake`` as a real HTTP server in a thread: (fake, its /v1 URL)."""
    httpd = fake.serve()
    try:
        yield fake, f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()


def in_flight(url: str) -> int:
    """Requests the served fake is answering now (``/fake/stats``)."""
    import httpx

    return httpx.get(url.removesuffix("/v1") + "/fake/stats").json()["in_flight"]


async def no_sleep(seconds: float) -> None:
    """Retries in tests wait for nothing."""


def client_for(**kwargs) -> SpecClient:
    kwargs.setdefault("model", "fake-model")
    kwargs.setdefault("retries", RetryPolicy(sleep=no_sleep))
    return SpecClient(BASE_URL, API_KEY, **kwargs)


def turn_requests(fake: FakeTarget) -> list[dict]:
    """The fake's requests, less the client's Predicted Outputs probe."""
    from blackbox_spec.chat_probe import _PREDICTION_PROBE

    return [r for r in fake.requests if r.get("prediction") != _PREDICTION_PROBE]


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus) -> None:
    """CI installs every extra and starts every server, and sets
    BSPEC_NO_SKIPS=1: there a skipped test is a failure, so that a missing
    extra or server cannot pass for green (elsewhere a skip says why)."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if os.environ.get("BSPEC_NO_SKIPS") == "1" and skipped and exitstatus == 0:
        for report in skipped:
            reporter.write_line(f"BSPEC_NO_SKIPS=1 and skipped: {report.nodeid} {report.longrepr}")
        session.exitstatus = 1

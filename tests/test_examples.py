"""The Python examples run as users run them, against the fake target
served over HTTP (the real servers they name are started by the
integration tests and the demo)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from blackbox_spec.testing import FakeTarget

from .conftest import API_KEY

EXAMPLES = Path(__file__).parent.parent / "examples"


@pytest.fixture(scope="module")
def url():
    httpd = FakeTarget(api_key=API_KEY, leaky_errors=True).serve()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()


def example(name: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")} | {"OPENAI_API_KEY": API_KEY} | (env or {})
    return subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True, env=environment, timeout=120)


@pytest.mark.parametrize(
    "name, needles",
    [
        ("vllm_client.py", ["server: echo yes, logprobs yes", "tokens per round"]),
        ("llama_cpp_client.py", ["echo: yes, logprobs: yes", "jumps onto side branches"]),
        ("many_prompts.py", ["8 of 8 done", "requests were in flight (limit 16)"]),
    ],
)
def test_examples_run(url, name, needles):
    run = example(name, "--base-url", url, "--max-tokens", "40")
    assert run.returncode == 0, run.stdout + run.stderr
    for needle in needles:
        assert needle in run.stdout
    assert API_KEY not in run.stdout + run.stderr


def test_hosted_example_reads_the_environment_and_never_shows_the_key(url):
    run = example("hosted_api.py", "--max-tokens", "30", env={"OPENAI_BASE_URL": url})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "bill: " in run.stdout and "plain's" in run.stdout and API_KEY not in run.stdout + run.stderr
    wrong = example("hosted_api.py", env={"OPENAI_BASE_URL": url, "OPENAI_API_KEY": "sk-wrong-key-0000"})
    assert wrong.returncode == 1 and "401" in wrong.stdout and "sk-wrong-key-0000" not in wrong.stdout


def test_openai_sdk_via_proxy_example(url):
    """The unchanged-SDK example, with the proxy it starts itself, against the fake."""
    run = example("openai_sdk_via_proxy.py", "--base-url", url, "--model", "fake-model", "--max-tokens", "40")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "same answer: yes" in run.stdout and "x-bspec: speculative" in run.stdout


def test_openai_sdk_in_process_example(url):
    """The one-line wrapper (blackbox_spec.sdk), sync and async, against the fake."""
    run = example("openai_sdk_in_process.py", "--base-url", url, "--model", "fake-model", "--max-tokens", "40")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "same answer (sync, async streamed): yes" in run.stdout and "x-bspec: speculative" in run.stdout


@pytest.mark.parametrize("name, module", [("litellm_in_process.py", "litellm"), ("langchain_in_process.py", "langchain_openai")])
def test_framework_examples(url, name, module):
    pytest.importorskip(module, reason=f"{module} is an optional extra: pip install 'blackbox-spec[{module.split('_')[0]}]'")
    run = example(name, "--base-url", url, "--model", "fake-model", "--max-tokens", "40")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "same answer as plain" in run.stdout and ": yes" in run.stdout

"""Every server family's continuation and scoring forms, end to end:
``bspec probe`` names them on a fake built from each one's documented
shapes (vLLM, SGLang, TGI, llama.cpp, Mistral, DeepSeek's ``/beta``), and
the client speculates on each exactly (completions where offered, chat
always)."""

from __future__ import annotations

import json

import pytest

from blackbox_spec import SpecClient
from blackbox_spec.testing import FakeTarget
from blackbox_spec.testing.fake_target import FakeModel

from .conftest import PROMPTS, chat_of
from .test_cli import bspec

# name: (the fake's settings, the URL's path, completions' scoring form, the
# chat continuation form, whether the template trims the message's end).
SERVERS = {
    "vllm": ({}, "/v1", "echo", "continue_final_message", False),
    "sglang": ({"echo": "ignore", "sglang_generate": True}, "/v1", "sglang", "continue_final_message", False),
    "tgi": ({"echo": "ignore", "tgi_generate": True, "chat_prefill": "tgi"}, "/v1", "tgi", "continue_final_message", True),
    "llama.cpp": ({"echo": "refuse", "token_form": "llama", "chat_prefill": "llama"}, "/v1", None, "continue_final_message", False),
    "mistral": ({"completions": False, "chat_prefill": "prefix"}, "/v1", None, "prefix: true", False),
    "deepseek": ({"completions": False, "chat_prefill": "prefix"}, "/beta", None, "prefix: true", False),
}


@pytest.mark.parametrize("name", sorted(SERVERS))
def test_bspec_probe_names_each_servers_forms(name):
    settings, path, scoring, form, trims = SERVERS[name]
    httpd = FakeTarget(model_name="fake-model", **settings).serve()
    url = f"http://127.0.0.1:{httpd.server_address[1]}{path}"
    try:
        run = bspec("probe", "--base-url", url, "--json", "--repeats", "1", "--no-save")
        assert run.returncode == 0, run.stderr.decode()
        report = json.loads(run.stdout)
        text = bspec("probe", "--base-url", url, "--repeats", "1", "--no-save").stdout.decode()
    finally:
        httpd.shutdown()
    assert report["completions"] == (settings.get("completions", True))
    assert report.get("scoring") == scoring and report["echo"] == (scoring is not None)
    chat = report["chat"]
    assert chat["continue_form"] == form and chat["speculative"] and chat["trims_trailing"] == trims
    assert f"bspec continues with {form}" in text and ("trims the message's trailing whitespace" in text) == trims
    if scoring in ("sglang", "tgi"):
        assert f"{'SGLang' if scoring == 'sglang' else 'TGI'} /generate" in text


@pytest.mark.parametrize("name", sorted(SERVERS))
async def test_each_server_family_speculates_exactly(name):
    settings, path, _, _, _ = SERVERS[name]
    fake = FakeTarget(model_name="fake-model", model=FakeModel(deviate_every=40), **settings)
    httpd = fake.serve()
    url = f"http://127.0.0.1:{httpd.server_address[1]}{path}"
    prompt, messages = PROMPTS["code"] * 3, chat_of(PROMPTS["code"] * 3) + [{"role": "assistant", "content": "def add"}]
    try:
        async with SpecClient(url, None, "fake-model", profile="off") as client, SpecClient(url, None, "fake-model", drafter=None, profile="off") as plain:
            chat = await client.chat(messages, max_tokens=120, continue_final=True)
            truth = await plain.chat(messages, max_tokens=120, continue_final=True)
            assert (chat.text, chat.finish_reason) == (truth.text, truth.finish_reason)
            accepted = chat.stats.accepted_tokens
            if settings.get("completions", True):
                done = await client.generate(prompt, max_tokens=120)
                plain_done = await plain.generate(prompt, max_tokens=120)
                assert (done.text, done.finish_reason) == (plain_done.text, plain_done.finish_reason)
                accepted += done.stats.accepted_tokens
    finally:
        httpd.shutdown()
    assert accepted > 0, accepted  # (how many: the policy's timing-driven choice)

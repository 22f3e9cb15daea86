"""``bspec run`` as a user runs it: a subprocess against the fake target
served over real HTTP on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from blackbox_spec.testing import FakeTarget

from .conftest import API_KEY, PROMPTS


@pytest.fixture(scope="module", params=["yes", "refuse"])
def server(request):
    fake = FakeTarget(echo=request.param, api_key=API_KEY)
    httpd = fake.serve()
    yield fake, f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()


def bspec(*args: str, env: dict | None = None, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "blackbox_spec.cli", *args],
        capture_output=True, input=stdin, env=environment, timeout=120,
    )


def write(tmp_path, name: str, content: str | bytes):
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return str(path)


@pytest.mark.parametrize("kind", sorted(PROMPTS))
def test_json_output_is_the_servers_plain_output(server, tmp_path, kind):
    fake, url = server
    prompt = PROMPTS[kind]
    path = write(tmp_path, "prompt.txt", prompt)
    run = bspec("run", path, "--base-url", url, "--api-key", API_KEY, "--model", "fake-model", "--max-tokens", "70", "--json")
    assert run.returncode == 0, run.stderr.decode()
    data = json.loads(run.stdout)
    assert data["text"] == fake.generate(prompt, 70)[0]
    assert data["finish_reason"] == "length"
    stats = data["stats"]
    for key in ("rounds", "target_calls", "drafted_tokens", "accepted_tokens", "acceptance_rate",
                "mean_accepted_per_round", "bill", "plain_bill", "bill_vs_plain",
                "wall_s", "draft_s", "verify_s"):
        assert key in stats
    assert stats["output_tokens"] == 70
    # The bill counts every request the run made (the probe's too), against
    # one plain call of this prompt (its tokens as the server counts them).
    prompt_tokens = len(fake.tokenizer.encode(prompt))
    assert stats["plain_bill"] == {"requests": 1, "prompt_tokens": prompt_tokens, "cached_tokens": 0, "output_tokens": 70, "estimated_tokens": 0}
    assert stats["bill"]["requests"] >= stats["target_calls"] >= 1
    assert stats["bill"]["prompt_tokens"] >= prompt_tokens * stats["target_calls"]
    assert stats["bill"]["output_tokens"] >= 70
    assert stats["bill_vs_plain"] > 1.0


def test_streamed_output_and_plain_mode_agree(server, tmp_path):
    fake, url = server
    prompt = PROMPTS["code"]
    path = write(tmp_path, "prompt.txt", prompt)
    env = {"OPENAI_BASE_URL": url, "OPENAI_API_KEY": API_KEY}
    spec = bspec("run", path, "--max-tokens", "50", "--stop", "\n\n\n", env=env)
    plain = bspec("run", path, "--max-tokens", "50", "--stop", "\n\n\n", "--drafter", "none", env=env)
    expected = fake.generate(prompt, 50, ["\n\n\n"])[0] + "\n"
    assert spec.returncode == plain.returncode == 0
    assert spec.stdout.decode() == plain.stdout.decode() == expected
    assert b"tokens/round" in spec.stderr  # the stats line
    assert API_KEY.encode() not in spec.stdout + spec.stderr


def test_prompt_from_stdin(server):
    fake, url = server
    run = bspec("run", "-", "--base-url", url, "--api-key", API_KEY, "--max-tokens", "9", "--json", stdin=PROMPTS["prose"].encode())
    assert json.loads(run.stdout)["text"] == fake.generate(PROMPTS["prose"], 9)[0]


def one_line_error(run: subprocess.CompletedProcess, *needles: str) -> str:
    err = run.stderr.decode()
    assert run.returncode != 0
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert API_KEY not in err and API_KEY not in run.stdout.decode()
    for needle in needles:
        assert needle in err
    return err


def test_bad_prompt_files(tmp_path):
    url_args = ("--base-url", "http://127.0.0.1:9/v1", "--api-key", API_KEY)
    one_line_error(bspec("run", str(tmp_path / "missing.txt"), *url_args), "not found")
    one_line_error(bspec("run", write(tmp_path, "empty.txt", ""), *url_args), "empty")
    one_line_error(bspec("run", write(tmp_path, "blank.txt", " \n\t\n"), *url_args), "empty")
    one_line_error(bspec("run", write(tmp_path, "latin1.txt", "caf\xe9".encode("latin-1")), *url_args), "not UTF-8")
    one_line_error(bspec("run", str(tmp_path), *url_args), "directory")


def test_bad_urls_and_servers(server, tmp_path):
    fake, url = server
    path = write(tmp_path, "prompt.txt", "Hello there")
    one_line_error(bspec("run", path, "--base-url", "not a url", "--api-key", API_KEY), "invalid base URL")
    one_line_error(bspec("run", path, "--base-url", "http://127.0.0.1:9/v1", "--api-key", API_KEY), "cannot reach")
    one_line_error(bspec("run", path, "--base-url", url, "--api-key", API_KEY, "--model", "nope"), "nope", "404")
    one_line_error(bspec("run", path, "--base-url", url, "--api-key", "sk-wrong-key-5678", "--model", "fake-model"), "401")
    one_line_error(bspec("run", path, "--base-url", url, "--api-key", API_KEY, "--max-tokens", "0"), "--max-tokens")
    one_line_error(bspec("run", path, "--base-url", url, "--api-key", API_KEY, "--strategy", "magic"), "--strategy")


def test_key_from_environment_never_printed_on_error(tmp_path):
    path = write(tmp_path, "prompt.txt", "Hello there")
    run = bspec("run", path, env={"OPENAI_BASE_URL": f"http://{API_KEY}@127.0.0.1:9/v1", "OPENAI_API_KEY": API_KEY})
    one_line_error(run)


def test_official_openai_sdk_sees_the_same_plain_text(server, tmp_path):
    """The baseline is real: the openai SDK's own plain call to the server
    returns what `bspec run` returns."""
    import openai
    fake, url = server
    prompt = PROMPTS["mixed"]
    sdk = openai.OpenAI(base_url=url, api_key=API_KEY, max_retries=0)
    plain = sdk.completions.create(model="fake-model", prompt=prompt, max_tokens=60, temperature=0).choices[0].text
    run = bspec("run", write(tmp_path, "p.txt", prompt), "--base-url", url, "--api-key", API_KEY, "--max-tokens", "60", "--json")
    assert json.loads(run.stdout)["text"] == plain

"""Many prompts at once: ``generate_many`` and ``bspec run`` over several
files or a JSONL batch, within one limit on requests in flight."""

from __future__ import annotations

import json

import httpx
import pytest
import respx

from blackbox_spec import ConfigurationError, GenerationResult, TargetHTTPError
from blackbox_spec.testing import FakeTarget

from .conftest import BASE_URL, PROMPTS, client_for
from .test_cli import bspec, one_line_error, write


async def test_generate_many_is_exact_in_order_and_within_the_limit():
    fake = FakeTarget(decode_s=0.002, latency=0.005)
    prompts = [PROMPTS[name] * k for name in sorted(PROMPTS) for k in (1, 2)]
    done: list[int] = []
    with respx.mock(base_url=BASE_URL) as router:
        router.post("/completions").mock(side_effect=fake.handle_async)
        async with client_for(max_in_flight=3) as client:
            outcomes = await client.generate_many(prompts, max_tokens=50, concurrency=5, on_done=lambda i, _: done.append(i))
            peak = client.api.peak_in_flight
    assert [o.text for o in outcomes] == [fake.generate(p, 50)[0] for p in prompts]
    assert sorted(done) == list(range(len(prompts)))
    assert 2 <= peak <= 3  # concurrent, never past the limit


async def test_one_failed_generation_leaves_the_others():
    fake = FakeTarget()
    bad = "this prompt is too long for the server"

    def refuses_one(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["prompt"].startswith(bad):
            return httpx.Response(400, json={"error": {"message": "maximum context length is 8 tokens"}})
        return fake.handle(request)

    prompts = [PROMPTS["code"], bad, PROMPTS["prose"]]
    with respx.mock(base_url=BASE_URL) as router:
        router.post("/completions").mock(side_effect=refuses_one)
        async with client_for() as client:
            outcomes = await client.generate_many(prompts, max_tokens=30, concurrency=3)
    assert isinstance(outcomes[1], TargetHTTPError) and "maximum context length" in str(outcomes[1])
    assert isinstance(outcomes[1].partial, GenerationResult)
    assert outcomes[0].text == fake.generate(prompts[0], 30)[0] and outcomes[2].text == fake.generate(prompts[2], 30)[0]


@pytest.mark.parametrize("kwargs", [{"concurrency": 0}, {"max_tokens": 0}])
async def test_generate_many_checks_its_arguments(kwargs):
    async with client_for() as client:
        with pytest.raises(ConfigurationError):
            await client.generate_many(["a", "b"], **kwargs)
    with pytest.raises(ConfigurationError, match="max_in_flight"):
        client_for(max_in_flight=0)


@pytest.fixture(scope="module")
def paced_server():
    fake = FakeTarget(decode_s=0.003, latency=0.01)
    httpd = fake.serve()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    yield fake, url
    httpd.shutdown()


def server_stats(url: str) -> dict:
    return httpx.get(url.replace("/v1", "/fake/stats")).json()


def test_cli_batch_of_files_and_jsonl_lines(paced_server, tmp_path):
    fake, url = paced_server
    a = write(tmp_path, "a.txt", PROMPTS["code"])
    b = write(tmp_path, "b.txt", PROMPTS["cjk"])
    lines = [
        {"prompt": PROMPTS["prose"], "id": "p1"},
        {"prompt": PROMPTS["json"], "max_tokens": 12, "id": 7},
        {"prompt": PROMPTS["emoji"], "stop": "🚀"},
    ]
    batch = write(tmp_path, "batch.jsonl", "\n".join(json.dumps(x, ensure_ascii=False) for x in lines) + "\n\n")
    run = bspec("run", a, b, batch, "--base-url", url, "--model", "fake-model", "--max-tokens", "40", "--concurrency", "3")
    assert run.returncode == 0, run.stderr.decode()
    out = [json.loads(x) for x in run.stdout.decode().splitlines()]
    assert [o["index"] for o in out] == [0, 1, 2, 3, 4]
    assert [o["source"] for o in out] == [a, b, f"{batch}:1", f"{batch}:2", f"{batch}:3"]
    assert out[2]["id"] == "p1" and out[3]["id"] == 7 and "id" not in out[0]
    expected = [
        fake.generate(PROMPTS["code"], 40)[0], fake.generate(PROMPTS["cjk"], 40)[0], fake.generate(PROMPTS["prose"], 40)[0],
        fake.generate(PROMPTS["json"], 12)[0], fake.generate(PROMPTS["emoji"], 40, ["🚀"])[0],
    ]
    assert [o["text"] for o in out] == expected
    assert all(o["interrupted"] is False and "error" not in o for o in out)
    err = run.stderr.decode()
    assert "5/5" in err and "batch: 5 of 5 prompts completed" in err


def test_cli_max_in_flight_holds_at_the_server(tmp_path):
    """Six plain generations at once through two slots: the server never sees
    more than two requests.  (Plain, because a request the client closed
    early can linger at the server for a moment; the client's own count,
    speculation included, is checked through ``generate_many`` above.)"""
    fake = FakeTarget(decode_s=0.003, latency=0.01)
    httpd = fake.serve()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    paths = [write(tmp_path, f"p{k}.txt", PROMPTS["prose"] * (k + 1)) for k in range(6)]
    try:
        run = bspec("run", *paths, "--base-url", url, "--model", "fake-model", "--max-tokens", "60",
                    "--concurrency", "6", "--max-in-flight", "2", "--drafter", "none", "--quiet")
        stats = server_stats(url)
    finally:
        httpd.shutdown()
    assert run.returncode == 0, run.stderr.decode()
    assert [json.loads(x)["text"] for x in run.stdout.decode().splitlines()] == [fake.generate(PROMPTS["prose"] * (k + 1), 60)[0] for k in range(6)]
    assert stats["served"] >= 6 and stats["peak_in_flight"] == 2


@pytest.mark.parametrize(
    "content, needle",
    [
        ('{"prompt": "a"}\nnot json\n', "batch.jsonl:2: not JSON"),
        ('{"text": "a"}\n', 'batch.jsonl:1: expected an object with a non-empty "prompt"'),
        ('{"prompt": "a", "temperature": 1}\n', "unknown key(s) temperature"),
        ('{"prompt": "a", "max_tokens": 0}\n', "max_tokens must be"),
        ('{"prompt": "a", "stop": [""]}\n', "stop must be"),
    ],
)
def test_cli_bad_batch_lines_are_one_line_errors(tmp_path, content, needle):
    path = write(tmp_path, "batch.jsonl", content)
    one_line_error(bspec("run", path, "--base-url", "http://127.0.0.1:9/v1"), needle)


def test_cli_batch_with_a_failure_exits_non_zero_and_keeps_the_rest(tmp_path):
    """One prompt overflows the server's context window: its line carries the
    server's own message, the others are exact, and the exit status is 1."""
    fake = FakeTarget(context_window=120)
    httpd = fake.serve()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    try:
        good = write(tmp_path, "good.txt", PROMPTS["code"])
        batch = write(tmp_path, "b.jsonl", json.dumps({"prompt": PROMPTS["prose"] * 20}) + "\n" + json.dumps({"prompt": PROMPTS["prose"], "max_tokens": 5}) + "\n")
        run = bspec("run", good, batch, "--base-url", url, "--model", "fake-model", "--max-tokens", "20")
    finally:
        httpd.shutdown()
    assert run.returncode == 1
    out = [json.loads(x) for x in run.stdout.decode().splitlines()]
    assert [o["text"] for o in out] == [fake.generate(PROMPTS["code"], 20)[0], "", fake.generate(PROMPTS["prose"], 5)[0]]
    assert "maximum context length is 120 tokens" in out[1]["error"] and "error" not in out[0]
    err = run.stderr.decode()
    assert "Traceback" not in err and "2 of 3 prompts completed, 1 failed" in err

"""The API key never shows: not in logs, exceptions (their tracebacks and
chained causes included), reprs, ``--json``, or debug output.

The servers here are hostile on purpose: they echo the Authorization header
back in their error messages, as some proxies do."""

from __future__ import annotations

import json
import logging
import traceback

import httpx
import pytest
import respx

from blackbox_spec import BlackboxSpecError, RetryPolicy, SpecClient
from blackbox_spec.testing import FakeTarget

from .conftest import API_KEY, BASE_URL, PROMPTS, client_for, no_sleep
from .test_cli import bspec, write


def echoes_the_key(request: httpx.Request) -> httpx.Response:
    return httpx.Response(500, json={"error": {"message": f"bad header {request.headers.get('authorization')} for {request.url}"}})


def no_key(*texts: str) -> None:
    for text in texts:
        assert API_KEY not in text, text


def everything_about(exc: BaseException) -> str:
    """str, repr, the formatted traceback with its chain, and the partial result."""
    return "\n".join([str(exc), repr(exc), "".join(traceback.format_exception(exc)), repr(getattr(exc, "partial", None))])


async def test_logs_at_debug_level_never_hold_the_key(caplog, fake):
    fake.api_key = API_KEY
    caplog.set_level(logging.DEBUG)  # every logger: httpx, httpcore, ours
    # ... httpx's too where a library set its level (LiteLLM sets WARNING on import)
    caplog.set_level(logging.DEBUG, logger="httpx")
    with respx.mock(base_url=BASE_URL) as router:
        router.post("/completions").mock(side_effect=fake.handle)
        async with client_for() as client:
            result = await client.generate(PROMPTS["code"], max_tokens=30)
        router.post("/completions").mock(side_effect=echoes_the_key)
        async with client_for(retries=RetryPolicy(attempts=2, sleep=no_sleep)) as client:
            with pytest.raises(BlackboxSpecError):
                await client.generate(PROMPTS["code"], max_tokens=30)
    assert result.text and caplog.records  # there were logs to check
    no_key(*(record.getMessage() for record in caplog.records), caplog.text)


@pytest.mark.parametrize(
    "base_url, transport",
    [
        (BASE_URL, "echo"),  # an error message that repeats the header
        ("http://127.0.0.1:9/v1", None),  # refused
        (f"http://user:{API_KEY}@127.0.0.1:9/v1", None),  # the key inside the URL
        (f"http://127.0.0.1:9/v1?key={API_KEY}", None),  # ... or its query
        (BASE_URL, "timeout"),
        (BASE_URL, "garbage"),
    ],
)
async def test_exceptions_and_their_tracebacks_never_hold_the_key(base_url, transport):
    def timeout(request):
        raise httpx.ReadTimeout(f"timed out sending {request.headers.get('authorization')}")

    handlers = {"echo": echoes_the_key, "timeout": timeout, "garbage": lambda r: httpx.Response(200, text=f"<html>{r.headers.get('authorization')}</html>")}
    with respx.mock(assert_all_called=False) as router:
        if transport:
            router.route(host="fake.test").mock(side_effect=handlers[transport])
        else:
            router.route(host="127.0.0.1").pass_through()
        client = SpecClient(base_url, API_KEY, "fake-model", retries=RetryPolicy(attempts=2, sleep=no_sleep))
        with pytest.raises(BlackboxSpecError) as info:
            await client.generate("Hello there", max_tokens=5)
        await client.aclose()
    no_key(everything_about(info.value), repr(client), repr(client.api))


@pytest.mark.parametrize("url", [f"ftp://{API_KEY}@host/v1", f"http://host:{API_KEY}/v1", f"{API_KEY}"])
def test_a_bad_url_holding_the_key_is_reported_without_it(url):
    with pytest.raises(BlackboxSpecError) as info:
        SpecClient(url, API_KEY, "m")
    no_key(everything_about(info.value))


async def test_reprs_never_hold_the_key(fake):
    with respx.mock(base_url=BASE_URL) as router:
        router.post("/completions").mock(side_effect=fake.handle)
        async with client_for() as client:
            result = await client.generate(PROMPTS["prose"], max_tokens=10)
            no_key(repr(client), repr(client.api), repr(client.api.retries), repr(client.capabilities), repr(client.costs), repr(result), repr(result.stats), json.dumps(result.stats.to_dict()))


@pytest.fixture(scope="module")
def hostile_url():
    """A real server that wants the key and repeats it in its error messages."""
    fake = FakeTarget(api_key=API_KEY, leaky_errors=True)
    httpd = fake.serve()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()


@pytest.mark.parametrize("debug", [False, True])
def test_cli_json_and_debug_output_never_hold_the_key(hostile_url, tmp_path, debug):
    path = write(tmp_path, "p.txt", PROMPTS["code"])
    env = {"BSPEC_DEBUG": "1"} if debug else {}
    ok = bspec("run", path, "--base-url", hostile_url, "--api-key", API_KEY, "--model", "fake-model", "--max-tokens", "20", "--json", env=env)
    assert ok.returncode == 0 and json.loads(ok.stdout)["text"]
    # Wrong model name: the fake's 404 message; key in the URL: a refused connection.
    bad_model = bspec("run", path, "--base-url", hostile_url, "--api-key", API_KEY, "--model", "nope", "--json", env=env)
    in_url = bspec("run", path, "--base-url", f"http://x:{API_KEY}@127.0.0.1:9/v1", "--api-key", API_KEY, "--json", env={**env, "OPENAI_API_KEY": API_KEY})
    from_env = bspec("run", path, "--base-url", "http://127.0.0.1:9/v1", "--json", env={**env, "OPENAI_API_KEY": API_KEY})
    for run in (ok, bad_model, in_url, from_env):
        no_key(run.stdout.decode(), run.stderr.decode())
    assert "authorization: Bearer ***" in bad_model.stderr.decode()  # the server did try to leak it
    assert bad_model.returncode == in_url.returncode == from_env.returncode == 1
    if debug:  # the traceback is shown, with the key masked
        assert "Traceback" in in_url.stderr.decode() and "***" in in_url.stderr.decode()


def test_cli_internal_error_traceback_masks_the_key(monkeypatch, capsys, tmp_path):
    """A bug whose message holds the key: BSPEC_DEBUG shows the traceback, masked."""
    from blackbox_spec import cli

    async def broken(args, box):
        raise RuntimeError(f"bug while sending {API_KEY}")

    monkeypatch.setattr(cli, "_run", broken)
    path = write(tmp_path, "p.txt", "Hello")
    for debug in ("", "1"):
        monkeypatch.setenv("BSPEC_DEBUG", debug)
        assert cli.main(["run", path, "--base-url", "http://127.0.0.1:9/v1", "--api-key", API_KEY]) == 1
        err = capsys.readouterr().err
        no_key(err)
        assert "bug while sending ***" in err and (("Traceback" in err) == bool(debug))

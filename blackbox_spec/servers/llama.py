"""llama.cpp's native ``llama-server`` as a target.

Built from the llama.cpp sources vendored in the llama-cpp-python sdist (PyPI
is reachable where GitHub is not).  ``-DGGML_NATIVE=OFF`` with explicit AVX2
flags: the default ``-march=native`` build segfaults on the AMX Xeons these
machines run on.  The build (about 5 minutes on 2 cores) is cached.

What it offers a black-box client: plain continuations with a prefix cache
and ``-np`` parallel slots, but no prompt logprobs (echo is refused).  On two
CPU cores parallel slots do not pay either, so it is the "nothing pays, run
plain" server of the test suite.
"""

from __future__ import annotations

import shutil
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Callable

from .._exceptions import ConfigurationError
from .models import ensure_model
from .process import RunningServer, cache_dir, free_port, run_logged, start_server

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
CMAKE_FLAGS = (
    "-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
    "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DCMAKE_BUILD_TYPE=Release",
)


def ensure_llama_server(*, log: Callable[[str], None] = print) -> Path:
    """The path of a built ``llama-server`` binary, building it on first use."""
    builds = cache_dir("builds")
    source, build = builds / "llama-src", builds / "llama-build"
    binary = build / "bin" / "llama-server"
    stamp = build / ".bspec-ready"
    if binary.exists() and stamp.exists() and stamp.read_text().strip() == LLAMA_CPP_PYTHON:
        return binary
    if shutil.which("cmake") is None:
        raise ConfigurationError("building llama-server needs cmake and a C++ compiler (apt install cmake g++)")
    logs = cache_dir("logs")
    log(f"building llama-server from the {LLAMA_CPP_PYTHON} sdist (about 5 minutes on 2 cores, once)")
    with tempfile.TemporaryDirectory() as tmp:
        run_logged(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", tmp, LLAMA_CPP_PYTHON],
            what=f"downloading the {LLAMA_CPP_PYTHON} sdist", log_path=logs / "llama-sdist.log",
        )
        archive = next(Path(tmp).glob("*.tar.gz"))
        shutil.rmtree(source, ignore_errors=True)
        source.mkdir()
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():  # drop the top folder
                member.name = member.name.split("/", 1)[1] if "/" in member.name else ""
                if member.name and not member.issym() and not member.islnk():
                    tar.extract(member, source, filter="data")
    shutil.rmtree(build, ignore_errors=True)
    run_logged(["cmake", "-S", str(source / "vendor" / "llama.cpp"), "-B", str(build), *CMAKE_FLAGS], what="configuring llama.cpp", log_path=logs / "llama-cmake.log")
    run_logged(["cmake", "--build", str(build), "--target", "llama-server", "-j2"], what="building llama-server", log_path=logs / "llama-build.log")
    if not binary.exists():
        raise ConfigurationError(f"the llama.cpp build finished without {binary}")
    stamp.write_text(LLAMA_CPP_PYTHON + "\n")
    return binary


def start_llama_server(
    model: str = "qwen2.5-coder-0.5b",
    *,
    port: int | None = None,
    parallel: int = 4,
    context: int = 8192,
    threads: int = 2,
    timeout_s: float = 300.0,
    log: Callable[[str], None] = print,
) -> RunningServer:
    """Serve ``model`` with llama-server on loopback; returns once it answers."""
    binary = ensure_llama_server(log=log)
    gguf = ensure_model(model, log=log)
    port = port or free_port()
    command = [
        str(binary), "-m", str(gguf), "--alias", model, "--host", "127.0.0.1", "--port", str(port),
        "-c", str(context), "-np", str(parallel), "-t", str(threads), "--no-webui",
    ]
    log(f"starting llama-server with {model} on port {port}")
    return start_server("llama-server", command, port=port, model=model, timeout_s=timeout_s, log=log)


"""Start a server process, wait until it answers, stop it.

Waiting shows what the server is doing (the last line of its log) and gives
up after a timeout with a message that says where the whole log is.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import httpx

from .._exceptions import ConfigurationError, TargetConnectionError


def cache_dir(*parts: str) -> Path:
    """``$BSPEC_CACHE/<parts>`` (default ``~/.cache/blackbox_spec``), created."""
    root = Path(os.environ.get("BSPEC_CACHE") or Path.home() / ".cache" / "blackbox_spec")
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _die_with_parent() -> None:
    """Linux: the server gets SIGTERM if the process that started it dies
    (a test run killed with ^C must not leave a 3 GB server behind)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class RunningServer:
    """A server we started; stop it with :meth:`stop` or ``with``."""

    name: str
    base_url: str  # ends in /v1
    model: str
    process: subprocess.Popen
    log_path: Path
    started_s: float = 0.0
    extra: dict = field(default_factory=dict)

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        # The server may have children (vLLM's engine core): stop the group.
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def __enter__(self) -> "RunningServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_server(
    name: str,
    command: Sequence[str],
    *,
    port: int,
    model: str,
    env: dict[str, str] | None = None,
    timeout_s: float = 600.0,
    log: Callable[[str], None] | None = print,
) -> RunningServer:
    """Run ``command`` in its own process group and wait for ``/v1/models``."""
    log_path = cache_dir("logs") / f"{name}-{port}.log"
    sink = log_path.open("w")
    process = subprocess.Popen(
        list(command), stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})}, start_new_session=True, preexec_fn=_die_with_parent,
    )
    server = RunningServer(name, f"http://127.0.0.1:{port}/v1", model, process, log_path)
    try:
        server.started_s = wait_until_ready(server, timeout_s=timeout_s, log=log)
    except BaseException:
        server.stop()
        raise
    return server


def wait_until_ready(server: RunningServer, *, timeout_s: float, log: Callable[[str], None] | None = print) -> float:
    """Poll the models endpoint until it answers 200; return the seconds waited."""
    start = time.monotonic()
    last_report = -1e9
    while True:
        waited = time.monotonic() - start
        if server.process.poll() is not None:
            raise ConfigurationError(
                f"{server.name} exited with status {server.process.returncode} before it was ready: "
                f"{last_log_line(server.log_path)!r} (full log: {server.log_path})"
            )
        try:
            if httpx.get(f"{server.base_url}/models", timeout=2.0).status_code == 200:
                if log:
                    log(f"{server.name} ready at {server.base_url} after {waited:.0f}s")
                return waited
        except httpx.HTTPError:
            pass
        if waited > timeout_s:
            raise TargetConnectionError(
                f"{server.name} was not ready after {timeout_s:.0f}s; last log line: "
                f"{last_log_line(server.log_path)!r} (full log: {server.log_path})"
            )
        if log and waited - last_report >= 15:
            last_report = waited
            log(f"waiting for {server.name} ({waited:.0f}s / {timeout_s:.0f}s): {last_log_line(server.log_path)[:110]}")
        time.sleep(1.0)


def last_log_line(path: Path) -> str:
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def run_logged(command: Sequence[str], *, what: str, log_path: Path, cwd: Path | None = None, env: dict | None = None) -> None:
    """Run a set-up step; on failure, a one-line error naming its log."""
    with log_path.open("w") as sink:
        done = subprocess.run(list(command), stdout=sink, stderr=subprocess.STDOUT, cwd=cwd, env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise ConfigurationError(f"{what} failed (status {done.returncode}): {last_log_line(log_path)!r} (full log: {log_path})")

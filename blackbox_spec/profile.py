"""What a client learned about a server, kept between processes.

A fresh ``bspec run`` is the common case, and without a memory it would
re-learn the server every time: whether it offers echo and logprobs, and
what its calls cost (first-token latency, decode time per token, echo per
context token, the step time of a batch per width).  So the client keeps a
*profile* per (server, model) under
``$BSPEC_PROFILES`` (default ``$BSPEC_CACHE/profiles``): loaded by a fresh
:class:`~blackbox_spec.SpecClient` (and so by ``bspec run`` and ``bspec
serve``), written by ``bspec probe`` and refreshed after every generation.

* It never holds the API key: the server is named by its URL without
  user-info, query or fragment (where keys hide), and the model.
* Loaded costs keep half their weight (``LOADED_WEIGHT``): the cost fits fade
  with every new measurement (``LinearCost.decay``), so a profile that no
  longer matches the server (its load changed, it was restarted on other
  hardware) is overruled within a few calls.
* Only what costs speed when it is stale is kept.  What exactness rests on
  (the stop rule, the tokenizer's request shape, how the chat endpoint
  continues a message) is learned again by every process: another server
  may answer at the same URL under the same model name (llama-server
  today, vLLM tomorrow), and a stale stop rule would end the text in
  another place.  (The chat probe's continuation is kept, to be *checked*
  again in one round instead of two; a failed check runs the full probe.)
  For the same reason a client with a profile still makes one small call
  first, which says what kind of server answers (llama.cpp
  counts tokens and applies stop strings its own way).  A stale capability
  only costs a refused call.
* A profile older than a day (``MAX_AGE_S``) is measured again.
* Modes: ``auto`` (load, then save), ``refresh`` (measure anew, then save),
  ``off`` (neither).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

PROFILE_MODES = ("auto", "refresh", "off")
VERSION = 1
LOADED_WEIGHT = 0.5
# A profile measured longer ago than this is measured again: servers are
# restarted, moved and loaded differently, and what stops branches (a batch
# probe that found them costly) is otherwise never seen to be wrong.
MAX_AGE_S = 24 * 3600
# A client writes its profile after a generation at most this often (a
# proxy runs many a second); closing the client writes the rest.
SAVE_EVERY_S = 10.0


def profiles_dir() -> Path:
    root = os.environ.get("BSPEC_PROFILES")
    if root:
        return Path(root)
    base = os.environ.get("BSPEC_CACHE") or Path.home() / ".cache" / "blackbox_spec"
    return Path(base) / "profiles"


def server_name(base_url: str) -> str:
    """The URL without what may hold a secret (user-info, query, fragment).

    >>> server_name("https://user:sk-123@api.example.com:8443/v1/?key=sk-9#x")
    'https://api.example.com:8443/v1'
    """
    parts = urlsplit(base_url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


@dataclass
class ServerProfile:
    """Everything kept about one (server, model); plain JSON."""

    server: str
    model: str
    capabilities: dict[str, Any] | None = None  # ``Capabilities``
    costs: dict[str, Any] | None = None  # ``ServerCosts.to_dict``
    chat_costs: dict[str, Any] | None = None  # the same, for ``/chat/completions`` (its own calls and template)
    # A continuation the chat probe saw work (``chat.ContinueCheck``): the
    # next process checks it again in one round instead of two.  Checked,
    # never trusted: exactness rests on the check, not on this.
    chat_check: dict[str, Any] | None = None
    # Whether the server speculates on a Predicted Outputs ``prediction``
    # itself (``chat_probe.probe_predictions``); None: not probed yet.
    predicted_outputs: bool | None = None
    # The user's prices for this server (``_bill.Price.to_dict``), given once
    # (``--price``) and used by later runs; kept when the rest is re-measured.
    price: dict[str, float] | None = None
    generations: int = 0
    probed_at: float = 0.0  # when the client's probe last measured it
    saved_at: float = 0.0
    version: int = VERSION

    @property
    def path(self) -> Path:
        return profile_path(self.server, self.model)


def profile_path(base_url: str, model: str, root: Path | None = None) -> Path:
    """Where the profile of ``model`` on ``base_url`` is kept, under ``root``
    (default :func:`profiles_dir`)."""
    key = f"{server_name(base_url)}|{model}"
    return (root or profiles_dir()) / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"


def load_profile(base_url: str, model: str, root: Path | None = None) -> ServerProfile | None:
    """The stored profile, or None (none yet, another version, or unreadable:
    a profile is only ever a head start, never a reason to fail)."""
    try:
        data = json.loads(profile_path(base_url, model, root).read_text())
        if not isinstance(data, dict) or data.get("version") != VERSION or data.get("server") != server_name(base_url) or data.get("model") != model:
            return None
        return ServerProfile(**{k: v for k, v in data.items() if k in ServerProfile.__dataclass_fields__})
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def save_profile(profile: ServerProfile, root: Path | None = None) -> None:
    """Write the profile; a read-only cache only costs the head start."""
    profile.saved_at = time.time()
    write_json_atomically(profile_path(profile.server, profile.model, root), asdict(profile))


def write_json_atomically(path: Path, data: Any) -> None:
    """Write ``data`` so that a concurrent reader sees the old file or the
    new one; a cache that cannot be written is skipped, never an error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem[:16]}-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except OSError:
        pass


@dataclass
class ProfileStore:
    """A client's link to its profile: what mode, and the profile itself once
    the model is known."""

    mode: str = "auto"
    profile: ServerProfile | None = None
    # Where profiles are kept (default ``profiles_dir()``): ``bspec bench``
    # gives each configuration its own, so one's drafts do not tune another's.
    root: Path | None = None
    loaded: bool = False  # a stored profile was found and used
    chat_loaded: bool = False  # ... and its chat costs
    _checked: set[str] = field(default_factory=set)
    _last_save: float | None = None  # (monotonic) when this process last wrote it

    def open(self, base_url: str, model: str) -> ServerProfile | None:
        """The stored profile to start from (``auto`` only), once per model."""
        if self.profile is not None and self.profile.model == model:
            return self.profile if self.loaded else None
        stored = load_profile(base_url, model, self.root) if self.mode == "auto" else None
        price = stored.price if stored is not None else None
        if stored is not None and time.time() - stored.probed_at > MAX_AGE_S:
            stored = None  # too old: measured again (and written over), its price kept
        self.loaded = stored is not None
        self.profile = stored or ServerProfile(server_name(base_url), model, price=price)
        return stored

    def save(self, *, force: bool = True) -> None:
        """Write the profile; unless ``force``, at most every ``SAVE_EVERY_S``
        (a proxy runs many generations a second; the client's close writes
        the rest)."""
        if self.mode == "off" or self.profile is None:
            return
        now = time.monotonic()
        if force or self._last_save is None or now - self._last_save >= SAVE_EVERY_S:
            save_profile(self.profile, self.root)
            self._last_save = now

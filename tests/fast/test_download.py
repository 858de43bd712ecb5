"""`oars pull URL|hf://…`, `oars models`, `--model NAME`: against a real HTTP server on
loopback serving a small file, with ranges, cuts and wrong hashes."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from oars.cli import main
from oars.download import pull_url, source
from oars.errors import SetupError
from oars.serve import model_file

DATA = os.urandom(3 * 2**20 + 12345)
SHA = hashlib.sha256(DATA).hexdigest()


@dataclass
class Files:
    """What the server does: cut the first `cuts` answers after `cut_at` bytes, honour ranges
    or not, send a linked ETag or not; and what it was asked."""

    cuts: int = 0
    cut_at: int = 2**20
    ranges: bool = True
    etag: str | None = None
    asked: list[tuple[str, str | None]] = field(default_factory=list)


def _handler(files: Files) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            wanted = self.headers.get("Range")
            files.asked.append((self.path, wanted))
            if not self.path.endswith("x.gguf"):
                self.send_error(404)
                return
            start = int(wanted[6:].split("-")[0]) if wanted and files.ranges else 0
            if start >= len(DATA):
                self.send_response(416)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = DATA[start:]
            self.send_response(206 if start else 200)
            self.send_header("Content-Length", str(len(body)))
            if files.etag:
                self.send_header("X-Linked-Etag", f'"{files.etag}"')
            self.end_headers()
            if files.cuts > 0:
                files.cuts -= 1
                self.wfile.write(body[: files.cut_at])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)

    return Handler


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Files, str]]:
    monkeypatch.setenv("OARS_HOME", str(tmp_path / "home"))
    state = Files()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _cache(tmp_path: Path) -> Path:
    return tmp_path / "home" / "models"


def test_pull_a_url_then_list_and_serve_it_by_name(
    files: tuple[Files, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, base = files
    assert main(["pull", "--quiet", f"{base}/files/x.gguf#sha256={SHA}"]) == 0
    path = _cache(tmp_path) / "x.gguf"
    assert capsys.readouterr().out.strip() == str(path)
    assert path.read_bytes() == DATA
    assert not list(_cache(tmp_path).glob("*.partial"))
    assert main(["models"]) == 0
    listed = capsys.readouterr().out
    assert listed.startswith("x ") and str(path) in listed and "3.0 MiB" in listed
    assert model_file("x") == path == model_file("X.gguf")
    with pytest.raises(SetupError, match="cached: x"):
        model_file("nothing-like-it")


def test_a_cut_download_resumes_where_it_stopped(files: tuple[Files, str], tmp_path: Path) -> None:
    state, base = files
    state.cuts = 2
    path = pull_url(source(f"{base}/x.gguf", SHA), quiet=True)
    assert path.read_bytes() == DATA
    assert [r for _, r in state.asked] == [None, f"bytes={2**20}-", f"bytes={2 * 2**20}-"]


def test_a_download_left_by_an_earlier_run_is_resumed(
    files: tuple[Files, str], tmp_path: Path
) -> None:
    state, base = files
    _cache(tmp_path).mkdir(parents=True)
    (_cache(tmp_path) / "x.gguf.partial").write_bytes(DATA[:1000])
    assert pull_url(source(f"{base}/x.gguf", SHA), quiet=True).read_bytes() == DATA
    assert state.asked == [("/x.gguf", "bytes=1000-")]


def test_a_server_that_ignores_ranges_is_read_from_the_start(
    files: tuple[Files, str], tmp_path: Path
) -> None:
    state, base = files
    state.ranges, state.cuts = False, 1
    assert pull_url(source(f"{base}/x.gguf", SHA), quiet=True).read_bytes() == DATA


def test_a_wrong_hash_is_rejected_and_nothing_is_cached(
    files: tuple[Files, str], tmp_path: Path
) -> None:
    _, base = files
    with pytest.raises(SetupError, match="sha256"):
        pull_url(source(f"{base}/x.gguf", "0" * 64), quiet=True)
    assert list(_cache(tmp_path).iterdir()) == []


def test_hf_references_resolve_and_the_linked_etag_is_checked(
    files: tuple[Files, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state, base = files
    monkeypatch.setenv("OARS_HF_ENDPOINT", base)
    state.etag = "f" * 64  # what the server claims, and the file is not
    with pytest.raises(SetupError, match="sha256"):
        pull_url(source("hf://owner/repo/sub/x.gguf"), quiet=True)
    state.etag = SHA
    path = pull_url(source("hf://owner/repo@v2/sub/x.gguf"), quiet=True)
    assert path.read_bytes() == DATA
    assert [p for p, _ in state.asked] == [
        "/owner/repo/resolve/main/sub/x.gguf",
        "/owner/repo/resolve/v2/sub/x.gguf",
    ]


@pytest.mark.parametrize("ref", ["ftp://h/x.gguf", "http://h/x.bin", "hf://owner", "hf://o/r/"])
def test_bad_references_are_refused(ref: str) -> None:
    with pytest.raises(SetupError):
        source(ref)

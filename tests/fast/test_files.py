"""`/v1/files` driven by the openai SDK over a real socket, on a real SQLite file and a real
PostgreSQL: upload, list (pages, order, purpose), retrieve, content, delete; each API key sees
only its own; an expired file is gone; bad inputs are 4xx in OpenAI's shape; an upload refused,
too large or cut off leaves nothing on disk or in the store."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types import FilePurpose
from sqlalchemy import text, update

from oars.settings import Limits
from oars.store import FileQuery, SqlStore
from oars.store.schema import files
from tests.conftest import files_server, sdk

A, B = "key-a-0123456789", "key-b-9876543210"


_server = files_server


_sdk = sdk


def _rows(url: str) -> list[dict[str, Any]]:
    """Every file row in the store, any key's, expired or not."""

    async def read() -> list[dict[str, Any]]:
        store = SqlStore(url)
        await store.open()
        try:
            page = await store.list_files(FileQuery(10_000, "asc"))
        finally:
            await store.close()
        assert page is not None
        return page.items

    return asyncio.run(read())


def _on_disk(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_the_sdk_uploads_reads_and_deletes_a_file(store_url: str, tmp_path: Path) -> None:
    folder, source = tmp_path / "files", tmp_path / "notes.md"
    source.write_bytes(b"# Notes\n" + bytes(range(256)) * 1000)  # binary, over one read
    with _server(store_url, folder) as base, _sdk(base) as client:
        before = int(time.time())
        made = client.files.create(file=source, purpose="assistants")
        assert made.id.startswith("file-") and made.object == "file"
        size = source.stat().st_size
        assert (made.filename, made.bytes, made.purpose) == ("notes.md", size, "assistants")
        assert made.status == "processed" and made.expires_at is None
        assert made.status_details is None and before <= made.created_at <= time.time()
        assert client.files.retrieve(made.id) == made
        assert client.files.content(made.id).content == source.read_bytes()
        assert [f.id for f in client.files.list()] == [made.id]
        assert _on_disk(folder) == [made.id]

        deleted = client.files.delete(made.id)
        assert (deleted.id, deleted.object, deleted.deleted) == (made.id, "file", True)
        for gone in (client.files.retrieve, client.files.content, client.files.delete):
            with pytest.raises(openai.NotFoundError):
                gone(made.id)
        assert list(client.files.list()) == []
    assert _on_disk(folder) == [] and _rows(store_url) == []


def test_lists_page_in_upload_order_and_filter_by_purpose(store_url: str, tmp_path: Path) -> None:
    purposes: list[FilePurpose] = ["user_data", "batch", "user_data", "vision", "user_data"]
    with _server(store_url, tmp_path / "files") as base, _sdk(base) as client:
        ids = [
            client.files.create(file=(f"f{i}.txt", f"file {i}".encode()), purpose=p).id
            for i, p in enumerate(purposes)
        ]
        newest_first = ids[::-1]
        assert [f.id for f in client.files.list().data] == newest_first  # desc by default
        assert [f.id for f in client.files.list(order="asc").data] == ids

        first = client.files.list(limit=2)
        assert [f.id for f in first.data] == newest_first[:2] and first.has_more
        second = client.files.list(limit=2, after=first.data[-1].id)
        assert [f.id for f in second.data] == newest_first[2:4] and second.has_more
        last = client.files.list(limit=2, after=second.data[-1].id)
        assert [f.id for f in last.data] == newest_first[4:] and not last.has_more
        assert [f.id for f in client.files.list(limit=2)] == newest_first  # the SDK pages on
        assert [f.id for f in client.files.list(limit=2, order="asc")] == ids

        mine = [i for i, p in zip(ids, purposes, strict=True) if p == "user_data"]
        assert [f.id for f in client.files.list(purpose="user_data", order="asc")] == mine
        page = client.files.list(purpose="user_data", limit=1, after=mine[0], order="asc")
        assert [f.id for f in page.data] == mine[1:2] and page.has_more
        assert list(client.files.list(purpose="fine-tune")) == []

        raw = httpx.get(f"{base}/v1/files", params={"limit": 2}).json()
        assert raw["object"] == "list" and raw["has_more"] is True
        assert (raw["first_id"], raw["last_id"]) == (newest_first[0], newest_first[1])


def _expire(url: str, file_id: str) -> None:
    async def past() -> None:
        store = SqlStore(url)
        try:
            async with store.engine.begin() as conn:
                stmt = update(files).where(files.c.id == file_id).values(expires_at=1)
                await conn.execute(stmt)
        finally:
            await store.close()

    asyncio.run(past())


def test_expires_after_sets_expires_at_and_an_expired_file_is_gone(
    store_url: str, tmp_path: Path
) -> None:
    with _server(store_url, tmp_path / "files") as base, _sdk(base) as client:
        policy: Any = {"anchor": "created_at", "seconds": 3600}
        kept = client.files.create(file=b"kept", purpose="user_data", expires_after=policy)
        assert kept.expires_at == kept.created_at + 3600
        assert client.files.retrieve(kept.id).expires_at == kept.expires_at
        doomed = client.files.create(file=b"doomed", purpose="user_data", expires_after=policy)
        _expire(store_url, doomed.id)

        for use in (client.files.retrieve, client.files.content, client.files.delete):
            with pytest.raises(openai.NotFoundError) as caught:
                use(doomed.id)
            assert caught.value.code == "file_expired" and "expired" in caught.value.message
        assert [f.id for f in client.files.list()] == [kept.id]
        assert client.files.content(kept.id).content == b"kept"


def test_another_key_s_file_is_a_404(store_url: str, tmp_path: Path) -> None:
    with (
        _server(store_url, tmp_path / "files", api_keys=(A, B)) as base,
        _sdk(base, A) as a,
        _sdk(base, B) as b,
    ):
        made = a.files.create(file=("a.txt", b"a's"), purpose="user_data")
        for use in (b.files.retrieve, b.files.content, b.files.delete):
            with pytest.raises(openai.NotFoundError):
                use(made.id)
        assert list(b.files.list()) == []
        with pytest.raises(openai.BadRequestError) as caught:
            b.files.list(after=made.id)  # another key's id is no cursor either
        assert caught.value.param == "after"
        with pytest.raises(openai.AuthenticationError):
            _sdk(base, "nope").files.list()
        assert a.files.content(made.id).content == b"a's"  # B's delete deleted nothing
        assert [f.id for f in a.files.list()] == [made.id]


def _post(base: str, **kw: Any) -> httpx.Response:
    return httpx.post(f"{base}/v1/files", **kw)


def _form(*fields: tuple[str, str]) -> dict[str, Any]:
    """A multipart body of text fields only (httpx sends those urlencoded)."""
    parts = [
        f'--XyZ\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n' for k, v in fields
    ]
    body = "".join(parts) + "--XyZ--\r\n"
    return {"content": body.encode(), "headers": {"content-type": _MULTIPART}}


_MULTIPART = "multipart/form-data; boundary=XyZ"
_FILE = {"file": ("a.txt", b"abc")}
_FORM_CASES = [
    (_form(("purpose", "user_data")), "file", "missing_required_parameter"),
    ({"files": _FILE}, "purpose", "missing_required_parameter"),
    ({"data": {"purpose": "nope"}, "files": _FILE}, "purpose", "invalid_value"),
    (_form(("purpose", "user_data"), ("file", "text")), "file", "invalid_value"),
    (_form(("purpose", "a"), ("purpose", "b")), None, "invalid_multipart"),
    (_form(("purpose", "x" * 5000)), "purpose", "invalid_value"),
    (
        {"data": {"purpose": "user_data", "extra": "x"}, "files": _FILE},
        "extra",
        "unknown_parameter",
    ),
]
_EXPIRY_CASES = [
    ({"expires_after[anchor]": "last_active_at", "expires_after[seconds]": "3600"}, "anchor"),
    ({"expires_after[seconds]": "3600"}, "anchor"),
    ({"expires_after[anchor]": "created_at"}, "seconds"),
    ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "3599"}, "seconds"),
    ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "2592001"}, "seconds"),
    ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "-5"}, "seconds"),
    ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "1e4"}, "seconds"),
    ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "3600\u00b2"}, "seconds"),
]
_TRUNCATED = (
    b'--XyZ\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nuser_data\r\n'
    b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\nabc'
)
_BODY_CASES: list[tuple[dict[str, Any], str]] = [
    ({"json": {"purpose": "user_data"}}, "invalid_content_type"),
    ({"content": b"x", "headers": {"content-type": "multipart/form-data"}}, "invalid_multipart"),
    ({"content": _TRUNCATED, "headers": {"content-type": _MULTIPART}}, "invalid_multipart"),
    ({"content": b"garbage", "headers": {"content-type": _MULTIPART}}, "invalid_multipart"),
    (
        {
            "content": b"--XyZ\r\nX: y\r\n\r\nz\r\n--XyZ--\r\n",
            "headers": {"content-type": _MULTIPART},
        },
        "invalid_multipart",
    ),
]


def _is_error(r: httpx.Response, status: int, code: str, param: str | None = None) -> None:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert (error["type"], error["code"]) == ("invalid_request_error", code), error
    if param is not None:
        assert error["param"] == param, error


def test_bad_inputs_are_4xx_in_openai_s_shape_and_leave_nothing(tmp_path: Path) -> None:
    url, folder = f"sqlite:///{tmp_path}/o.db", tmp_path / "files"
    with _server(url, folder) as base:
        for kw, param, code in _FORM_CASES:
            _is_error(_post(base, **kw), 400, code, param)
        for fields, which in _EXPIRY_CASES:
            r = _post(base, data={"purpose": "batch", **fields}, files=_FILE)
            _is_error(r, 400, "invalid_value", f"expires_after.{which}")
        for kw, code in _BODY_CASES:
            _is_error(_post(base, **kw), 400, code)
        made = _post(base, data={"purpose": "batch"}, files=_FILE).json()
        for query, param in (
            ({"limit": 0}, "limit"),
            ({"limit": 10_001}, "limit"),
            ({"limit": "many"}, "limit"),
            ({"order": "sideways"}, "order"),
            ({"after": "file-unknown"}, "after"),
        ):
            _is_error(httpx.get(f"{base}/v1/files", params=query), 400, "invalid_value", param)
        missing = "file-" + "0" * 48
        for method, path in (
            ("GET", missing),
            ("GET", f"{missing}/content"),
            ("DELETE", missing),
            ("GET", "x" * 300),
        ):
            _is_error(httpx.request(method, f"{base}/v1/files/{path}"), 404, "not_found")
    assert _on_disk(folder) == [made["id"]]
    assert [row["id"] for row in _rows(url)] == [made["id"]]


def test_an_upload_over_the_limit_leaves_nothing(store_url: str, tmp_path: Path) -> None:
    folder = tmp_path / "files"
    with (
        _server(store_url, folder, limits=Limits(max_file_bytes=1000)) as base,
        _sdk(base) as client,
    ):
        exactly = client.files.create(file=b"x" * 1000, purpose="user_data")
        with pytest.raises(openai.APIStatusError) as caught:
            client.files.create(file=b"x" * 1001, purpose="user_data")
        assert caught.value.status_code == 413 and caught.value.code == "request_too_large"
        big = b"y" * 50_000
        r = _post(base, data={"purpose": "user_data"}, files={"file": big})
        _is_error(r, 413, "request_too_large")
        with _raw(base) as sock:  # refused on its Content-Length, before a byte is read
            sock.sendall(_head(10**9))
            answer = sock.makefile("rb").read()  # to the end: the server closes
        assert answer.startswith(b"HTTP/1.1 413") and b'"request_too_large"' in answer
        assert [f.id for f in client.files.list()] == [exactly.id]
    assert _on_disk(folder) == [exactly.id]
    assert [row["id"] for row in _rows(store_url)] == [exactly.id]


def _raw(base: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])))


def _head(length: int) -> bytes:
    """An upload's request line and headers, with the body's length it declares."""
    return (
        f"POST /v1/files HTTP/1.1\r\nHost: t\r\nContent-Type: {_MULTIPART}\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def _until(check: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_an_upload_cut_off_midway_leaves_nothing(tmp_path: Path) -> None:
    url, folder = f"sqlite:///{tmp_path}/o.db", tmp_path / "files"
    head = (
        b'--XyZ\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nuser_data\r\n'
        b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\n'
    )
    with _server(url, folder) as base:
        with _raw(base) as sock:
            sock.sendall(_head(100_000) + head + b"z" * 5000)
            _until(lambda: any(n.startswith(".part-") for n in _on_disk(folder)))
        _until(lambda: _on_disk(folder) == [])
        assert httpx.get(f"{base}/v1/files").json()["data"] == []
    assert _rows(url) == []


def test_without_a_store_every_files_route_is_a_400(tmp_path: Path) -> None:
    with _server(None, tmp_path / "files") as base, _sdk(base) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            client.files.create(file=b"x", purpose="user_data")
        assert caught.value.code == "files_unavailable" and "--store none" in caught.value.message
        for use in (client.files.retrieve, client.files.content, client.files.delete):
            with pytest.raises(openai.BadRequestError):
                use("file-x")
        with pytest.raises(openai.BadRequestError):
            client.files.list()
    assert _on_disk(tmp_path / "files") == []


def test_a_store_of_the_version_before_files_gains_them(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/old.db"

    async def make_v4() -> None:
        store = SqlStore(url)
        await store.open()
        async with store.engine.begin() as conn:
            await conn.execute(text("DROP TABLE files"))
            await conn.execute(text("UPDATE oars_schema SET version = 4"))
        await store.close()

    asyncio.run(make_v4())
    with _server(url, tmp_path / "files") as base, _sdk(base) as client:
        made = client.files.create(file=b"new", purpose="evals")
        # the SDK's FilePurpose, which its FileObject does not list
        assert made.model_dump()["purpose"] == "evals"
        assert client.files.content(made.id).content == b"new"


def test_the_sweeper_removes_expired_files_and_abandoned_uploads(
    store_url: str, tmp_path: Path
) -> None:
    """A round of the sweeper at a time past one file's `expires_at` deletes its row, then its
    bytes; a file that has not expired stays whole; an upload nothing has written to for an
    hour (a crash's leftover) goes, one being written stays."""
    import os

    from oars.blobs import Blobs
    from oars.sweeper import STALE_PART, Sweeper

    folder = tmp_path / "files"
    with _server(store_url, folder) as base, _sdk(base) as client:
        policy: Any = {"anchor": "created_at", "seconds": 3600}
        doomed = client.files.create(file=b"doomed", purpose="user_data", expires_after=policy)
        kept = client.files.create(file=b"kept", purpose="user_data")
    blobs = Blobs(folder)
    abandoned, live = blobs.begin(), blobs.begin()
    abandoned.write(b"half")
    old = time.time() - STALE_PART - 60
    os.utime(abandoned.path, (old, old))

    async def sweep(now: float) -> int:
        store = SqlStore(store_url)
        await store.open()
        try:
            return await Sweeper(store, blobs).sweep(now)
        finally:
            await store.close()

    assert asyncio.run(sweep(time.time())) == 0  # nothing has expired yet
    assert sorted(f["id"] for f in _rows(store_url)) == sorted([doomed.id, kept.id])
    assert not abandoned.path.exists() and live.path.exists()

    live.discard()
    assert asyncio.run(sweep(time.time() + 3601)) == 1
    assert [f["id"] for f in _rows(store_url)] == [kept.id]
    assert _on_disk(folder) == [kept.id]
    abandoned.discard()  # (closes it: it is gone already)

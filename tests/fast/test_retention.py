"""`--retention`: the sweeper deletes stored responses and conversations older than the
operator's retention, on a real SQLite file and a real PostgreSQL, and nothing younger, nothing
still running, and no conversation a young response still uses."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import openai
import pytest
from sqlalchemy import update

from oars.blobs import Blobs
from oars.store import SqlStore
from oars.store.schema import conversations, responses
from oars.sweeper import Sweeper
from tests.conftest import files_server, sdk

DAY = 86_400


def _age(url: str, ids: list[str], days: float) -> None:
    """Make these responses and conversations `days` old."""

    async def run() -> None:
        store = SqlStore(url)
        await store.open()
        then = int(time.time() - days * DAY)
        try:
            async with store.engine.begin() as conn:
                for table in (responses, conversations):
                    await conn.execute(
                        update(table).where(table.c.id.in_(ids)).values(created_at=then)
                    )
        finally:
            await store.close()

    asyncio.run(run())


def _sweep(url: str, folder: Path, retention_days: float) -> None:
    async def run() -> None:
        store = SqlStore(url)
        await store.open()
        try:
            sweeper = Sweeper(store, Blobs(folder), retention=retention_days * DAY)
            await sweeper.sweep(time.time())
        finally:
            await store.close()

    asyncio.run(run())


def test_the_sweeper_forgets_what_is_older_than_the_retention(
    store_url: str, tmp_path: Path
) -> None:
    folder = tmp_path / "files"
    with files_server(store_url, folder) as base, sdk(base) as client:
        old, young = (client.responses.create(model="m", input="hi") for _ in range(2))
        used, idle, fresh = (client.conversations.create() for _ in range(3))
        client.conversations.items.create(
            idle.id, items=[{"type": "message", "role": "user", "content": "a note"}]
        )
        in_used = client.responses.create(model="m", input="hi", conversation=used.id)
        _age(store_url, [old.id, used.id, idle.id], days=40)
        _sweep(store_url, folder, retention_days=0)  # 0: kept until deleted
        assert client.responses.retrieve(old.id).id == old.id

        _sweep(store_url, folder, retention_days=30)
        for gone in (old.id,):
            with pytest.raises(openai.NotFoundError):
                client.responses.retrieve(gone)
            with pytest.raises(openai.NotFoundError):
                client.responses.input_items.list(gone)
        with pytest.raises(openai.NotFoundError):
            client.conversations.retrieve(idle.id)
        with pytest.raises(openai.NotFoundError):
            client.conversations.items.list(idle.id)
        for kept in (young.id, in_used.id):
            assert client.responses.retrieve(kept).status == "completed"
        for talk in (used.id, fresh.id):  # `used` is old, but a young response is in it
            assert client.conversations.retrieve(talk).id == talk
        assert [i.type for i in client.conversations.items.list(used.id)] == ["message"] * 2

"""One tenant's view of a store: what another API key made does not exist here.

Every read checks the owner (a response's, conversation's or file's `tenant`) and answers as if
the object were missing; a conversation or file created here is marked with the tenant (a
response carries its own to the writer). Without API keys every request is the tenant '', which owns what was
stored without keys (all of it, before keys).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from oars.store.base import (
    Chain,
    Conversation,
    FileQuery,
    Json,
    Page,
    Reads,
    StoredFile,
    StoredResponse,
)


class Scoped:
    """The `Reads` of a store limited to `tenant`'s responses, conversations and files. The store's
    upkeep (connecting, the writer's transactions, leases, orphans) is the replica's, not a
    tenant's: it is not here."""

    def __init__(self, store: Reads, tenant: str) -> None:
        self.inner, self.tenant = store, tenant

    async def _mine(self, response_id: str) -> StoredResponse | None:
        stored = await self.inner.get(response_id)
        return stored if stored is not None and stored.tenant == self.tenant else None

    async def _my_conversation(self, conversation_id: str) -> Conversation | None:
        found = await self.inner.get_conversation(conversation_id)
        return found if found is not None and found.tenant == self.tenant else None

    # ---- responses ----------------------------------------------------------------------

    async def get(self, response_id: str) -> StoredResponse | None:
        return await self._mine(response_id)

    async def delete(self, response_id: str) -> bool:
        return await self._mine(response_id) is not None and await self.inner.delete(response_id)

    async def recent(self, *, limit: int, tenant: str | None = None) -> list[Json]:
        return await self.inner.recent(limit=limit, tenant=self.tenant)

    async def input_items(
        self, response_id: str, *, after: str | None, limit: int, order: str
    ) -> Page | None:
        if await self._mine(response_id) is None:
            return None
        return await self.inner.input_items(response_id, after=after, limit=limit, order=order)

    async def context(self, response_id: str) -> Chain | None:
        if await self._mine(response_id) is None:
            return None
        return await self.inner.context(response_id)

    async def find_items(
        self, item_ids: Sequence[str], *, tenant: str | None = None
    ) -> dict[str, Json]:
        return await self.inner.find_items(item_ids, tenant=self.tenant)

    async def events(self, response_id: str, *, after: int) -> list[Json]:
        if await self._mine(response_id) is None:
            return []
        return await self.inner.events(response_id, after=after)

    async def request_cancel(self, response_id: str) -> StoredResponse | None:
        if await self._mine(response_id) is None:
            return None
        return await self.inner.request_cancel(response_id)

    # ---- conversations ------------------------------------------------------------------

    async def create_conversation(self, conversation: Conversation, items: Sequence[Json]) -> None:
        await self.inner.create_conversation(replace(conversation, tenant=self.tenant), items)

    async def get_conversation(self, conversation_id: str) -> Conversation | None:
        return await self._my_conversation(conversation_id)

    async def update_conversation(
        self, conversation_id: str, metadata: Mapping[str, str]
    ) -> Conversation | None:
        if await self._my_conversation(conversation_id) is None:
            return None
        return await self.inner.update_conversation(conversation_id, metadata)

    async def delete_conversation(self, conversation_id: str) -> bool:
        if await self._my_conversation(conversation_id) is None:
            return False
        return await self.inner.delete_conversation(conversation_id)

    async def conversation_items(
        self,
        conversation_id: str,
        *,
        after: str | None = None,
        limit: int | None = None,
        order: str = "asc",
    ) -> Page | None:
        if await self._my_conversation(conversation_id) is None:
            return None
        return await self.inner.conversation_items(
            conversation_id, after=after, limit=limit, order=order
        )

    async def add_conversation_items(self, conversation_id: str, items: Sequence[Json]) -> bool:
        if await self._my_conversation(conversation_id) is None:
            return False
        return await self.inner.add_conversation_items(conversation_id, items)

    async def get_conversation_item(self, conversation_id: str, item_id: str) -> Json | None:
        if await self._my_conversation(conversation_id) is None:
            return None
        return await self.inner.get_conversation_item(conversation_id, item_id)

    async def delete_conversation_item(self, conversation_id: str, item_id: str) -> bool:
        if await self._my_conversation(conversation_id) is None:
            return False
        return await self.inner.delete_conversation_item(conversation_id, item_id)

    # ---- files --------------------------------------------------------------------------

    async def create_file(self, file: StoredFile) -> None:
        await self.inner.create_file(replace(file, tenant=self.tenant))

    async def get_file(self, file_id: str) -> StoredFile | None:
        found = await self.inner.get_file(file_id)
        return found if found is not None and found.tenant == self.tenant else None

    async def list_files(self, query: FileQuery, *, tenant: str | None = None) -> Page | None:
        return await self.inner.list_files(query, tenant=self.tenant)

    async def delete_file(self, file_id: str) -> bool:
        return await self.get_file(file_id) is not None and await self.inner.delete_file(file_id)


def scoped(store: Reads, tenant: str) -> Reads:
    """`store` as `tenant` sees it (without keys, tenant '': what was stored without keys)."""
    return Scoped(store, tenant)

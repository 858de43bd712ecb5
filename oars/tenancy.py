"""Tenancy: the runs and the stored state as one API key sees them.

A `Tenant` is the one door every route and socket goes through (`http.common.view`): it reads
through the store's tenant filter (`oars.store.tenant.Scoped`), stamps what it submits with its
key, and finds a running response only if it is its own. What another key made answers as if
it did not exist (404).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from oars.errors import InvalidRequest, NotFound
from oars.events import Event
from oars.normalize import ResponseRequest
from oars.runs import FLUSH_SECONDS, TERMINAL_EVENTS, RunHandle, Runs
from oars.store import TERMINAL_STATUSES, Chain, Reads, StoredResponse
from oars.store.tenant import scoped


def _missing(response_id: str) -> NotFound:
    return NotFound(f"Response with id '{response_id}' not found.", param="response_id")


class Tenant:
    """The runs and the store as one API key sees them: what another key made does not exist
    here. Every route and socket reaches runs and stored state through one (`http.common.view`), so no
    route can forget the check. Without API keys every request is the tenant ''."""

    def __init__(self, runs: Runs, tenant: str) -> None:
        self.runs, self.tenant = runs, tenant
        self.store: Reads | None = scoped(runs.store, tenant) if runs.store is not None else None

    async def submit(self, request: ResponseRequest, previous: Chain | None = None) -> RunHandle:
        """Start a response of this tenant's (see `Runs.submit`)."""
        request = replace(request, tenant=self.tenant)
        return await self.runs.submit(request, store=self.store, previous=previous)

    def active(self, response_id: str) -> RunHandle | None:
        """A response of this tenant's that this replica is running."""
        handle = self.runs.active.get(response_id)
        return handle if handle is not None and handle.request.tenant == self.tenant else None

    async def get(self, response_id: str) -> StoredResponse:
        """A response of this tenant's, running here or kept (any other is not found)."""
        handle = self.active(response_id)
        if handle is not None and handle.snapshot["status"] in TERMINAL_STATUSES:
            await handle.result()  # its ending is being kept: answer what was kept
            handle = None
        if handle is not None and handle.request.store:
            return handle.stored(handle.snapshot, self.runs.replica)
        stored = await self.store.get(response_id) if self.store is not None else None
        if stored is None:
            raise _missing(response_id)
        return stored

    async def follow(
        self, response_id: str, after: int, keepalive: float | None = None
    ) -> AsyncIterator[list[Event]]:
        """A response's events after `after`, in batches: live from this replica's log, or
        polled from the store when another replica runs it. Ends on the terminal event,
        always. With `keepalive`, an empty batch after that many seconds without one."""
        await self.get(response_id)
        handle = self.active(response_id)
        if handle is not None:
            async for events in handle.batches(after, keepalive):
                yield events
            return
        assert self.store is not None
        quiet = time.monotonic()
        while True:
            batch = await self.store.events(response_id, after=after)
            ending = next(
                (i for i, e in enumerate(batch) if e["type"] in TERMINAL_EVENTS), len(batch) - 1
            )
            if batch:
                yield batch[: ending + 1]
                quiet = time.monotonic()
                after = batch[ending]["sequence_number"]
                if batch[ending]["type"] in TERMINAL_EVENTS:
                    return
            elif keepalive is not None and time.monotonic() - quiet >= keepalive:
                yield []
                quiet = time.monotonic()
            if not batch:
                stored = await self.store.get(response_id)
                if stored is None or (
                    stored.finished and not await self.store.events(response_id, after=after)
                ):
                    return
                await asyncio.sleep(FLUSH_SECONDS)

    async def cancel(self, response_id: str) -> dict[str, Any]:
        stored = await self.get(response_id)
        if not stored.background:
            raise InvalidRequest(
                "Only background responses can be cancelled.", param=None, code="invalid_request"
            )
        if stored.finished:
            return stored.snapshot
        handle = self.active(response_id)
        if handle is not None:
            handle.cancel()
            return await handle.result()
        assert self.store is not None
        await self.store.request_cancel(response_id)
        deadline = time.monotonic() + 3 * self.runs.lease_seconds
        while time.monotonic() < deadline:  # the owner sees it at its next heartbeat
            stored = await self.get(response_id)
            if stored.finished:
                return stored.snapshot
            await asyncio.sleep(0.1)
        return stored.snapshot

    async def delete(self, response_id: str) -> None:
        """Delete a kept response (one running here is stopped first)."""
        if self.store is None:
            raise _missing(response_id)
        handle = self.active(response_id)
        if handle is not None and handle.request.store:
            handle.cancel()
            await handle.result()
        if not await self.store.delete(response_id):
            raise _missing(response_id)

"""What oars keeps: responses, their items and event logs, conversations, and files' rows.

The `Store` protocol is the whole seam, in two halves: `Reads` (what a request sees, through its
tenant's view) and `Upkeep` (what the replica does); `oars.store.sql` implements it for SQLite and
PostgreSQL. Values are plain dicts of the wire shapes (a response snapshot, an item, an event) so
that what is read back is byte for byte what was sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

Json = dict[str, Any]

TERMINAL_STATUSES = frozenset({"completed", "incomplete", "failed", "cancelled"})


@dataclass(frozen=True)
class StoredResponse:
    """A response as kept: its latest snapshot and how it runs."""

    snapshot: Json
    background: bool = False
    streamed: bool = False  # it has an event log
    owner: str = ""  # the replica that runs it
    cancel_requested: bool = False
    tenant: str = ""  # whose it is: the hashed API key that made it ('' without keys)
    served_by: str = ""  # the engine replica that generated it ('' : one engine, or not yet)

    @property
    def id(self) -> str:
        return str(self.snapshot["id"])

    @property
    def status(self) -> str:
        return str(self.snapshot["status"])

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL_STATUSES


@dataclass(frozen=True)
class NewResponse:
    """A response that starts now, kept before the first byte of it is sent."""

    response: StoredResponse
    input_items: Sequence[Json]  # the whole context the response was made from, with ids
    conversation_id: str | None = None
    lease_seconds: float = 10.0  # its owner's lease, renewed by the heartbeat


@dataclass(frozen=True)
class Logged:
    """Consecutive events of a running response's log; with its snapshot when its status
    moved (so that other replicas see it running)."""

    response_id: str
    events: Sequence[Json]
    snapshot: Json | None = None


@dataclass(frozen=True)
class Finished:
    """A response that ended: its final snapshot, output items, last events, conversation."""

    response_id: str
    snapshot: Json
    events: Sequence[Json] = ()  # the log's tail not yet logged
    conversation_items: Sequence[Json] = ()  # appended to the response's conversation
    served_by: str = ""  # the engine replica that generated it (its conversation's too)


@dataclass(frozen=True)
class Writes:
    """What `Store.write` keeps in one transaction, in this order: new responses, events of
    running ones, ended ones. A response deleted meanwhile (by another replica) gets nothing
    back from its end."""

    begun: Sequence[NewResponse] = ()
    logged: Sequence[Logged] = ()
    finished: Sequence[Finished] = ()


@dataclass(frozen=True)
class Chain:
    """What a continuation continues: the response's context (input, then output), and the
    engine replica that served it, whose cache holds that prompt ('' : not known)."""

    items: Sequence[Json]
    served_by: str = ""


@dataclass(frozen=True)
class Page:
    items: list[Json]
    has_more: bool


@dataclass(frozen=True)
class Conversation:
    id: str
    created_at: int
    metadata: Mapping[str, str] = field(default_factory=dict)
    tenant: str = ""
    served_by: str = ""  # the engine replica that served its latest response

    def wire(self) -> Json:
        return {
            "id": self.id,
            "object": "conversation",
            "created_at": self.created_at,
            "metadata": dict(self.metadata),
        }


@dataclass(frozen=True)
class StoredFile:
    """An uploaded file's row (its bytes are on disk, `oars.blobs`)."""

    id: str
    bytes: int
    created_ns: int  # the list's order; `created_at` is its seconds
    filename: str
    purpose: str
    expires_at: int | None = None
    tenant: str = ""

    @property
    def created_at(self) -> int:
        return self.created_ns // 1_000_000_000

    def expired(self, now: float) -> bool:
        """Past its `expires_at`: gone for every use (the store's list leaves it out too)."""
        return self.expires_at is not None and self.expires_at <= now

    def wire(self) -> Json:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "expires_at": self.expires_at,
            "status_details": None,
        }


@dataclass(frozen=True)
class FileQuery:
    """A page of `GET /v1/files`: up to `limit` files not expired at `now`, in upload order
    (`asc`) or its reverse, after the file `after`, of one `purpose` if given."""

    limit: int
    order: str = "desc"
    after: str | None = None
    purpose: str | None = None
    now: int = 0


@dataclass(frozen=True)
class ListQuery:
    """A page of a cursor list: up to `limit`, in creation order (`asc`) or its reverse, after
    the id `after` and/or before the id `before`."""

    limit: int = 20
    order: str = "desc"
    after: str | None = None
    before: str | None = None


@dataclass(frozen=True)
class NewVectorStore:
    id: str
    created_ns: int
    name: str
    description: str | None
    metadata: Mapping[str, str]
    expires_days: int | None


@dataclass(frozen=True)
class NewVectorFile:
    """A file added to a vector store (again: its chunks go, it is indexed anew)."""

    file_id: str
    attributes: Json
    chunking: Json  # {type: static, static: {max_chunk_size_tokens, chunk_overlap_tokens}}


@dataclass(frozen=True)
class Pending:
    """A file of a vector store still to index (`in_progress`), as the ingester takes it up."""

    vector_store_id: str
    file_id: str
    created_ns: int  # which adding it is: one that was added again meanwhile is not indexed
    filename: str
    chunking: Json


@dataclass(frozen=True)
class Hit:
    chunk_id: int
    file_id: str
    text: str
    rank: float  # keyword: its rank, ≥ 0; vectors: the cosine; larger is better either way


@dataclass(frozen=True)
class EmbeddedBy:
    """The embedding model whose vectors a store holds: every vector of a store is of one
    model, and only a query embedded by that model is compared with them."""

    model: str
    dimensions: int


class WrongEmbedding(Exception):
    """A file's vectors are not of the model its store's are (or it has none, and the store
    has): it is not indexed."""

    def __init__(self, held: EmbeddedBy, given: EmbeddedBy | None) -> None:
        runs = "none" if given is None else f"'{given.model}' ({given.dimensions} dimensions)"
        super().__init__(
            f"The store's vectors are of the embedding model '{held.model}' "
            f"({held.dimensions} dimensions); this file's are of {runs}."
        )


@dataclass(frozen=True)
class ChunkVectors:
    """A file's chunks' vectors, a row each in the chunks' order (unit length, float32)."""

    by: EmbeddedBy
    rows: Sequence[bytes]  # each row's little-endian float32 bytes


class Vectors(Protocol):
    """Vector stores, their files, batches and chunks. Every method names the `tenant` whose
    the objects are: another tenant's do not exist (None, False, or left out)."""

    async def create_vector_store(
        self, store: NewVectorStore, files: Sequence[NewVectorFile], *, tenant: str
    ) -> None: ...

    async def get_vector_store(self, vector_store_id: str, *, tenant: str) -> Json | None:
        """The `VectorStore` as the wire shows it (its status and counts its files')."""
        ...

    async def list_vector_stores(self, query: ListQuery, *, tenant: str) -> Page | None: ...

    async def update_vector_store(
        self, vector_store_id: str, changes: Mapping[str, Any], *, tenant: str
    ) -> bool:
        """Set `name`, `metadata` and/or `expires_days` (recomputing `expires_at`)."""
        ...

    async def delete_vector_store(self, vector_store_id: str, *, tenant: str) -> bool: ...

    async def touch_vector_store(self, vector_store_id: str, now: int) -> None:
        """It was used at `now`: its `last_active_at`, and so its `expires_at`."""
        ...

    async def add_vector_files(
        self,
        vector_store_id: str,
        files: Sequence[NewVectorFile],
        *,
        tenant: str,
        batch_id: str | None = None,
    ) -> None: ...

    async def get_vector_file(
        self, vector_store_id: str, file_id: str, *, tenant: str
    ) -> Json | None: ...

    async def list_vector_files(
        self,
        vector_store_id: str,
        query: ListQuery,
        *,
        tenant: str,
        status: str | None = None,
        batch_id: str | None = None,
    ) -> Page | None: ...

    async def update_vector_file(
        self, vector_store_id: str, file_id: str, attributes: Json, *, tenant: str
    ) -> Json | None: ...

    async def delete_vector_file(self, vector_store_id: str, file_id: str, *, tenant: str) -> bool:
        """Take the file out of the store (its chunks too); the file itself stays."""
        ...

    async def vector_file_chunks(self, vector_store_id: str, file_id: str) -> list[str]: ...

    async def create_file_batch(
        self, vector_store_id: str, batch_id: str, created_at: int, *, tenant: str
    ) -> None: ...

    async def get_file_batch(
        self, vector_store_id: str, batch_id: str, *, tenant: str
    ) -> Json | None: ...

    async def cancel_file_batch(self, vector_store_id: str, batch_id: str, *, tenant: str) -> bool:
        """Mark the batch cancelled and its files still in progress `cancelled`."""
        ...

    async def searchable_files(self, vector_store_id: str) -> dict[str, tuple[str, Json]]:
        """The store's indexed files: file id → (filename, attributes)."""
        ...

    async def search_chunks(
        self, vector_store_id: str, words: Sequence[str], file_ids: Sequence[str] | None, limit: int
    ) -> list[Hit]:
        """The `limit` best chunks holding any of `words`, of `file_ids` only if given."""
        ...

    async def vector_store_embedding(self, vector_store_id: str) -> EmbeddedBy | None:
        """The model the store's vectors are of; None while it holds none."""
        ...

    async def search_vectors(
        self, vector_store_id: str, query: bytes, file_ids: Sequence[str] | None, limit: int
    ) -> list[Hit]:
        """The `limit` chunks nearest `query` (a unit float32 vector's bytes, of the store's
        model) by cosine, of `file_ids` only if given."""
        ...

    # ---- the ingester's and the sweeper's ---------------------------------------------------

    async def pending_vector_files(self, *, limit: int) -> list[Pending]: ...

    async def index_vector_file(
        self,
        pending: Pending,
        chunks: Sequence[tuple[str, int]],
        tokenizer: str,
        vectors: ChunkVectors | None = None,
    ) -> bool:
        """Keep a file's chunks (text, tokens) and their vectors, and mark it `completed`, in
        one transaction, unless it is no longer this pending adding of it (removed, added
        again, cancelled). The first vectors of a store without chunks record the model they
        are of; a store with chunks and no model stays keyword-only (`vectors` are dropped);
        vectors of another model than the store's, or none where it has one, are
        `WrongEmbedding`."""
        ...

    async def fail_vector_file(self, pending: Pending, code: str, message: str) -> None: ...

    async def expire_vector_stores(self, now: float) -> int:
        """Mark the stores past their `expires_at` expired and drop their chunks: how many."""
        ...


class Reads(Protocol):
    """What a request may see and change of what is kept: responses, their items and logs, and
    conversations. This is what a tenant's view (`oars.store.tenant.Scoped`) wraps.

    Every method may raise `StoreUnavailable` (the database is down, full or unreachable)."""

    async def get(self, response_id: str) -> StoredResponse | None: ...

    async def delete(self, response_id: str) -> bool: ...

    async def recent(self, *, limit: int, tenant: str | None = None) -> list[Json]:
        """The latest responses' snapshots, newest first (of one tenant, if given)."""
        ...

    async def input_items(
        self, response_id: str, *, after: str | None, limit: int, order: str
    ) -> Page | None: ...

    async def context(self, response_id: str) -> Chain | None:
        """The response's input items, then its output items, and who served it (for
        chaining)."""
        ...

    async def find_items(
        self, item_ids: Sequence[str], *, tenant: str | None = None
    ) -> dict[str, Json]:
        """Items by id, from any response's input or output, or any conversation (of one
        tenant, if given)."""
        ...

    async def events(self, response_id: str, *, after: int) -> list[Json]: ...

    async def request_cancel(self, response_id: str) -> StoredResponse | None: ...

    # ---- conversations ------------------------------------------------------------------

    async def create_conversation(
        self, conversation: Conversation, items: Sequence[Json]
    ) -> None: ...

    async def get_conversation(self, conversation_id: str) -> Conversation | None: ...

    async def update_conversation(
        self, conversation_id: str, metadata: Mapping[str, str]
    ) -> Conversation | None: ...

    async def delete_conversation(self, conversation_id: str) -> bool: ...

    async def conversation_items(
        self,
        conversation_id: str,
        *,
        after: str | None = None,
        limit: int | None = None,
        order: str = "asc",
    ) -> Page | None: ...

    async def add_conversation_items(self, conversation_id: str, items: Sequence[Json]) -> bool: ...

    async def get_conversation_item(self, conversation_id: str, item_id: str) -> Json | None: ...

    async def delete_conversation_item(self, conversation_id: str, item_id: str) -> bool: ...

    # ---- files --------------------------------------------------------------------------

    async def create_file(self, file: StoredFile) -> None:
        """Keep a file's row (its bytes are already in place)."""
        ...

    async def get_file(self, file_id: str) -> StoredFile | None:
        """A file's row, expired or not."""
        ...

    async def list_files(self, query: FileQuery, *, tenant: str | None = None) -> Page | None:
        """A page of files as the wire shows them (of one tenant, if given); None when
        `query.after` is no file of the tenant's."""
        ...

    async def delete_file(self, file_id: str) -> bool: ...


class Upkeep(Protocol):
    """What the replica does with the store, for nobody's request in particular: connect, keep
    what the writer gathered, renew its leases and end what a dead replica left running.

    Every method may raise `StoreUnavailable` (the database is down, full or unreachable)."""

    async def open(self) -> None:
        """Connect; create or upgrade the schema."""
        ...

    async def write(self, writes: Writes) -> None:
        """Keep responses that start, log events of running ones, end others: all or nothing."""
        ...

    async def heartbeat(
        self, owner: str, response_ids: Sequence[str], *, lease_seconds: float
    ) -> list[str]:
        """Extend the leases of these running responses; return those asked to cancel."""
        ...

    async def fail_orphans(self, *, owner: str | None) -> list[str]:
        """Fail unfinished responses whose lease ran out (or all of `owner`'s); return their ids."""
        ...

    async def expired_files(self, now: float, *, limit: int) -> list[str]:
        """Up to `limit` ids of files past their `expires_at` at `now` (any tenant's)."""
        ...

    async def forget_before(self, before: int, *, limit: int) -> int:
        """Delete up to `limit` finished responses created before `before` (seconds), with
        their items and logs, and up to `limit` conversations created before it in which no
        response is younger, with their items: how many of both went."""
        ...

    async def close(self) -> None: ...


class Store(Reads, Upkeep, Vectors, Protocol):
    """The whole store: what requests read through, and what the replica keeps up."""

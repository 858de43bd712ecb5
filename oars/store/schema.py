"""The versioned schema: startup creates it or upgrades it, one numbered step at a time.

Each step runs in the transaction that records its number, so a crash mid-upgrade leaves the old
version. On PostgreSQL an advisory lock keeps replicas that start together from racing.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Connection,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    inspect,
    select,
    text,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

metadata = MetaData()
_ID = String(200)

version = Table("oars_schema", metadata, Column("version", Integer, nullable=False))

responses = Table(
    "responses",
    metadata,
    Column("id", _ID, primary_key=True),
    Column("status", String(16), nullable=False),
    Column("background", Boolean, nullable=False),
    Column("streamed", Boolean, nullable=False),
    Column("owner", String(300), nullable=False),
    Column("lease_until", Float, nullable=False),
    Column("cancel_requested", Boolean, nullable=False),
    Column("conversation_id", _ID),
    Column("created_at", Integer, nullable=False),
    Column("snapshot", Text, nullable=False),  # the latest Response object, as JSON
    Column("tenant", String(64), nullable=False, server_default=""),  # the API key's, hashed
    Column("served_by", String(300), nullable=False, server_default=""),  # the engine replica
)
Index("responses_running", responses.c.status, responses.c.lease_until)
# what `--retention` sweeps (`_v7`): responses by age, and a conversation's youngest response
RESPONSES_BY_AGE = Index("responses_by_age", responses.c.created_at)
RESPONSES_BY_CONVERSATION = Index(
    "responses_by_conversation", responses.c.conversation_id, responses.c.created_at
)

response_items = Table(
    "response_items",
    metadata,
    Column("response_id", _ID, primary_key=True),
    Column("kind", String(8), primary_key=True),  # input | output
    Column("position", Integer, primary_key=True),
    Column("item_id", _ID, nullable=False),
    Column("item", Text, nullable=False),
)
Index("response_items_by_id", response_items.c.item_id)

# A response's event log, a batch of consecutive events a row (as the writer kept them).
response_logs = Table(
    "response_logs",
    metadata,
    Column("response_id", _ID, primary_key=True),
    Column("first_sequence", Integer, primary_key=True),
    Column("last_sequence", Integer, nullable=False),
    Column("events", Text, nullable=False),  # a JSON array of events, in order
)

conversations = Table(
    "conversations",
    metadata,
    Column("id", _ID, primary_key=True),
    Column("created_at", Integer, nullable=False),
    Column("metadata", Text, nullable=False),
    Column("tenant", String(64), nullable=False, server_default=""),
    Column("served_by", String(300), nullable=False, server_default=""),  # its latest response's
)

conversation_items = Table(
    "conversation_items",
    metadata,
    Column("conversation_id", _ID, primary_key=True),
    Column("position", Integer, primary_key=True),
    Column("item_id", _ID, nullable=False),
    Column("item", Text, nullable=False),
)
Index("conversation_items_by_id", conversation_items.c.item_id)

# Uploaded files: the row only (the bytes are `oars.blobs`', on disk), written once the bytes are.
files = Table(
    "files",
    metadata,
    Column("id", _ID, primary_key=True),
    Column("tenant", String(64), nullable=False),
    # nanoseconds, so that a list's order is the uploads' order (`created_at` is its seconds)
    Column("created_ns", BigInteger, nullable=False),
    Column("expires_at", Integer),  # seconds; null: kept until deleted
    Column("bytes", BigInteger, nullable=False),
    Column("filename", Text, nullable=False),
    Column("purpose", String(32), nullable=False),
)
Index("files_by_tenant", files.c.tenant, files.c.created_ns)

# Vector stores (`/v1/vector_stores`): a store's status and file counts are its files'.
vector_stores = Table(
    "vector_stores",
    metadata,
    Column("id", _ID, primary_key=True),
    Column("tenant", String(64), nullable=False),
    Column("created_ns", BigInteger, nullable=False),
    Column("name", Text, nullable=False),
    Column("description", Text),
    Column("metadata", Text, nullable=False),  # JSON
    Column("expires_days", Integer),  # `expires_after.days`; null: kept until deleted
    Column("expires_at", Integer),
    Column("last_active_at", Integer, nullable=False),
    Column("expired", Boolean, nullable=False),  # the sweeper found it past `expires_at`
    # the model its vectors are of (`_v7`); null while it holds none
    Column("embedding_model", String(300)),
    Column("dimensions", Integer),
    # moves in each transaction that changes its chunks: a replica's copy of its vectors is
    # good while this is what it was read at
    Column("chunks_version", Integer, nullable=False, server_default="0"),
)
Index("vector_stores_by_tenant", vector_stores.c.tenant, vector_stores.c.created_ns)

vector_store_files = Table(
    "vector_store_files",
    metadata,
    Column("vector_store_id", _ID, primary_key=True),
    Column("file_id", _ID, primary_key=True),
    Column("tenant", String(64), nullable=False),
    Column("created_ns", BigInteger, nullable=False),
    Column("batch_id", _ID),
    Column("status", String(16), nullable=False),
    Column("last_error", Text),  # JSON {code, message}
    Column("attributes", Text, nullable=False),  # JSON
    Column("chunking", Text, nullable=False),  # JSON, the `static` strategy
    Column("usage_bytes", BigInteger, nullable=False),
    Column("tokenizer", String(64)),  # the `oars.chunking.Tokenizer` it was cut with
)
Index(
    "vector_store_files_by_store",
    vector_store_files.c.vector_store_id,
    vector_store_files.c.created_ns,
)
Index("vector_store_files_by_status", vector_store_files.c.status)
Index("vector_store_files_by_file", vector_store_files.c.file_id)

vector_store_file_batches = Table(
    "vector_store_file_batches",
    metadata,
    Column("id", _ID, primary_key=True),
    Column("vector_store_id", _ID, nullable=False),
    Column("tenant", String(64), nullable=False),
    Column("created_at", Integer, nullable=False),
    Column("cancelled", Boolean, nullable=False),
)

# A file's chunks, written with its status `completed` in one transaction; the keyword index is
# kept beside (`_v6`): FTS5 on SQLite, a generated tsvector with a GIN index on PostgreSQL.
vector_chunks = Table(
    "vector_chunks",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("vector_store_id", _ID, nullable=False),
    Column("file_id", _ID, nullable=False),
    Column("position", Integer, nullable=False),
    Column("text", Text, nullable=False),
    Column("tokens", Integer, nullable=False),
)
Index("vector_chunks_by_file", vector_chunks.c.vector_store_id, vector_chunks.c.file_id)
VECTOR_TABLES = (vector_stores, vector_store_files, vector_store_file_batches, vector_chunks)


def _v1(conn: Connection) -> None:
    metadata.create_all(conn, checkfirst=True)


def _v2(conn: Connection) -> None:
    """Stored data belongs to the API key that made it (`tenant`, '' without keys)."""
    for table in ("responses", "conversations"):
        if "tenant" not in {c["name"] for c in inspect(conn).get_columns(table)}:
            conn.execute(
                text(f"ALTER TABLE {table} ADD COLUMN tenant VARCHAR(64) NOT NULL DEFAULT ''")
            )


def _v3(conn: Connection) -> None:
    """Responses and conversations record the engine replica that served them (`served_by`),
    so a chain's next turn goes to the replica whose cache holds it."""
    for table in ("responses", "conversations"):
        if "served_by" not in {c["name"] for c in inspect(conn).get_columns(table)}:
            conn.execute(
                text(f"ALTER TABLE {table} ADD COLUMN served_by VARCHAR(300) NOT NULL DEFAULT ''")
            )


def _v4(conn: Connection) -> None:
    """The event log is kept a batch a row (`response_logs`), not an event a row
    (`response_events`): one writer keeps every running response's new events every 100 ms,
    and a row an event was most of its cost. Old logs move over, an event a batch."""
    response_logs.create(conn, checkfirst=True)
    if inspect(conn).has_table("response_events"):
        conn.execute(
            text(
                "INSERT INTO response_logs (response_id, first_sequence, last_sequence, events) "
                "SELECT response_id, sequence_number, sequence_number, '[' || event || ']' "
                "FROM response_events"
            )
        )
        conn.execute(text("DROP TABLE response_events"))


def _v5(conn: Connection) -> None:
    """Uploaded files (`/v1/files`): a row each, listed by tenant in upload order."""
    files.create(conn, checkfirst=True)  # with its index


_FTS5 = (
    "CREATE VIRTUAL TABLE IF NOT EXISTS vector_chunks_fts USING fts5("
    "text, content='vector_chunks', content_rowid='id')",
    "CREATE TRIGGER IF NOT EXISTS vector_chunks_ai AFTER INSERT ON vector_chunks BEGIN "
    "INSERT INTO vector_chunks_fts(rowid, text) VALUES (new.id, new.text); END",
    "CREATE TRIGGER IF NOT EXISTS vector_chunks_ad AFTER DELETE ON vector_chunks BEGIN "
    "INSERT INTO vector_chunks_fts(vector_chunks_fts, rowid, text) "
    "VALUES ('delete', old.id, old.text); END",
)
_TSVECTOR = (
    "ALTER TABLE vector_chunks ADD COLUMN IF NOT EXISTS tsv tsvector "
    "GENERATED ALWAYS AS (to_tsvector('simple', text)) STORED",
    "CREATE INDEX IF NOT EXISTS vector_chunks_tsv ON vector_chunks USING GIN (tsv)",
)


def _v6(conn: Connection) -> None:
    """Vector stores, their files and batches, and the files' chunks with a keyword index:
    FTS5 (external content, kept by triggers in the chunks' own transaction) on SQLite, a
    `simple` tsvector with a GIN index on PostgreSQL."""
    for table in VECTOR_TABLES:
        table.create(conn, checkfirst=True)
    for statement in _TSVECTOR if conn.dialect.name == "postgresql" else _FTS5:
        conn.execute(text(statement))


def _names(conn: Connection, table: str) -> set[str]:
    """A table's columns (read from a query's, not reflected: SQLAlchemy knows no `vector`)."""
    return set(conn.execute(text(f"SELECT * FROM {table} WHERE 1 = 0")).keys())


def _v7(conn: Connection) -> None:
    """Chunks keep their vector (`embedding`, a unit float32 vector) and stores the model
    they are of. On PostgreSQL the column is pgvector's `vector` where the extension can be
    created (compared in the database), else `bytea` as on SQLite (compared by numpy). And
    responses are indexed by age and by conversation, for `--retention`'s sweeps."""
    for index in (RESPONSES_BY_AGE, RESPONSES_BY_CONVERSATION):
        index.create(conn, checkfirst=True)
    have = _names(conn, "vector_stores")
    for name, kind in (
        ("embedding_model", "VARCHAR(300)"),
        ("dimensions", "INTEGER"),
        ("chunks_version", "INTEGER NOT NULL DEFAULT 0"),
    ):
        if name not in have:
            conn.execute(text(f"ALTER TABLE vector_stores ADD COLUMN {name} {kind}"))
    if "embedding" in _names(conn, "vector_chunks"):
        return
    kind = "BLOB"
    if conn.dialect.name == "postgresql":
        kind = "bytea"
        try:
            with conn.begin_nested():
                conn.execute(text("CREATE EXTENSION IF NOT EXISTS vector"))
            kind = "vector"
        except DBAPIError:  # not installed, or not ours to create: numpy compares instead
            pass
    conn.execute(text(f"ALTER TABLE vector_chunks ADD COLUMN embedding {kind}"))
    if conn.dialect.name == "postgresql":  # in the row, not TOAST's table: a search reads all
        conn.execute(text("ALTER TABLE vector_chunks ALTER COLUMN embedding SET STORAGE MAIN"))


# Step N brings the schema from version N-1 to N. Append; never edit a released step.
STEPS: list[Callable[[Connection], None]] = [_v1, _v2, _v3, _v4, _v5, _v6, _v7]


async def upgrade(engine: AsyncEngine) -> int:
    """Create or upgrade the schema; return the version now in force."""
    async with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            await conn.execute(text("SELECT pg_advisory_xact_lock(7102590)"))
        await conn.run_sync(lambda c: version.create(c, checkfirst=True))
        current = (await conn.execute(select(version.c.version))).scalar()
        if current is None:
            await conn.execute(version.insert().values(version=0))
            current = 0
        for number, step in enumerate(STEPS[current:], start=current + 1):
            await conn.run_sync(step)
            await conn.execute(version.update().values(version=number))
        return len(STEPS) if current < len(STEPS) else int(current)

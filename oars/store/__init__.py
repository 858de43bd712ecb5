"""Stored state: responses, their items and event logs, conversations, files' rows."""

from oars.store.base import (
    TERMINAL_STATUSES,
    Chain,
    Conversation,
    FileQuery,
    Finished,
    Json,
    Logged,
    NewResponse,
    Page,
    Reads,
    Store,
    StoredFile,
    StoredResponse,
    Upkeep,
    Writes,
)
from oars.store.sql import SqlStore, database_url

__all__ = [
    "TERMINAL_STATUSES",
    "Chain",
    "Conversation",
    "FileQuery",
    "Finished",
    "Json",
    "Logged",
    "NewResponse",
    "Page",
    "Reads",
    "SqlStore",
    "Store",
    "StoredFile",
    "StoredResponse",
    "Upkeep",
    "Writes",
    "database_url",
]

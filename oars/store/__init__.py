"""Stored state: responses, their items and event logs, conversations."""

from oars.store.base import (
    TERMINAL_STATUSES,
    Chain,
    Conversation,
    Finished,
    Json,
    NewResponse,
    Page,
    Store,
    StoredResponse,
)
from oars.store.sql import SqlStore, database_url

__all__ = [
    "TERMINAL_STATUSES",
    "Chain",
    "Conversation",
    "Finished",
    "Json",
    "NewResponse",
    "Page",
    "SqlStore",
    "Store",
    "StoredResponse",
    "database_url",
]

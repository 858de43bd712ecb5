"""The Files API's rules: what an upload's form must hold, and the row it becomes.

`purpose` is one of the SDK's `FilePurpose`; `expires_after` comes as the SDK sends a nested
object in a form (`expires_after[anchor]`, `expires_after[seconds]`) and sets `expires_at`, after
which the file is gone (`StoredFile.expired`). Every field is checked here, once the body has
been read; the bytes are checked by `oars.uploads` as they come.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import get_args

from oars.api import FilePurpose
from oars.errors import InvalidRequest
from oars.ids import new_id
from oars.store import StoredFile
from oars.uploads import Form

PURPOSES: tuple[str, ...] = get_args(FilePurpose)
MIN_EXPIRY, MAX_EXPIRY = 3600, 2_592_000  # seconds: an hour to 30 days, as OpenAI
MAX_FILENAME = 1024  # characters kept of a name

_ANCHOR, _SECONDS = "expires_after[anchor]", "expires_after[seconds]"
_KNOWN = frozenset({"purpose", _ANCHOR, _SECONDS})


def _missing(name: str) -> InvalidRequest:
    return InvalidRequest(
        f"Missing required parameter: '{name}'.", param=name, code="missing_required_parameter"
    )


def _purpose(fields: Mapping[str, str]) -> str:
    purpose = fields.get("purpose")
    if purpose is None:
        raise _missing("purpose")
    if purpose not in PURPOSES:
        raise InvalidRequest(
            f"Invalid 'purpose': {purpose[:100]!r}; expected one of {', '.join(PURPOSES)}.",
            param="purpose",
        )
    return purpose


def _expires_at(fields: Mapping[str, str], created_at: int) -> int | None:
    anchor, seconds = fields.get(_ANCHOR), fields.get(_SECONDS)
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at":
        raise InvalidRequest(
            "Invalid 'expires_after.anchor': expected 'created_at'.", param="expires_after.anchor"
        )
    value = int(seconds) if seconds is not None and seconds.strip().isdecimal() else -1
    if not MIN_EXPIRY <= value <= MAX_EXPIRY:
        raise InvalidRequest(
            f"Invalid 'expires_after.seconds': expected an integer from {MIN_EXPIRY} to "
            f"{MAX_EXPIRY}.",
            param="expires_after.seconds",
        )
    return created_at + value


def new_file(form: Form, created_ns: int) -> StoredFile:
    """The row an upload becomes (its tenant is the store view's), or a 400 naming the field
    at fault."""
    unknown = sorted(set(form.fields) - _KNOWN)
    if unknown:
        raise InvalidRequest(
            f"Unrecognized request argument supplied: {unknown[0][:100]}",
            param=unknown[0][:100],
            code="unknown_parameter",
        )
    if form.filename is None:
        raise _missing("file")
    purpose = _purpose(form.fields)
    expires_at = _expires_at(form.fields, created_ns // 1_000_000_000)
    return StoredFile(
        new_id("file", sep="-"),
        form.size,
        created_ns,
        form.filename[:MAX_FILENAME],
        purpose,
        expires_at,
    )

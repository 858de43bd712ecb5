"""Encrypted reasoning: a reasoning item's text, authenticated and encrypted with the server's key,
so that a client keeping no state can send it back (`include: ["reasoning.encrypted_content"]`).

The key comes from `OARS_SECRET_KEY` or is generated once and kept in `OARS_HOME/secret.key`
(replicas behind one address share it through the variable).
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken


class Sealer:
    def __init__(self, key: bytes) -> None:
        self._fernet = Fernet(key)

    @classmethod
    def from_home(cls, home: Path) -> Sealer:
        key = os.environ.get("OARS_SECRET_KEY", "").encode()
        if key:
            return cls(key)
        path = home / "secret.key"
        if not path.exists():
            home.mkdir(parents=True, exist_ok=True)
            fresh = Fernet.generate_key()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(fresh)
        return cls(path.read_bytes().strip())

    def seal(self, text: str) -> str:
        return self._fernet.encrypt(text.encode("utf-8", "surrogatepass")).decode()

    def unseal(self, token: str) -> str:
        """The sealed text; ValueError if the token is not ours or was altered."""
        try:
            return self._fernet.decrypt(token.encode()).decode("utf-8", "surrogatepass")
        except (InvalidToken, UnicodeError) as exc:
            raise ValueError("not a token of this server's key") from exc

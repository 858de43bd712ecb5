"""The bytes of uploaded files: a file each in one folder (`OARS_HOME/files/<id>`).

An upload is written under a temporary name in that folder (`.part-…`, so the rename stays on
one file system) and renamed to its id only once it is whole and on disk: nothing reads part of
one. The store's row comes after the rename and goes before the removal (`oars.http.files`), so
a row always names bytes that are there. What a crash leaves (a `.part-…`, or bytes without a
row) is never served; the sweeper (`oars.sweeper`) removes a `.part-…` nothing has written to
for an hour.

The methods do blocking I/O: callers on the event loop run the slow ones (`Part.write`,
`Part.keep`, reads) in a thread.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from pathlib import Path
from typing import BinaryIO

_NAME = re.compile(r"[A-Za-z0-9_-]{1,200}")  # an id as minted: never a path of its own


class Part:
    """An upload being written; `keep` renames it into place, `discard` removes it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / f".part-{secrets.token_hex(16)}"
        self._file: BinaryIO = self.path.open("xb")
        self.size = 0

    def write(self, data: bytes) -> None:
        self._file.write(data)
        self.size += len(data)

    def keep(self, target: Path) -> None:
        """Flush it to disk and rename it to `target` (in the same folder)."""
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self.path, target)
        _sync_folder(self.folder)

    def discard(self) -> None:
        """Remove what was written (nothing of it stays, kept or not)."""
        self._file.close()
        self.path.unlink(missing_ok=True)


class Blobs:
    """Uploaded files' bytes, by id, under `folder` (made on the first upload)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, file_id: str) -> Path:
        if not _NAME.fullmatch(file_id):
            raise ValueError(f"not a file id: {file_id!r}")
        return self.folder / file_id

    def begin(self) -> Part:
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        return Part(self.folder)

    def keep(self, part: Part, file_id: str) -> None:
        part.keep(self.path(file_id))

    def open(self, file_id: str) -> BinaryIO | None:
        """The file's bytes to read (None when they are not there). Open, they stay readable
        even if the file is deleted meanwhile."""
        try:
            return self.path(file_id).open("rb")
        except FileNotFoundError:
            return None

    def remove(self, file_id: str) -> None:
        self.path(file_id).unlink(missing_ok=True)

    def drop_parts(self, before: float) -> int:
        """Remove the uploads last written to before `before` (a time.time()): what a crash
        or a lost upload left. How many went."""
        dropped = 0
        for path in self.folder.glob(".part-*"):
            with contextlib.suppress(FileNotFoundError):  # (kept or discarded meanwhile)
                if path.stat().st_mtime < before:
                    path.unlink()
                    dropped += 1
        return dropped


def _sync_folder(folder: Path) -> None:
    """A rename is on disk once its folder is (where the platform can sync a folder)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

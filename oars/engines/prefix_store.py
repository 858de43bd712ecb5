"""Evaluated prompts kept on disk: a new process starts a known agent prompt without its prefill.

Each file holds one sequence's state as the model context saved it, after a header with the
tokens it covers. A store reads one folder under its root, named for the model and runtime (a
state only loads into the context that made it), but the bound in bytes is the root's: states
a past model or runtime left in their folders count against it and go first when they are the
least recently used (use sets a file's modification time). Files are written by a background
thread, renamed into place when complete, so a crash leaves no torn entry.

A state is mapped, not read: the context copies it straight from the page cache. To have it
there when a request comes, the most recently used files are read ahead at start, and the one
a request will use as soon as its prompt is known (`prefetch`), while it is still queued.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import mmap
import os
import queue
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger("oars.engine")

_MAGIC = b"OARSKV1\n"
_HEADER = struct.Struct("<8sI")
READ_AHEAD_BYTES = 2**30  # kept states read ahead at start, most recently used first


@dataclass(eq=False)
class _Entry:
    path: Path
    tokens: np.ndarray  # int32
    size: int
    used: float  # when last written or found (the epoch's seconds)


class PrefixStore:
    """Prompts of at least `min_tokens`, kept in `root / key`; all of `root` up to
    `max_bytes`."""

    def __init__(self, root: Path, key: str, *, max_bytes: int, min_tokens: int = 1024) -> None:
        self.root, self.max_bytes, self.min_tokens = root, max_bytes, min_tokens
        self.folder = folder = root / key
        folder.mkdir(parents=True, exist_ok=True)
        self._entries: list[_Entry] = []  # least recently used first
        self._lock = threading.Lock()
        self._writes: queue.Queue[tuple[tuple[int, ...], bytes]] = queue.Queue(maxsize=2)
        for _, _, path in sorted(f for f in self._on_disk() if f[2].parent == folder):
            entry = self._read_header(path)
            if entry is not None:
                self._entries.append(entry)
        for partial in folder.glob("*.partial"):
            partial.unlink(missing_ok=True)
        self._evict()  # the bound may have shrunk, or other folders grown, since the last run
        threading.Thread(target=self._write_loop, name="oars-prefix-store", daemon=True).start()
        threading.Thread(
            target=self._read_ahead,
            args=(min(max_bytes, READ_AHEAD_BYTES),),
            name="oars-prefix-read-ahead",
            daemon=True,
        ).start()

    @property
    def size(self) -> int:
        return sum(e.size for e in self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    # ---- reading --------------------------------------------------------------------

    def find(
        self, prompt: tuple[int, ...], *, better_than: int = 0
    ) -> tuple[list[int], memoryview | None] | None:
        """The kept prefix sharing the most tokens with `prompt`, if that beats `better_than`
        by at least `min_tokens // 4`: its tokens and state, mapped (None if the file is gone
        or cannot be mapped)."""
        best = self._best(prompt, better_than)
        if best is None:
            return None
        try:
            with open(best.path, "rb") as f:
                # a private mapping: writable for ctypes, never written back
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            os.utime(best.path)
        except (OSError, ValueError):
            self._drop(best)
            return best.tokens.tolist(), None
        with self._lock:
            if best in self._entries:
                self._entries.remove(best)
                self._entries.append(best)
                best.used = time.time()
        return best.tokens.tolist(), memoryview(mapped)[_HEADER.size + 4 * len(best.tokens) :]

    def prefetch(self, prompt: tuple[int, ...]) -> None:
        """Start reading the state `find` would give for `prompt` into the page cache."""
        best = self._best(prompt, 0)
        if best is not None:
            _read_ahead(best.path)

    def _best(self, prompt: tuple[int, ...], better_than: int) -> _Entry | None:
        want = np.asarray(prompt, dtype=np.int32)
        best, best_n = None, better_than + self.min_tokens // 4
        with self._lock:
            entries = list(self._entries)
        for entry in entries:
            n = common_prefix(entry.tokens, want)
            if n > best_n:
                best, best_n = entry, n
        return best

    def _read_ahead(self, budget: int) -> None:
        with self._lock:
            newest_first = self._entries[::-1]
        for entry in newest_first:
            if entry.size > budget:
                return
            budget -= entry.size
            _read_ahead(entry.path)

    def wants(self, tokens: list[int]) -> bool:
        """A prompt is worth keeping when it is long and no kept prefix covers half of it."""
        if len(tokens) < self.min_tokens:
            return False
        want = np.asarray(tokens, dtype=np.int32)
        with self._lock:
            entries = list(self._entries)
        return all(common_prefix(e.tokens, want) * 2 < len(tokens) for e in entries)

    # ---- writing --------------------------------------------------------------------

    def put(self, tokens: tuple[int, ...], state: bytes) -> None:
        """Keep a state, written in the background; dropped if writes are behind."""
        try:
            self._writes.put_nowait((tokens, state))
        except queue.Full:
            log.info("prefix store busy; not keeping a %d-token prompt", len(tokens))

    def flush(self) -> None:
        """Wait until every state handed to `put` is on disk (for tests and shutdown)."""
        self._writes.join()

    def _write_loop(self) -> None:
        while True:
            tokens, state = self._writes.get()
            try:
                self._write(tokens, state)
            except OSError as exc:
                log.warning("could not keep a prefix: %s", exc)
            finally:
                self._writes.task_done()

    def _write(self, tokens: tuple[int, ...], state: bytes) -> None:
        array = np.asarray(tokens, dtype=np.int32)
        name = hashlib.sha256(array.tobytes()).hexdigest()[:32]
        path = self.folder / f"{name}.kv"
        partial = path.with_suffix(".partial")
        for attempt in (1, 2):  # another process's eviction may remove the folder when empty
            self.folder.mkdir(parents=True, exist_ok=True)
            try:
                with open(partial, "wb") as out:
                    out.write(_HEADER.pack(_MAGIC, len(array)))
                    out.write(array.tobytes())
                    out.write(state)
                os.replace(partial, path)
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
        entry = _Entry(path, array, path.stat().st_size, time.time())
        with self._lock:
            self._entries = [e for e in self._entries if e.path != path] + [entry]
        self._evict()

    def _evict(self) -> None:
        """Delete the least recently used states under the root until they fit the bound: this
        store's own in the order it used them, the rest (other folders', or ones another
        process with this key wrote here) by modification time, before an own one used at the
        same time. Then the other folders left empty go."""
        files = self._on_disk()
        here = {path for _, _, path in files if path.parent == self.folder}
        with self._lock:  # what another process sharing the root deleted no longer counts
            self._entries = [e for e in self._entries if e.path in here]
            mine = {e.path for e in self._entries}
        others = sorted((f for f in files if f[2] not in mine), reverse=True)  # oldest last
        while True:
            with self._lock:
                if self.size + sum(size for _, size, _ in others) <= self.max_bytes:
                    break
                own = self._entries[0] if self._entries else None
                if others and (own is None or others[-1][0] <= own.used):
                    path = others.pop()[2]
                else:
                    assert own is not None
                    path = self._entries.pop(0).path
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:  # not ours to delete, say: it is no longer counted either
                log.warning("could not delete the kept prefix %s: %s", path, exc)
        with contextlib.suppress(OSError), os.scandir(self.root) as folders:
            for folder in list(folders):
                if folder.path != str(self.folder):
                    with contextlib.suppress(OSError):  # not empty, not a folder, or gone
                        os.rmdir(folder.path)

    def _on_disk(self) -> list[tuple[float, int, Path]]:
        """Every state kept under the root, as (modification time, size, path). What goes
        while it is listed (another process sharing the root evicts too) is left out."""
        found = []
        with contextlib.suppress(OSError), os.scandir(self.root) as folders:
            for folder in list(folders):
                try:
                    with os.scandir(folder.path) as entries:
                        files = [e for e in entries if e.name.endswith(".kv")]
                except OSError:  # not a folder, or gone
                    continue
                for file in files:
                    try:
                        stat = file.stat()
                    except OSError:
                        continue
                    found.append((stat.st_mtime, stat.st_size, Path(file.path)))
        return found

    def _drop(self, entry: _Entry) -> None:
        with self._lock:
            if entry in self._entries:
                self._entries.remove(entry)
        entry.path.unlink(missing_ok=True)

    def _read_header(self, path: Path) -> _Entry | None:
        try:
            with open(path, "rb") as f:
                magic, count = _HEADER.unpack(f.read(_HEADER.size))
                tokens = np.frombuffer(f.read(4 * count), dtype=np.int32)
            if magic != _MAGIC or len(tokens) != count:
                raise ValueError("not a prefix file")
            stat = path.stat()
            return _Entry(path, tokens, stat.st_size, stat.st_mtime)
        except (OSError, ValueError, struct.error):
            log.warning("dropping an unreadable kept prefix %s", path.name)
            path.unlink(missing_ok=True)
            return None


def _read_ahead(path: Path) -> None:
    """Ask the kernel to read a file into the page cache (in the background)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        if hasattr(os, "posix_fadvise"):  # not on every system; then the first read pays
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


def common_prefix(held: Sequence[int] | np.ndarray, prompt: Sequence[int] | np.ndarray) -> int:
    """How many leading tokens agree; never the whole prompt (its last token must be fed to
    get the logits of the first output token)."""
    n = min(len(held), len(prompt) - 1)
    if n <= 0:
        return 0
    a = np.asarray(held[:n], dtype=np.int64)
    b = np.asarray(prompt[:n], dtype=np.int64)
    differ = np.flatnonzero(a != b)
    return int(differ[0]) if differ.size else n

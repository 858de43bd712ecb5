"""llama.cpp itself, as the engine drives it: a context of several sequences through the batch
API (decode a batch, read a row of logits, drop or save and load a sequence's memory), and
llama.cpp's own log routed to Python's logging.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import threading
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from oars.engines.batching import Feed
from oars.errors import EngineError


class LlamaLog:
    """llama.cpp's own log, as lines of the `oars.llama` logger (so `--log-format json` holds
    for them too): its errors as errors, the rest at debug level, seen with `--log-level
    debug` (its warnings are mostly about metadata a model of the default family is known to
    have). llama.cpp writes a line in pieces; they are joined up to the newline."""

    # ggml's log levels: 1 debug, 2 info, 3 warn, 4 error, 5 the line goes on
    _LEVELS = {4: logging.ERROR}
    _installed: ClassVar[LlamaLog | None] = None

    @classmethod
    def install(cls, llama_cpp: Any) -> None:
        """Route llama.cpp's log here from now on (once a process)."""
        if cls._installed is None:
            cls._installed = cls(llama_cpp)

    def __init__(self, llama_cpp: Any) -> None:
        self._log = logging.getLogger("oars.llama")
        self._pending: list[bytes] = []
        self._level = logging.DEBUG
        self._lock = threading.Lock()
        # kept on the instance while llama.cpp may call it; at exit, before this module's
        # objects go, llama.cpp is given back llama-cpp-python's own
        self.callback = llama_cpp.llama_log_callback(self._line)
        llama_cpp.llama_log_set(self.callback, ctypes.c_void_p(0))
        atexit.register(self._restore, llama_cpp)

    @staticmethod
    def _restore(llama_cpp: Any) -> None:
        own = getattr(getattr(llama_cpp, "_logger", None), "llama_log_callback", None)
        if own is not None:
            llama_cpp.llama_log_set(own, ctypes.c_void_p(0))

    def _line(self, level: int, text: bytes | None, _user_data: ctypes.c_void_p) -> None:
        done: list[tuple[int, bytes]] = []
        with self._lock:
            if level != 5:  # a new line: what is pending of the last one goes as it is
                if self._pending:
                    done.append((self._level, b"".join(self._pending)))
                    self._pending = []
                self._level = self._LEVELS.get(level, logging.DEBUG)
            self._pending.append(text or b"")
            if self._pending[-1].endswith(b"\n"):
                done.append((self._level, b"".join(self._pending)))
                self._pending = []
        for at, line in done:
            if message := line.decode("utf-8", errors="replace").rstrip():
                self._log.log(at, "%s", message)


class LlamaContext:
    """A llama.cpp context of `n_seq` sequences of up to `n_ctx_seq` tokens each, driven
    through the batch API (one KV memory per sequence)."""

    def __init__(
        self,
        llama_cpp: Any,
        model: Any,
        *,
        n_seq: int,
        n_ctx_seq: int,
        n_batch: int,
        n_threads: int,
        n_vocab: int,
        flash_attn: bool | None = None,
    ) -> None:
        self._api, self.n_batch, self._n_vocab = llama_cpp, n_batch, n_vocab
        params = llama_cpp.llama_context_default_params()
        if flash_attn is not None:  # else llama.cpp chooses
            params.flash_attn_type = (
                llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
                if flash_attn
                else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
            )
        params.n_ctx = n_seq * n_ctx_seq
        params.n_batch = params.n_ubatch = n_batch
        params.n_seq_max = n_seq
        params.n_threads = params.n_threads_batch = n_threads
        params.kv_unified = False  # each sequence its own memory of n_ctx_seq
        self._ctx = llama_cpp.llama_init_from_model(model, params)
        if not self._ctx:
            raise EngineError(f"could not make a context of {n_seq} × {n_ctx_seq} tokens")
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self._rows: np.ndarray | None = None  # the logits of the last pass's outputs

    def decode(self, feeds: Sequence[Feed]) -> None:
        batch, i, outputs = self._batch, 0, 0
        for feed in feeds:
            for offset, token in enumerate(feed.tokens):
                batch.token[i], batch.pos[i] = token, feed.start + offset
                batch.n_seq_id[i], batch.seq_id[i][0], batch.logits[i] = 1, feed.seq, 0
                i += 1
            if feed.output:  # the last token's row, and each draft token's before it
                for row in range(i - 1 - feed.drafted, i):
                    batch.logits[row] = 1
                outputs += 1 + feed.drafted
        batch.n_tokens = i
        self._rows = None
        status = self._api.llama_decode(self._ctx, batch)
        if status != 0:
            raise EngineError(f"the model could not evaluate a batch (llama_decode: {status})")
        if outputs:  # llama.cpp keeps the outputs' logits in a row each, in batch order
            first = self._api.llama_get_logits(self._ctx)
            size = outputs * self._n_vocab
            rows = (ctypes.c_float * size).from_address(ctypes.addressof(first.contents))
            self._rows = np.frombuffer(memoryview(rows), dtype=np.float32).reshape(
                -1, self._n_vocab
            )

    def logits(self, index: int) -> np.ndarray:
        # llama.cpp's own buffer, not a copy: copying it was a tenth of a millisecond a token
        # (the rows are cold in this core's cache), and the next pass is what overwrites it.
        assert self._rows is not None
        row: np.ndarray = self._rows[index]
        return row

    def forget(self, seq: int, start: int) -> bool:
        return bool(self._api.llama_memory_seq_rm(self._memory, seq, start, -1))

    def save(self, seq: int) -> bytes:
        size = self._api.llama_state_seq_get_size(self._ctx, seq)
        buffer = (ctypes.c_uint8 * size)()
        written = self._api.llama_state_seq_get_data(self._ctx, buffer, size, seq)
        return bytes(memoryview(buffer)[:written])

    def load(self, seq: int, state: memoryview) -> bool:
        source = (ctypes.c_uint8 * len(state)).from_buffer(state)  # no copy of a mapped file
        try:
            return bool(self._api.llama_state_seq_set_data(self._ctx, source, len(state), seq))
        finally:
            del source  # the buffer is released for its owner to close

"""llama.cpp's log lines, which it writes in pieces, come out of oars's log whole."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from oars.engines.llama_context import LlamaLog

Line = Callable[[int, bytes, Any], None]


class FakeLlamaCpp:
    """What `LlamaLog` uses of llama-cpp-python: the callback type and the setter."""

    def __init__(self) -> None:
        self.installed: Line | None = None

    @staticmethod
    def llama_log_callback(function: Line) -> Line:
        return function

    def llama_log_set(self, callback: Line, _user_data: Any) -> None:
        self.installed = callback


def test_pieces_are_joined_into_lines_at_llama_cpp_s_levels(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeLlamaCpp()
    LlamaLog(fake)
    send = fake.installed
    assert send is not None
    with caplog.at_level(logging.DEBUG, logger="oars.llama"):
        send(2, b"load_tensors: loading", None)  # info
        send(5, b" model tensors", None)  # the same line goes on
        send(5, b".....\n", None)
        send(3, b"a warning\n", None)
        send(4, b"failed to ", None)  # an error, in two pieces
        send(5, b"allocate\n", None)
        send(2, b"\n", None)  # an empty line: nothing
        send(4, b"cut short", None)  # a new line before this one ended: each at its level
        send(2, b"caf\xc3", None)  # a character split between two pieces
        send(5, b"\xa9\n", None)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.DEBUG, "load_tensors: loading model tensors....."),
        (logging.DEBUG, "a warning"),
        (logging.ERROR, "failed to allocate"),
        (logging.ERROR, "cut short"),
        (logging.DEBUG, "caf\u00e9"),
    ]

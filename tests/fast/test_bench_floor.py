"""`bench.floor`'s HTTP: the bench's own client reads its stream as it reads llama-server's.

The floor's engine is llama.cpp; here a stand-in answers each job from the loop (a piece per
prompt token), so what is tested is the floor's framing, not a model."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvloop

from bench.floor import Connection
from bench.vs_llama_server import Server, _oars_body, _oars_event


class Answers:
    """Takes the place of `bench.floor.Engine`: the prompt's tokens are its characters, and
    each job's pieces the first of them."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.jobs = self
        self.prompts: list[str] = []

    def tokenize(self, text: str) -> list[Any]:
        self.prompts.append(text)
        return list(text)

    def put(self, job: tuple[list[str], int, Any, Any, bool]) -> None:
        """A job's answer: on the loop, or for a direct one on a thread of its own (as the
        engine thread would)."""
        tokens, max_tokens, token_out, done, direct = job
        calls: list[tuple[Any, object]] = [(token_out, t) for t in tokens[:max_tokens]]
        calls.append((done, (len(tokens), min(len(tokens), max_tokens))))
        if direct:
            threading.Thread(target=lambda: [out(item) for out, item in calls]).start()
        else:
            for out, item in calls:
                self.loop.call_soon(out, item)


@pytest.fixture
def floor() -> Iterator[tuple[str, Answers]]:
    loop = uvloop.new_event_loop()
    answers = Answers(loop)
    listener = socket.create_server(("127.0.0.1", 0))
    server = loop.run_until_complete(
        loop.create_server(lambda: Connection(answers), sock=listener)  # type: ignore[arg-type]
    )
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", answers
    loop.call_soon_threadsafe(server.close)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


@pytest.mark.parametrize("path", ["/v1/responses", "/direct/v1/responses"])
def test_the_bench_client_reads_the_floors_stream_and_usage(
    floor: tuple[str, Answers], path: str
) -> None:
    base, answers = floor
    server = Server("floor", lambda port: [], path, _oars_body, _oars_event,
                    Path("floor.log"), base=base)  # fmt: skip
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Count"}]
    stream = server.one(chat, 4)
    assert answers.prompts == [
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nCount<|im_end|>\n"
        "<|im_start|>assistant\n"
    ]
    assert stream.text == "<|im"
    assert (stream.prompt_tokens, stream.output_tokens) == (len(answers.prompts[0]), 4)
    assert len(stream.arrivals) == 4  # a chunk a token
    # and the connection serves the next request too (the bench's readiness probe first)
    assert server.one(chat, 1).output_tokens == 1


def test_a_request_split_across_packets_is_read_whole(floor: tuple[str, Answers]) -> None:
    base, _ = floor
    body = (
        b'{"instructions": "", "input": [{"role": "user", "content": "a"}], "max_output_tokens": 2}'
    )
    head = f"POST /v1/responses HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n"
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        for part in (head.encode()[:10], head.encode()[10:] + body[:7], body[7:]):
            sock.sendall(part)
        got = b""
        while not got.endswith(b"0\r\n\r\n"):
            data = sock.recv(65536)
            assert data, f"closed early: {got!r}"
            got += data
    assert got.startswith(b"HTTP/1.1 200 OK\r\n")
    assert got.count(b"event: response.output_text.delta\ndata: ") == 2
    assert b'"usage":{"input_tokens":' in got and b"event: response.completed" in got

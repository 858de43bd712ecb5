"""The thinnest server a Python token path allows: the floor beneath `oars serve`'s decode.

    .venv/bin/python -m bench.floor --port 8090 [--model M] [--threads 2] [--ctx 16384]

It answers `POST /v1/responses` with the bytes `oars serve` writes for a text answer (an
`event:` and `data:` a token, `response.output_text.delta` as oars makes it, then
`response.completed` with the usage), so a client reads the same. Its tokens come from the
context `oars serve` decodes in (the same sequences and kernels, argmax over llama.cpp's
logits), as many requests at a time as it has sequences. The engine thread hands each token to
the event loop through oars's own handover (one wake-up a pass, written as the next pass
starts), and the loop writes it to the socket as one HTTP chunk.

There is nothing else: no parser, no state machine, no Starlette, no store; an answer ends at
the model's end-of-generation token or at `max_output_tokens`. What it costs a token is what
any Python server pays that streams a token at a time from a thread beside llama.cpp's: the
argmax, the piece's text, the wake-up, the loop's turn, the event's JSON and the write.
`bench.serving` runs it beside `oars serve` and llama-server: between it and `oars serve` are
oars's own layers; between it and llama-server, what a Python token path costs.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import functools
import json
import os
import queue
import re
import select
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import uvloop

from bench.kernels import model_context, raw_model
from oars.engines.batching import Feed
from oars.engines.handover import Handover, Mailbox
from oars.engines.llama import LlamaLog, default_parallel
from oars.http.sse import encode
from oars.ids import new_id
from oars.weights import pull

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
LENGTH = re.compile(rb"\r\ncontent-length: *(\d+)", re.IGNORECASE)

# a request's prompt tokens, its max_output_tokens, what takes each token's text and what
# takes the counts at the end; whether those run on the engine thread (else on the loop)
Job = tuple[list[int], int, Callable[[Any], object], Callable[[Any], object], bool]


@dataclass
class _Answer:
    """A request being answered: its sequence, its counts, where its tokens go."""

    seq: int
    prompt_tokens: int
    max_tokens: int
    token_out: Callable[[Any], object]
    done: Callable[[Any], object]
    direct: bool
    made: int = 0  # tokens so far
    ended: bool = False  # the model wrote its end-of-generation token
    token: int = 0  # the last, to feed next

    @property
    def position(self) -> int:
        """Where the last token goes: after the prompt and the tokens fed before it."""
        return self.prompt_tokens + self.made - 1


class Engine:
    """Requests on the context's sequences, as many at a time as it has: each prompt in a pass
    of its own (oars's batcher puts prompts that wait together in one), then one pass a step
    for a token of each, the sequences in order (as oars's batcher feeds them)."""

    def __init__(self, model: Path, threads: int, ctx: int) -> None:
        import llama_cpp

        LlamaLog.install(llama_cpp)
        self.api = llama_cpp
        weights = raw_model(llama_cpp, str(model), repack=False)
        self.vocab = llama_cpp.llama_model_get_vocab(weights)
        n_seq = default_parallel(ctx)
        self.context = model_context(
            llama_cpp, weights, n_seq=n_seq, n_ctx_seq=ctx, threads=threads
        )
        self.free = list(range(n_seq))
        self.handover = Handover()
        self.jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self.box: Mailbox | None = None
        self._piece = ctypes.create_string_buffer(256)

    def tokenize(self, text: str) -> list[int]:
        raw = text.encode()
        tokens = (self.api.llama_token * (len(raw) + 8))()
        n = self.api.llama_tokenize(self.vocab, raw, len(raw), tokens, len(tokens), False, True)
        return list(tokens[:n])

    def piece(self, token: int) -> str:
        n = self.api.llama_token_to_piece(self.vocab, token, self._piece, 256, 0, False)
        return self._piece.raw[:n].decode("utf-8", errors="replace")

    def run(self) -> None:
        """The engine thread."""
        answers: list[_Answer] = []
        while True:
            while self.free:  # admit what waits (and wait for something if nothing runs)
                try:
                    job = self.jobs.get(block=not answers)
                except queue.Empty:
                    break
                answers.append(self._admit(*job))
                self._next(answers[-1:])
            for answer in [a for a in answers if a.ended or a.made == a.max_tokens]:
                self._end(answer)
                answers.remove(answer)
            self.handover.flush()  # as oars's batcher does: the wake-up as the pass starts
            if answers:
                # as oars's batcher feeds them: in sequence order, for llama.cpp makes a graph
                # of each run of consecutive sequences (one memory each) in increasing order
                answers.sort(key=lambda a: a.seq)
                self.context.decode([Feed(a.seq, (a.token,), a.position, True) for a in answers])
                self._next(answers)

    def _admit(
        self,
        prompt: list[int],
        max_tokens: int,
        token_out: Callable[[Any], object],
        done: Callable[[Any], object],
        direct: bool,
    ) -> _Answer:
        seq = min(self.free)  # beside the running ones, as oars's batcher takes a slot
        self.free.remove(seq)
        self.context.forget(seq, 0)
        self.context.decode([Feed(seq, tuple(prompt), 0, True)])
        return _Answer(seq, len(prompt), max_tokens, token_out, done, direct)

    def _next(self, answers: list[_Answer]) -> None:
        """Each answer's token from its row of the last pass (in order), handed on."""
        for row, answer in enumerate(answers):
            answer.token = int(np.argmax(self.context.logits(row)))
            answer.made += 1
            if self.api.llama_vocab_is_eog(self.vocab, answer.token):
                answer.ended = True  # counted, as oars counts it, and not shown
            else:
                self._hand(answer, answer.token_out, self.piece(answer.token))

    def _end(self, answer: _Answer) -> None:
        """An answer with all its tokens: its end handed on, its sequence freed."""
        self._hand(answer, answer.done, (answer.prompt_tokens, answer.made))
        self.free.append(answer.seq)

    def _hand(self, answer: _Answer, out: Callable[[Any], object], item: object) -> None:
        if answer.direct:
            out(item)
        else:
            assert self.box is not None
            self.handover.post(self.box, out, item)


class Connection(asyncio.Protocol):
    """HTTP/1.1 as far as the bench's client needs it: a GET answers `{}`, a POST streams.

    A POST to `/direct/v1/responses` streams without the loop: the engine thread writes each
    token's event to the socket itself, after the argmax and before the next pass. That is
    the floor of a token path with no thread to wake, which no server with its protocol on
    an event loop has."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.item, self.sequence = "", 0  # the answer's message id, the next event's number
        self.write: Callable[[bytes], object] = lambda data: None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.buffer += data
        head, blank, rest = self.buffer.partition(b"\r\n\r\n")
        if not blank:
            return
        if head.startswith(b"GET"):
            self.buffer = rest
            self.transport.write(OK)
            return
        found = LENGTH.search(head)
        length = int(found.group(1)) if found else 0
        if len(rest) < length:
            return
        body, self.buffer = rest[:length], rest[length:]
        text, max_tokens = _chatml(body)
        self.item, self.sequence = new_id("msg"), 0
        self.transport.write(HEAD)
        direct = head.startswith(b"POST /direct/")
        if direct:
            fd = self.transport.get_extra_info("socket").fileno()
            self.write = functools.partial(_send, fd)
        else:
            self.write = self.transport.write
        tokens = self.engine.tokenize(text)
        self.engine.jobs.put((tokens, max_tokens, self._token, self._done, direct))

    def _chunk(self, event: dict[str, Any]) -> None:
        data = encode(event)
        self.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _next(self) -> int:
        self.sequence += 1
        return self.sequence - 1

    def _token(self, piece: str) -> None:
        self._chunk(
            {
                "type": "response.output_text.delta",
                "sequence_number": self._next(),
                "item_id": self.item,
                "output_index": 0,
                "content_index": 0,
                "delta": piece,
                "logprobs": [],
            }
        )

    def _done(self, counts: tuple[int, int]) -> None:
        usage = {"input_tokens": counts[0], "output_tokens": counts[1]}
        event = {"type": "response.completed", "sequence_number": self._next()}
        self._chunk({**event, "response": {"usage": usage}})
        self.write(b"0\r\n\r\n")


def _send(fd: int, data: bytes) -> None:
    """All of `data` to a non-blocking socket, from a thread other than its loop's."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            select.select([], [fd], [])


def _chatml(body: bytes) -> tuple[str, int]:
    """The request's instructions and input messages in the default model's chat format,
    and its `max_output_tokens`."""
    request = json.loads(body)
    messages = [{"role": "system", "content": request["instructions"]}, *request["input"]]
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return turns + "<|im_start|>assistant\n", int(request["max_output_tokens"])


async def serve(engine: Engine, port: int) -> None:
    loop = asyncio.get_running_loop()
    engine.box = engine.handover.mailbox(loop)
    threading.Thread(target=engine.run, name="floor-engine", daemon=True).start()
    server = await loop.create_server(lambda: Connection(engine), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", type=Path, default=None, help="a GGUF (default: oars's own)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--ctx", type=int, default=16384, help="context of each sequence")
    args = parser.parse_args()
    engine = Engine(args.model or pull(), args.threads, args.ctx)
    uvloop.run(serve(engine, args.port))


if __name__ == "__main__":
    main()

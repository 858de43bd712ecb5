"""Streams timed on the client, in the two dialects the benches speak: the Responses API
(oars) and Chat Completions (llama-server, an upstream). A first token is the first text
delta; token counts come from the usage each server reports, since a delta may carry part of
a token or several."""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.prompts import Chat
from bench.servers import Server


@dataclass
class Stream:
    """One streamed request, timed on the client (perf_counter seconds)."""

    start: float
    first: float = 0.0
    last: float = 0.0
    end: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    drafted: int = 0  # draft tokens llama-server verified, and accepted (its timings)
    accepted: int = 0
    text: str = ""
    arrivals: list[float] = field(default_factory=list)  # of each text delta

    def add(self, text: str, now: float) -> None:
        self.first = self.first or now
        self.last = now
        self.text += text
        self.arrivals.append(now)

    @property
    def between_ms(self) -> float:
        """The median time between two text deltas (one a token on both servers)."""
        gaps = [b - a for a, b in itertools.pairwise(self.arrivals)]
        return statistics.median(gaps) * 1000 if gaps else float("nan")

    @property
    def ttft(self) -> float:
        return self.first - self.start

    @property
    def decode_tps(self) -> float:
        return (self.output_tokens - 1) / (self.last - self.first)


def responses_body(chat: Chat, max_tokens: int) -> dict[str, Any]:
    return {
        "model": "bench",
        "instructions": chat[0]["content"],
        "input": chat[1:],
        "temperature": 0,
        "max_output_tokens": max_tokens,
        "stream": True,
        "store": False,
    }


def responses_event(event: dict[str, Any], stream: Stream, now: float) -> None:
    if event["type"] == "response.output_text.delta":
        stream.add(event["delta"], now)
    elif event["type"] in ("response.completed", "response.incomplete"):
        usage = event["response"]["usage"]
        stream.prompt_tokens, stream.output_tokens = usage["input_tokens"], usage["output_tokens"]
        stream.cached_tokens = (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)


def chat_body(chat: Chat, max_tokens: int) -> dict[str, Any]:
    return {
        "messages": chat,
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def chat_event(event: dict[str, Any], stream: Stream, now: float) -> None:
    text = "".join((c.get("delta") or {}).get("content") or "" for c in event.get("choices", []))
    if text:
        stream.add(text, now)
    if event.get("usage"):
        stream.prompt_tokens = event["usage"]["prompt_tokens"]
        stream.output_tokens = event["usage"]["completion_tokens"]
    if timings := event.get("timings"):  # llama-server's
        stream.cached_tokens = timings.get("cache_n", 0)
        stream.drafted = timings.get("draft_n", 0)
        stream.accepted = timings.get("draft_n_accepted", 0)


@dataclass(frozen=True)
class Dialect:
    """Where a server takes a chat, the body it wants, and how its events land in a Stream."""

    path: str
    body: Callable[[Chat, int], dict[str, Any]]
    event: Callable[[dict[str, Any], Stream, float], None]


RESPONSES = Dialect("/v1/responses", responses_body, responses_event)
CHAT_COMPLETIONS = Dialect("/v1/chat/completions", chat_body, chat_event)


@dataclass
class Endpoint:
    """A server and the dialect it is asked in."""

    server: Server
    dialect: Dialect

    @property
    def name(self) -> str:
        return self.server.name

    async def stream(self, client: httpx.AsyncClient, chat: Chat, max_tokens: int) -> Stream:
        stream = Stream(time.perf_counter())
        body = self.dialect.body(chat, max_tokens)
        url = f"{self.server.base}{self.dialect.path}"
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                raise RuntimeError(
                    f"{self.name}: HTTP {r.status_code}: {(await r.aread())[:500]!r}"
                )
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    self.dialect.event(json.loads(line[6:]), stream, time.perf_counter())
        stream.end = time.perf_counter()
        if not stream.first or not stream.output_tokens:
            raise RuntimeError(f"{self.name}: a stream with no text or no usage")
        return stream

    async def _gather(self, chats: list[Chat], max_tokens: int) -> list[Stream]:
        limits = httpx.Limits(max_connections=len(chats) + 1)
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
            return list(await asyncio.gather(*(self.stream(client, c, max_tokens) for c in chats)))

    def many(self, chats: list[Chat], max_tokens: int) -> list[Stream]:
        """The chats streamed concurrently, each from its own connection."""
        return asyncio.run(self._gather(chats, max_tokens))

    def one(self, chat: Chat, max_tokens: int) -> Stream:
        return self.many([chat], max_tokens)[0]

    def whole(self, chat: Chat, max_tokens: int) -> tuple[float, int]:
        """The chat answered in one JSON body, not streamed: (wall seconds, output tokens)."""
        body = {**self.dialect.body(chat, max_tokens), "stream": False}
        body.pop("stream_options", None)
        began = time.perf_counter()
        r = httpx.post(f"{self.server.base}{self.dialect.path}", json=body, timeout=600)
        wall = time.perf_counter() - began
        if r.status_code != 200:
            raise RuntimeError(f"{self.name}: HTTP {r.status_code}: {r.text[:500]!r}")
        usage = r.json()["usage"]
        return wall, usage.get("output_tokens") or usage.get("completion_tokens") or 0


def aggregate(streams: list[Stream]) -> float:
    """Output tokens of all streams over the wall time from the first start to the last end."""
    wall = max(s.end for s in streams) - min(s.start for s in streams)
    return sum(s.output_tokens for s in streams) / wall

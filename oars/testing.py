"""Test helpers shipped with the package: a scripted engine that needs no model.

engine = ScriptedEngine(["Hel", "lo", "!"])             # three chunks, then stop
engine = ScriptedEngine(["Hi"], finish=FinishReason.LENGTH)
engine = ScriptedEngine(["Hi", " END", "more"])          # with stop=["END"]: "Hi ", then stop
engine = ScriptedEngine(["Hi", ScriptedEngine.FAIL])     # an engine failure mid-stream
engine = ScriptedEngine(lambda request: ["Done."] if request.after_tool_output else [CALL])
                                                         # a script chosen per generation

with search_backend() as backend:                        # a web search backend on loopback
    web_search(f"searxng={base_url(backend)}")
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from oars.engines.base import ModelInfo, Opened
from oars.errors import ContextLengthExceeded, EngineError
from oars.events import Event
from oars.families import Family, Hermes, Plan
from oars.generation import EngineChunk, EngineRequest, FinishReason, TokenLogprob, Usage
from oars.normalize import ResponseRequest
from oars.service import ResponsesService
from oars.turn import Turn

Script = Sequence[object]


@dataclass(frozen=True)
class Prepared(Opened):
    prompt: str = ""
    prompt_tokens: tuple[int, ...] = ()
    script: Script = ()

    @property
    def input_tokens(self) -> int:
        return len(self.prompt_tokens)


@dataclass
class ScriptedEngine:
    """Replays fixed chunks of text. Each string is one chunk of one token. `script` may be a
    function of the engine request, for responses of several generations."""

    FAIL = object()

    script: Script | Callable[[EngineRequest], Script] = ("Hello", " world", "!")
    finish: FinishReason = FinishReason.STOP
    info: ModelInfo = field(default_factory=lambda: ModelInfo("scripted", context_length=4096))
    family: Family = field(default_factory=lambda: Hermes(guards=True))
    logprobs: bool = False
    delay: float = 0.0
    busy: bool = False
    requests: list[EngineRequest] = field(default_factory=list)
    plans: list[Plan] = field(default_factory=list)  # what the embedded engine would run

    def prepare(self, request: EngineRequest) -> Prepared:
        prompt = "\n".join(f"{m.role}: {m.content}" for m in request.messages)
        tokens = tuple(range(len(prompt.split())))
        limit = self.info.context_length or 0
        if len(tokens) > limit:
            raise ContextLengthExceeded(
                f"The prompt has {len(tokens)} tokens; this model's context is {limit}."
            )
        plan = self.family.plan(request)
        self.requests.append(request)
        self.plans.append(plan)
        parser = self.family.parser(
            plan.tools, in_reasoning=self.family.starts_in_reasoning(prompt)
        )
        script = self.script(request) if callable(self.script) else self.script
        return Prepared(request, parser, prompt, tokens, script)

    async def open(self, request: EngineRequest) -> Opened:
        return self.prepare(request)

    async def count_tokens(self, request: EngineRequest) -> int:
        return len(self.prepare(request).prompt_tokens)

    async def start(self) -> None:
        """Nothing runs beside its requests."""

    async def aclose(self) -> None:
        """Nothing is held open."""

    async def generate(self, opened: Opened) -> AsyncIterator[EngineChunk]:
        assert isinstance(opened, Prepared)
        prepared = opened
        limit = prepared.request.sampling.max_output_tokens
        produced = 0
        for piece in prepared.script:
            if self.delay:
                await asyncio.sleep(self.delay)
            if piece is self.FAIL:
                raise EngineError("scripted engine failure")
            if limit is not None and produced >= limit:
                yield self._last(prepared, produced, FinishReason.LENGTH)
                return
            produced += 1
            text, stop = _cut(str(piece), prepared.request.sampling.stop)
            yield EngineChunk(text, 1, self._logprobs(text))
            if stop is not None:
                yield self._last(prepared, produced, FinishReason.STOP, stop)
                return
        yield self._last(prepared, produced, self.finish)

    def _logprobs(self, text: str) -> tuple[TokenLogprob, ...]:
        if not self.logprobs:
            return ()
        return (TokenLogprob(text, tuple(text.encode()), -0.5),)

    @staticmethod
    def _last(
        prepared: Prepared, produced: int, reason: FinishReason, stop: str | None = None
    ) -> EngineChunk:
        usage = Usage(input_tokens=len(prepared.prompt_tokens), output_tokens=produced)
        return EngineChunk("", 0, finish=reason, usage=usage, stop_sequence=stop)


def _cut(text: str, stops: Sequence[str]) -> tuple[str, str | None]:
    """A chunk up to the first stop sequence in it, and that sequence (as the embedded engine
    ends its output; a sequence split across chunks is not looked for)."""
    found = [(p, s) for s in stops if (p := text.find(s)) >= 0]
    if not found:
        return text, None
    cut, stop = min(found)
    return text[:cut], stop


def run_to_end(service: ResponsesService, request: ResponseRequest) -> list[Event]:
    """Every event of one response without history, without the HTTP layer (for tests and
    benchmarks)."""

    async def collect() -> list[Event]:
        turn = Turn.of(request, service.unseal)
        generation = await service.start(turn)
        return [event async for event in generation.events()]

    return asyncio.run(collect())


# ---- a web search backend ---------------------------------------------------------------------

DOCS = "https://docs.example.org/deploys"
OTHER = "https://elsewhere.example.net/birds"
PAGE = """<html><head><title>Deploy words</title></head><body>
<nav>Home | About | Contact</nav>
<article><h1>Deploy words</h1>
<p>Each release of the lighthouse service has a code word chosen by the on-call engineer.</p>
<p>The code word of the autumn release is heron-42, and it is said at the start of the deploy.</p>
<p>The deploy itself runs from the release branch once the tests are green on every platform,
and the on-call engineer watches the dashboards for an hour afterwards, noting anything that
moved in the release log, so that the next engineer knows what the last release changed and
what it did not change, and so that nobody has to ask the same questions twice.</p>
<p>Older releases used the names of rivers, which nobody could spell.</p>
</article></body></html>"""


class _Backend(BaseHTTPRequestHandler):
    """SearXNG's JSON answer for `/search`, a page under `/pages/`, a 500 for the query
    'boom'. The queries it was asked are kept on the server."""

    def do_GET(self) -> None:
        url = urlparse(self.path)
        if url.path == "/search":
            query = parse_qs(url.query).get("q", [""])[0]
            self.server.queries.append(query)  # type: ignore[attr-defined]
            if query == "boom":
                return self._send(500, "application/json", b"{}")
            results = [
                {
                    "url": DOCS,
                    "title": "Deploy code words",
                    "content": "The code word of the lighthouse autumn release is heron-42.",
                },
                {"url": OTHER, "title": "Birds", "content": "Herons wade in <b>shallow</b> water."},
            ]
            return self._send(200, "application/json", json.dumps({"results": results}).encode())
        if url.path == "/pages/deploys":
            return self._send(200, "text/html; charset=utf-8", PAGE.encode())
        self._send(404, "text/plain", b"not here")

    def _send(self, status: int, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def search_backend() -> Iterator[ThreadingHTTPServer]:
    """A SearXNG-compatible web search backend on a free loopback port: SearXNG's JSON API
    (`/search?q=…&format=json`, the part oars reads), fixed results, and the page one of them
    points to. SearXNG itself is in no registry this project installs from."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Backend)
    server.queries = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def base_url(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"

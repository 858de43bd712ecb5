"""The replicas of one upstream model, and which one each request goes to.

Routing, in order:
1. A request that continues a response (`Route.follow`: recorded with the stored response, so
   every oars replica routes alike) goes to the replica that served it, whose cache holds the
   chain's prompt. The next step of a response that runs MCP tools follows its first step.
2. Otherwise the replica its stable prefix hashes to: the client's `prompt_cache_key`, else the
   system messages, the tools and the first user message. Rendezvous hashing over the replicas
   in service, so new sessions of one agent share a warm replica, and a replica that leaves
   moves only its own sessions.
3. Either yields to the replica with the fewest requests in flight when the chosen one has more
   than `imbalance` beyond it, or (a chain's) is out of service.

A replica leaves service when its health check fails or a connection to it is refused; the
health checks (every `health_interval` seconds) bring it back. A check that times out ejects
only a replica with nothing in flight: one that is streaming is busy, not gone (a server that
answers its checks only between generations would otherwise lose its chains at every long
prefill), and a stream that stalls has its own timeout. A refused connection or a 5xx
status, both before the first byte, is retried once on another replica; nothing is retried
after the first byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace

from oars.engines.base import Opened
from oars.engines.upstream.client import Pacing, UpstreamEngine, UpstreamOpened
from oars.engines.upstream.config import UpstreamConfig
from oars.errors import UpstreamError
from oars.generation import EngineChunk, EngineRequest

log = logging.getLogger("oars.upstream")

# Why a request went where it did (the `route` label of oars_upstream_requests_total).
CHAIN, PREFIX, BALANCED, RETRIED, ONLY = "chain", "prefix", "balanced", "retried", "only"


@dataclass(eq=False)
class Replica:
    engine: UpstreamEngine
    in_flight: int = 0  # opened or streaming
    healthy: bool = True

    @property
    def name(self) -> str:
        return self.engine.name


@dataclass(frozen=True)
class ReplicaEvent:
    """What the metrics are told: a request routed (`route` set), or a replica ejected or
    readmitted (`health` set)."""

    model: str
    replica: str
    route: str = ""
    health: str = ""


class ReplicaSet:
    """An engine over the replicas of one upstream model (one replica: a plain upstream)."""

    def __init__(self, config: UpstreamConfig, pacing: Pacing | None = None) -> None:
        self.config = config
        self.info = config.info()
        self.replicas = [Replica(UpstreamEngine(config, url, pacing)) for url in config.urls]
        self.observe: Callable[[ReplicaEvent], None] | None = None
        self._checks: asyncio.Task[None] | None = None
        self._learning: asyncio.Task[None] | None = None

    @property
    def busy(self) -> bool:
        return any(r.engine.busy for r in self.replicas)

    def watch(self, observe: Callable[[str, str, float, str | None], None]) -> None:
        """Each replica tells `observe` how long it took to answer, or how it failed."""
        for replica in self.replicas:
            replica.engine.observe = observe

    # ---- choosing --------------------------------------------------------------------------

    def order(self, request: EngineRequest) -> tuple[list[Replica], str]:
        """The replicas to try, the chosen one first, and why it was chosen."""
        up = [r for r in self.replicas if r.healthy] or self.replicas  # none: try them anyway
        least = min(up, key=lambda r: r.in_flight)
        chosen, why = self._preferred(request, up)
        if chosen is None:
            chosen, why = least, BALANCED  # a chain whose replica is out of service
        elif chosen.in_flight - least.in_flight > self.config.imbalance:
            chosen, why = least, BALANCED
        rest = sorted((r for r in up if r is not chosen), key=lambda r: r.in_flight)
        return [chosen, *rest], why

    def _preferred(self, request: EngineRequest, up: list[Replica]) -> tuple[Replica | None, str]:
        if len(self.replicas) == 1:
            return self.replicas[0], ONLY
        follow = request.route.follow
        if follow:
            return next((r for r in up if r.name == follow), None), CHAIN
        key = hashlib.blake2b(
            (request.route.cache_key or prefix_key(request)).encode(), digest_size=16
        ).digest()
        return max(up, key=lambda r: _weight(key, r.name)), PREFIX

    # ---- the Engine protocol ---------------------------------------------------------------

    async def open(self, request: EngineRequest) -> Opened:
        order, why = self.order(request)
        last = len(order) == 1
        for replica in order[:2]:
            replica.in_flight += 1
            try:
                opened = await replica.engine.open(request)
            except UpstreamError as exc:
                replica.in_flight -= 1
                if exc.code == "upstream_unreachable":
                    self._eject(replica, str(exc))
                if last or not exc.retryable:
                    raise
                log.warning("%s: retried on another replica: %s", self.info.id, exc)
                why, last = RETRIED, True
                continue
            except BaseException:
                replica.in_flight -= 1
                raise
            self._tell(ReplicaEvent(self.info.id, replica.name, route=why))
            assert isinstance(opened, UpstreamOpened)
            return opened
        raise AssertionError("unreachable")  # pragma: no cover

    async def generate(self, opened: Opened) -> AsyncIterator[EngineChunk]:
        replica = self._replica(opened.served_by)
        try:
            async for chunk in replica.engine.generate(opened):
                yield chunk
        finally:
            replica.in_flight -= 1

    async def count_tokens(self, request: EngineRequest) -> int:
        replica = self.order(request)[0][0]
        replica.in_flight += 1
        try:
            return await replica.engine.count_tokens(request)
        finally:
            replica.in_flight -= 1

    def _replica(self, name: str) -> Replica:
        return next(r for r in self.replicas if r.name == name)

    # ---- health ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Begin the health checks (several replicas: one alone is always tried), and ask for
        the context window when the configuration does not give it."""
        if len(self.replicas) > 1 and self._checks is None:
            self._checks = asyncio.create_task(self._check_forever(), name=f"health {self.info.id}")
        if self.info.context_length is None and self._learning is None:
            self._learning = asyncio.create_task(self._learn(), name=f"listing {self.info.id}")

    async def _learn(self) -> None:
        """The context window from the first replica whose model listing reports one (in the
        background: a server starts while its upstreams are still loading)."""
        for replica in self.replicas:
            window = await replica.engine.listed_context()
            if window is not None:
                self.info = replace(self.info, context_length=window)
                log.info("%s: context window %d, as its upstream lists it", self.info.id, window)
                return

    async def _check_forever(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(self.config.health_interval)

    async def check(self) -> None:
        """Ask every replica once; eject the ones that fail, readmit the ones that answer."""
        answers = await asyncio.gather(*(r.engine.healthy() for r in self.replicas))
        for replica, ok in zip(self.replicas, answers, strict=True):
            if ok and not replica.healthy:
                replica.healthy = True
                log.info("%s: replica %s is back in service", self.info.id, replica.name)
                self._tell(ReplicaEvent(self.info.id, replica.name, health="readmitted"))
            elif ok is None and not replica.in_flight:
                self._eject(replica, "its health check timed out")
            elif ok is False:
                self._eject(replica, "its health check failed")

    def _eject(self, replica: Replica, why: str) -> None:
        if not replica.healthy or len(self.replicas) == 1:
            return
        replica.healthy = False
        log.warning("%s: replica %s out of service: %s", self.info.id, replica.name, why)
        self._tell(ReplicaEvent(self.info.id, replica.name, health="ejected"))

    def _tell(self, event: ReplicaEvent) -> None:
        if self.observe is not None:
            self.observe(event)

    async def aclose(self) -> None:
        for task in (self._checks, self._learning):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._checks = self._learning = None
        for replica in self.replicas:
            await replica.engine.aclose()


def prefix_key(request: EngineRequest) -> str:
    """What sessions of one agent share at the start of their prompts: the system messages,
    the tools, and the first user message."""
    head: list[str] = []
    for message in request.messages:
        head.append(f"{message.role}\n{message.content}")
        if message.role == "user":
            break
    tools = [t.to_template() for t in request.tools.offered]
    head.append(json.dumps(tools, sort_keys=True, default=str))
    return "\x00".join(head)


def _weight(key: bytes, replica: str) -> int:
    """Rendezvous hashing: each key goes to the replica that weighs most for it."""
    return int.from_bytes(hashlib.blake2b(replica.encode(), key=key, digest_size=8).digest())

"""Prometheus metrics, kept as plain numbers and rendered only when `/metrics` is scraped.

Every figure is changed on the event loop's thread (the HTTP middleware, the runs' producers,
the store and upstream calls), so an update is a dictionary write: no lock per token, no
allocation beyond the first of each label set. `prometheus_client` turns the numbers into its
text format at scrape time, from a registry of the app's own (several apps share a test process).
"""

from __future__ import annotations

import bisect
import inspect
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from oars.store import Store

if TYPE_CHECKING:
    from oars.engines.upstream import ReplicaEvent

Labels = tuple[str, ...]

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
MCP_SERVERS = 64  # distinct `server` label values of the MCP metrics
TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)


@dataclass
class Histogram:
    """Counts per bucket (not cumulative until rendered) and a sum, for each label set."""

    bounds: Sequence[float]
    counts: dict[Labels, list[int]] = field(default_factory=dict)
    sums: dict[Labels, float] = field(default_factory=lambda: defaultdict(float))

    def observe(self, labels: Labels, value: float, times: int = 1) -> None:
        """`times` observations of `value` (a chunk of several tokens: one gap each)."""
        counts = self.counts.get(labels)
        if counts is None:
            counts = self.counts[labels] = [0] * (len(self.bounds) + 1)
        counts[bisect.bisect_left(self.bounds, value)] += times
        self.sums[labels] += value * times

    def family(self, name: str, doc: str, label_names: Sequence[str]) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, doc, labels=label_names)
        for labels, counts in self.counts.items():
            running, buckets = 0, []
            for bound, count in zip([*map(str, self.bounds), "+Inf"], counts, strict=True):
                running += count
                buckets.append((bound, running))
            family.add_metric(list(labels), buckets, self.sums[labels])
        return family


class Metrics:
    """What oars counts. `load` is read at scrape time: model → (running, queued)."""

    def __init__(self, load: Callable[[], dict[str, tuple[int, int]]] | None = None) -> None:
        self.load = load
        self.requests: dict[Labels, int] = defaultdict(int)  # (method, route, status)
        self.request_seconds = Histogram(LATENCY_BUCKETS)  # (method, route)
        self.responses: dict[Labels, int] = defaultdict(int)  # (model, status)
        self.tokens: dict[Labels, int] = defaultdict(int)  # (model, kind)
        self.first_token_seconds = Histogram(LATENCY_BUCKETS)  # (model,)
        self.token_gap_seconds = Histogram(TOKEN_GAP_BUCKETS)  # (model,)
        self.store_seconds = Histogram(LATENCY_BUCKETS)  # (operation,)
        self.upstream_seconds = Histogram(LATENCY_BUCKETS)  # (model, replica) to the first byte
        self.upstream_errors: dict[Labels, int] = defaultdict(int)  # (model, replica, code)
        self.upstream_requests: dict[Labels, int] = defaultdict(int)  # (model, replica, route)
        self.upstream_health: dict[Labels, int] = defaultdict(int)  # (model, replica, change)
        # read at scrape time: (model, replica) → (in flight, in service)
        self.replicas: Callable[[], dict[Labels, tuple[int, bool]]] | None = None
        self.compactions: dict[Labels, int] = defaultdict(int)  # (model, how)
        self.sockets: dict[Labels, int] = defaultdict(int)  # () → connections accepted
        self.socket_requests: dict[Labels, int] = defaultdict(int)  # (outcome,)
        self.mcp_calls: dict[Labels, int] = defaultdict(int)  # (server, outcome)
        self.mcp_seconds = Histogram(LATENCY_BUCKETS)  # (server,)
        self.tools_ignored: dict[Labels, int] = defaultdict(int)  # (type,)
        # read at scrape time: (model,) → (draft tokens verified, accepted)
        self.drafts: Callable[[], dict[Labels, tuple[int, int]]] | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))  # type: ignore[arg-type]

    # ---- what the server reports --------------------------------------------------------

    def request_done(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests[(method, route, str(status))] += 1
        self.request_seconds.observe((method, route), seconds)

    def response_done(self, model: str, status: str, usage: dict[str, Any] | None) -> None:
        self.responses[(model, status)] += 1
        if not usage:
            return
        details = usage.get("input_tokens_details") or {}
        self.tokens[(model, "input")] += usage.get("input_tokens", 0)
        self.tokens[(model, "cached")] += details.get("cached_tokens", 0)
        self.tokens[(model, "output")] += usage.get("output_tokens", 0)

    def compacted(self, model: str, how: str) -> None:
        """A history compacted: by `/v1/responses/compact` (`endpoint`), `context_management`
        (`threshold`) or a `compaction_trigger` input item (`trigger`)."""
        self.compactions[(model, how)] += 1

    def socket_opened(self) -> None:
        self.sockets[()] += 1

    def socket_request(self, outcome: str) -> None:
        """A `response.create` frame: `response` (a response ran) or `error` (an error frame)."""
        self.socket_requests[(outcome,)] += 1

    def mcp_call(self, server: str, outcome: str, seconds: float) -> None:
        """A call to an MCP server's tool ended (`completed` or `failed`). Servers a request
        names are many: past `MCP_SERVERS` of them, the rest count as `other`."""
        known = {labels[0] for labels in self.mcp_seconds.counts}
        if server not in known and len(known) >= MCP_SERVERS:
            server = "other"
        self.mcp_calls[(server, outcome)] += 1
        self.mcp_seconds.observe((server,), seconds)

    def tool_ignored(self, kind: str) -> None:
        """A request sent a tool this server takes and does not run (Codex's `web_search`)."""
        self.tools_ignored[(kind,)] += 1

    def store_call(self, operation: str, seconds: float) -> None:
        self.store_seconds.observe((operation,), seconds)

    def upstream_reply(
        self, model: str, replica: str, seconds: float, code: str | None = None
    ) -> None:
        """An upstream answered (its headers) or failed before answering (`code`)."""
        if code is None:
            self.upstream_seconds.observe((model, replica), seconds)
        else:
            self.upstream_errors[(model, replica, code)] += 1

    def upstream_event(self, event: ReplicaEvent) -> None:
        """A request routed to a replica (and why), or a replica ejected or readmitted."""
        if event.route:
            self.upstream_requests[(event.model, event.replica, event.route)] += 1
        if event.health:
            self.upstream_health[(event.model, event.replica, event.health)] += 1

    def render(self) -> bytes:
        return generate_latest(self.registry)


class TokenClock:
    """One response's time to first token and the gaps between the tokens after it."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        self.metrics, self.labels = metrics, (model,)
        self.started = self.last = self.first_at = time.monotonic()
        self.first = True

    def tokens(self, count: int) -> None:
        if count <= 0:
            return
        now = time.monotonic()
        if self.first:
            self.metrics.first_token_seconds.observe(self.labels, now - self.started)
            self.first, self.first_at = False, now
        else:
            gap = (now - self.last) / count
            self.metrics.token_gap_seconds.observe(self.labels, gap, count)
        self.last = now


def _counter(
    name: str, doc: str, label_names: Sequence[str], values: dict[Labels, int]
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=label_names)
    for labels, value in values.items():
        family.add_metric(list(labels), value)
    return family


class _Collector:
    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.m
        yield _counter(
            "oars_requests",
            "HTTP requests by route and status.",
            ["method", "route", "status"],
            m.requests,
        )
        yield m.request_seconds.family(
            "oars_request_duration_seconds",
            "Time to the end of an HTTP response (a stream's last byte).",
            ["method", "route"],
        )
        yield _counter(
            "oars_responses",
            "Responses by the status they ended with.",
            ["model", "status"],
            m.responses,
        )
        yield _counter(
            "oars_tokens",
            "Input, cached input and output tokens of ended responses.",
            ["model", "kind"],
            m.tokens,
        )
        yield m.first_token_seconds.family(
            "oars_time_to_first_token_seconds",
            "From accepting a request to its first output token.",
            ["model"],
        )
        yield m.token_gap_seconds.family(
            "oars_inter_token_latency_seconds",
            "Time between output tokens of one response.",
            ["model"],
        )
        yield m.store_seconds.family(
            "oars_store_duration_seconds", "Time of one store operation.", ["operation"]
        )
        yield m.upstream_seconds.family(
            "oars_upstream_first_byte_seconds",
            "From sending a request upstream to its response headers.",
            ["model", "replica"],
        )
        yield _counter(
            "oars_upstream_errors",
            "Upstream requests that failed before answering.",
            ["model", "replica", "code"],
            m.upstream_errors,
        )
        yield _counter(
            "oars_upstream_requests",
            "Requests sent to an upstream replica, by why it was chosen: chain (the replica "
            "that served what the request continues), prefix (its prompt's prefix hashes to "
            "it), balanced (the preferred one was busier or out of service), retried (another "
            "refused it before the first byte), only (the model has one).",
            ["model", "replica", "route"],
            m.upstream_requests,
        )
        yield _counter(
            "oars_upstream_health_changes",
            "Replicas taken out of service (ejected) and brought back (readmitted).",
            ["model", "replica", "change"],
            m.upstream_health,
        )
        if m.replicas is not None:
            replicas = m.replicas()
            in_flight = GaugeMetricFamily(
                "oars_upstream_in_flight",
                "Requests open on an upstream replica.",
                labels=["model", "replica"],
            )
            healthy = GaugeMetricFamily(
                "oars_upstream_in_service",
                "1 while an upstream replica is in service, 0 while ejected.",
                labels=["model", "replica"],
            )
            for labels, (flying, up) in replicas.items():
                in_flight.add_metric(list(labels), flying)
                healthy.add_metric(list(labels), int(up))
            yield in_flight
            yield healthy
        yield _counter(
            "oars_compactions",
            "Histories compacted, by how it was asked for.",
            ["model", "how"],
            m.compactions,
        )
        yield _counter(
            "oars_websockets", "WebSocket connections accepted on /v1/responses.", [], m.sockets
        )
        yield _counter(
            "oars_websocket_requests",
            "Frames sent on WebSockets, by outcome: a response ran, or an error frame answered.",
            ["outcome"],
            m.socket_requests,
        )
        yield _counter(
            "oars_mcp_calls",
            "Calls to MCP servers' tools, by server and outcome (completed or failed).",
            ["server", "outcome"],
            m.mcp_calls,
        )
        yield m.mcp_seconds.family(
            "oars_mcp_call_duration_seconds",
            "Time of one call to an MCP server's tool.",
            ["server"],
        )
        yield _counter(
            "oars_tools_ignored",
            "Tools requests sent that this server takes and does not offer the model, by type "
            "(web_search without a search backend).",
            ["type"],
            m.tools_ignored,
        )
        drafts = m.drafts() if m.drafts is not None else {}
        yield _counter(
            "oars_draft_tokens",
            "Tokens drafted from the context and verified (speculative decoding).",
            ["model"],
            {labels: drafted for labels, (drafted, _) in drafts.items()},
        )
        yield _counter(
            "oars_draft_tokens_accepted",
            "Drafted tokens the model's own samples confirmed: each saved a pass of its own.",
            ["model"],
            {labels: accepted for labels, (_, accepted) in drafts.items()},
        )
        running = GaugeMetricFamily(
            "oars_generations_running", "Generations producing tokens.", labels=["model"]
        )
        queued = GaugeMetricFamily(
            "oars_generations_queued",
            "Generations accepted and waiting for the engine.",
            labels=["model"],
        )
        for model, (now, waiting) in (m.load() if m.load else {}).items():
            running.add_metric([model], now)
            queued.add_metric([model], waiting)
        yield running
        yield queued


class TimedStore:
    """A store whose every call is timed (`oars_store_duration_seconds`, by operation)."""

    def __init__(self, store: Store, metrics: Metrics) -> None:
        self.inner, self.metrics = store, metrics

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        async def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.monotonic()
            try:
                return await attr(*args, **kwargs)
            finally:
                self.metrics.store_call(name, time.monotonic() - started)

        return timed


def timed_store(store: Store, metrics: Metrics) -> Store:
    return cast(Store, TimedStore(store, metrics))

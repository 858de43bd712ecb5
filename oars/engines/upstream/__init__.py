"""Upstream engines: OpenAI-compatible chat-completions servers behind the engine seam.

`config` says what an upstream is, `body` writes the request (pure), `chunks` reads the answer
(pure), `client` sends one and streams it back, and `replicas` routes a model's requests among
its servers.
"""

from oars.engines.upstream.client import Pacing, UpstreamEngine
from oars.engines.upstream.config import (
    UpstreamConfig,
    load_upstreams,
    replica_name,
    upstream_arg,
)
from oars.engines.upstream.replicas import (
    BALANCED,
    CHAIN,
    PREFIX,
    ReplicaEvent,
    ReplicaSet,
)

__all__ = [
    "BALANCED",
    "CHAIN",
    "PREFIX",
    "Pacing",
    "ReplicaEvent",
    "ReplicaSet",
    "UpstreamConfig",
    "UpstreamEngine",
    "load_upstreams",
    "replica_name",
    "upstream_arg",
]

"""What an upstream is: the model it serves, its URLs, keys, parsers and timeouts, from the
`--upstream` option or a TOML file of `[[upstream]]` tables.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from oars.engines.base import ModelInfo
from oars.families import THINK_TAGS, Family, make
from oars.generation import MODALITIES


@dataclass(frozen=True)
class UpstreamConfig:
    """One model served by an upstream: one URL, or the URLs of its replicas (`urls`).
    `parse_calls` / `parse_think`: oars' own parsers read the content (for an upstream that
    leaves calls or `<think>` in it unparsed)."""

    model: str  # the name clients ask for
    url: str = ""  # the upstream's base URL, ending in /v1
    urls: tuple[str, ...] = ()  # or its replicas' base URLs
    upstream_model: str | None = None  # the name the upstream knows it by (default: `model`)
    api_key_env: str | None = None  # the environment variable holding its API key
    # https: the CA bundle its certificate is checked by (default: the system's)
    ca_file: str | None = None
    parse_calls: str | None = None  # hermes, qwen3_coder or harmony
    parse_think: bool = False
    # A JSON schema as `{"type": "json_object", "schema": …}` (llama-cpp-python's server takes
    # no `json_schema` response format) instead of OpenAI's `json_schema`.
    schema_in_json_object: bool = False
    modalities: tuple[str, ...] = MODALITIES  # what a request's input may hold
    # What oars cannot learn of the model (for `/v1/models`, and the context for compaction):
    # None is "not known", never a guess. `parse_think` says it reasons.
    context_window: int | None = None
    reasoning: bool | None = None
    connect_timeout: float = 10.0
    first_byte_timeout: float = 300.0  # until the upstream answers (its prefill)
    idle_timeout: float = 120.0  # between two chunks of a stream
    max_connections: int = 512  # per replica
    # Replicas: a chain's or a prefix's replica yields to the least busy one when it has more
    # than `imbalance` requests in flight beyond it; `health_path` (under the base URL) is
    # asked every `health_interval` seconds.
    imbalance: int = 8
    health_path: str = "/models"
    health_interval: float = 5.0

    def __post_init__(self) -> None:
        urls = self.urls or ((self.url,) if self.url else ())
        if not urls:
            raise ValueError(f"the model {self.model!r} needs a url (or urls)")
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{self.model}: expected an http or https URL, got {url!r}")
        unknown = set(self.modalities) - set(MODALITIES)
        if unknown or "text" not in self.modalities:
            raise ValueError(
                f"{self.model}: modalities are text and any of image, file, audio "
                f"(got {', '.join(self.modalities)})"
            )
        window = self.context_window
        if window is not None and (not isinstance(window, int) or window < 1):
            raise ValueError(f"{self.model}: context_window is a number of tokens, got {window!r}")
        object.__setattr__(self, "urls", tuple(urls))
        object.__setattr__(self, "url", urls[0])
        object.__setattr__(self, "modalities", tuple(self.modalities))

    @property
    def family(self) -> Family:
        return make(self.parse_calls, THINK_TAGS if self.parse_think else None)

    def info(self) -> ModelInfo:
        """What oars knows of the model from this configuration."""
        reasoning = True if self.parse_think and self.reasoning is None else self.reasoning
        return ModelInfo(
            self.model,
            context_length=self.context_window,
            owned_by="upstream",
            modalities=self.modalities,
            reasoning=reasoning,
        )

    def headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env, "") if self.api_key_env else ""
        return {"Authorization": f"Bearer {key}"} if key else {}


# Where a server's model listing gives a model's context window (vLLM and SGLang: max_model_len).
_CONTEXT_FIELDS = ("max_model_len", "context_window", "context_length")


def listed_context(listing: Any, name: str) -> int | None:
    """The context window a model listing (`GET …/models`) reports for the model `name`; None
    when it reports none (llama-cpp-python's, OpenAI's own)."""
    data = listing.get("data") if isinstance(listing, dict) else None
    for model in data if isinstance(data, list) else []:
        if not isinstance(model, dict) or model.get("id") != name:
            continue
        for key in _CONTEXT_FIELDS:
            value = model.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def upstream_arg(text: str) -> UpstreamConfig:
    """`MODEL=URL` or `MODEL=URL1,URL2,…` (the `--upstream` option)."""
    model, eq, urls = text.partition("=")
    if not eq or not model or not urls:
        raise ValueError(f"expected MODEL=URL[,URL…] (http or https), got {text!r}")
    return UpstreamConfig(model, urls=tuple(u.strip() for u in urls.split(",") if u.strip()))


def load_upstreams(path: str) -> list[UpstreamConfig]:
    """A TOML file of `[[upstream]]` tables, each with the fields of `UpstreamConfig`."""
    import tomllib

    with open(path, "rb") as f:
        tables = tomllib.load(f).get("upstream", [])
    known = set(UpstreamConfig.__dataclass_fields__)
    configs = []
    for i, table in enumerate(tables):
        unknown = set(table) - known
        if unknown or "model" not in table or not ("url" in table or "urls" in table):
            raise ValueError(
                f"{path}: upstream #{i + 1} needs model and url (or urls) and knows only "
                f"{', '.join(sorted(known))} (got {', '.join(sorted(unknown))})"
            )
        lists = {k: tuple(v) for k, v in table.items() if isinstance(v, list)}
        try:
            configs.append(UpstreamConfig(**{**table, **lists}))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: upstream #{i + 1}: {exc}") from exc
    return configs


def replica_name(url: str) -> str:
    """A replica's URL as it is shown, counted and recorded: without credentials."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=netloc)).rstrip("/")

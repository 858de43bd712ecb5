"""Log lines as text (the default) or as one JSON object per line (`--log-format json`).

The request id of the HTTP request being served is in a context variable, so every line logged
while serving it, including by the run it started (tasks copy the context), carries it. Fields a
line has beyond its message (`response_id`, `model`, `status`, tokens, durations) come from the
`extra` of the logging call and are keys of the JSON object.
"""

from __future__ import annotations

import contextvars
import json
import logging
import time

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)

FIELDS = (
    "response_id",
    "model",
    "status",
    "method",
    "path",
    "input_tokens",
    "cached_tokens",
    "output_tokens",
    "duration_ms",
    "ttft_ms",
)
FORMATS = ("text", "json")
QUIET = ("httpx", "httpx2", "httpcore", "httpcore2", "mcp", "mcp_types")


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in ("request_id", *FIELDS):
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def setup(level: str, fmt: str) -> None:
    """Configure the root logger and uvicorn's (whose access log the server replaces)."""
    handler = logging.StreamHandler()
    handler.addFilter(_RequestIdFilter())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers = []
        logger.propagate = True
    logging.getLogger("uvicorn.access").disabled = True  # oars.access logs each request
    # HTTP clients log every request's URL at INFO, the MCP SDK at DEBUG: a URL a request gave
    # (an MCP server's, query and userinfo included) is the client's secret to keep.
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)

"""The playground: its page and files (shipped in the package, nothing built or fetched), the
latest stored responses, and the stream validator's verdict on a stream it shows."""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import Response

from oars import api
from oars.errors import NotFound
from oars.http.common import JSON, query_int, read_body, store_of
from oars.validator import validate_sse

_TYPES = {
    "html": "text/html; charset=utf-8",
    "js": "text/javascript; charset=utf-8",
    "css": "text/css; charset=utf-8",
    "png": "image/png",
    "svg": "image/svg+xml",
}


def _file(name: str) -> Response:
    suffix = name.rpartition(".")[2]
    path = resources.files("oars") / "static" / name
    if "/" in name or name.startswith(".") or suffix not in _TYPES or not path.is_file():
        raise NotFound(f"No file {name[:100]!r}.", param="name")
    headers = {"Cache-Control": "no-cache"}
    return Response(path.read_bytes(), media_type=_TYPES[suffix], headers=headers)


async def playground(request: Request) -> Response:
    return _file("playground.html")


async def static(request: Request) -> Response:
    return _file(request.path_params["name"])


async def recent(request: Request) -> Response:
    limit = query_int(request, "limit", 20, 1, 100)
    snapshots = await store_of(request).recent(limit=limit)
    return JSON({"object": "list", "data": snapshots})  # stored snapshots: `api.ResponseList`


async def validate(request: Request) -> Response:
    raw = await read_body(request)
    report = validate_sse(raw.decode("utf-8", errors="replace"))
    verdict = api.ValidationReport(
        ok=report.ok,
        violations=[v.describe() for v in report.violations],
        events=len(report.events),
        final=report.final,
    )
    return JSON(verdict.model_dump())

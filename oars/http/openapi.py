"""The OpenAPI 3.1 document, built from the route table and the wire types of `oars.api`.

Each `Endpoint` is one route: the app's routes are made from the same table, so a route cannot
exist without being documented. Schemas come from pydantic (JSON Schema 2020-12, which OpenAPI
3.1 uses as is), generated once for all types so shared definitions appear once.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter
from pydantic.json_schema import JsonSchemaMode
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from oars import __version__, api

Handler = Callable[[Request], Awaitable[Response]]
_REF = "#/components/schemas/{model}"


@dataclass(frozen=True)
class Param:
    name: str
    where: str  # path | query
    schema: dict[str, Any]
    description: str = ""


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    handler: Handler
    summary: str
    tag: str
    body: Any = None  # a type, or a media type string for a raw body
    returns: Any = None  # a type, or a media type string (text, HTML)
    body_media: str = "application/json"  # how a typed body is sent (or multipart/form-data)
    streams: bool = False  # may answer text/event-stream events
    events: Any = api.ResponseStreamEvent  # the type of a streamed event's `data`
    done: bool = False  # the stream ends with `data: [DONE]` (Chat Completions' last line)
    errors: Any = api.ErrorBody  # the type of a 4xx or 5xx answer
    query: Sequence[Param] = ()

    def route(self) -> Route:
        return Route(self.path, self.handler, methods=[self.method])

    @property
    def operation_id(self) -> str:
        return self.handler.__module__.rsplit(".", 1)[-1] + "_" + self.handler.__name__


def _documented(path: str) -> str:
    """A route's path as OpenAPI writes it: `{model:path}` (a name that may hold `/`) is
    `{model}`."""
    return re.sub(r"\{(\w+):\w+\}", r"{\1}", path)


def _path_params(path: str) -> list[Param]:
    names = [part[1:-1] for part in _documented(path).split("/") if part.startswith("{")]
    return [Param(name, "path", {"type": "string"}) for name in names]


def _content(
    kind: Any, schemas: dict[Any, dict[str, Any]], media: str = "application/json"
) -> dict[str, Any]:
    if isinstance(kind, str):
        return {kind: {"schema": {"type": "string"}}}
    return {media: {"schema": schemas[kind]}}


def _operation(e: Endpoint, schemas: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    op: dict[str, Any] = {"operationId": e.operation_id, "summary": e.summary, "tags": [e.tag]}
    params = [*_path_params(e.path), *e.query]
    if params:
        op["parameters"] = [
            {
                "name": p.name,
                "in": p.where,
                "required": p.where == "path",
                "schema": p.schema,
                **({"description": p.description} if p.description else {}),
            }
            for p in params
        ]
    if e.body is not None:
        op["requestBody"] = {
            "required": True,
            "content": _content(e.body, schemas, e.body_media),
        }
    ok: dict[str, Any] = {"description": "OK"}
    if e.returns is not None:
        ok["content"] = _content(e.returns, schemas)
    if e.streams:
        ok["description"] = "OK: JSON, or server-sent events (one JSON event per `data:` line)"
        ok.setdefault("content", {})["text/event-stream"] = {
            "schema": _sse(e.events, schemas, e.done)
        }
    error = {"content": {"application/json": {"schema": schemas[e.errors]}}}
    op["responses"] = {
        "200": ok,
        "4XX": {"description": "The request's fault, naming the parameter", **error},
        "5XX": {"description": "The server's or an upstream's fault", **error},
    }
    return op


def _sse(events: Any, schemas: dict[Any, dict[str, Any]], done: bool) -> dict[str, Any]:
    """One server-sent event, as OpenAPI describes them: `event` names it (where the API names
    its events), `data` holds the event as JSON (`contentSchema`), or with `done` is the last
    line's `[DONE]`."""
    data: dict[str, Any] = {
        "type": "string",
        "contentMediaType": "application/json",
        "contentSchema": schemas[events],
    }
    if done:
        data = {"type": "string", "if": {"const": "[DONE]"}, "else": data}
    return {
        "type": "object",
        "required": ["data"],
        "properties": {"event": {"type": "string"}, "data": data},
    }


def _types(endpoints: Sequence[Endpoint]) -> list[Any]:
    found = [api.ErrorBody, api.ResponseStreamEvent]
    for e in endpoints:
        kinds = (e.body, e.returns, e.events if e.streams else None, e.errors)
        found += [t for t in kinds if t is not None and not isinstance(t, str)]
    return list(dict.fromkeys(found))


def document(endpoints: Sequence[Endpoint]) -> dict[str, Any]:
    types = _types(endpoints)
    inputs: list[tuple[Any, JsonSchemaMode, TypeAdapter[Any]]] = [
        (t, "validation" if _is_request(t, endpoints) else "serialization", TypeAdapter(t))
        for t in types
    ]
    refs, defs = TypeAdapter.json_schemas(inputs, ref_template=_REF)
    schemas = {t: refs[(t, mode)] for t, mode, _ in inputs}
    components = defs.get("$defs", {})
    for kind in (api.ResponseCreateParams, api.InputTokenCountParams):  # oars needs an input
        _require(schemas[kind], components, "input")
    paths: dict[str, dict[str, Any]] = {}
    for e in endpoints:
        paths.setdefault(_documented(e.path), {})[e.method.lower()] = _operation(e, schemas)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "oars",
            "version": __version__,
            "description": "An OpenAI Responses API server for open-weight models.",
        },
        "paths": paths,
        "components": {"schemas": components},
    }


def _require(schema: dict[str, Any], components: dict[str, Any], name: str) -> None:
    """Mark `name` required in an object schema (or each object of a union, by reference)."""
    targets = [schema, *schema.get("anyOf", [])]
    for target in targets:
        ref = target.get("$ref", "")
        target = components[ref.rsplit("/", 1)[-1]] if ref else target
        if name in target.get("properties", {}):
            target["required"] = sorted({*target.get("required", []), name})


def _is_request(kind: Any, endpoints: Sequence[Endpoint]) -> bool:
    return any(e.body is kind for e in endpoints)


_documents: dict[int, bytes] = {}  # by the route table's identity: built once per process


def document_bytes(endpoints: Sequence[Endpoint]) -> bytes:
    key = id(endpoints)
    if key not in _documents:
        _documents[key] = json.dumps(document(endpoints), separators=(",", ":")).encode()
    return _documents[key]


# ---- the docs page: the document as HTML, with nothing fetched from anywhere else -------------


def docs_page(endpoints: Sequence[Endpoint]) -> str:
    doc = json.loads(document_bytes(endpoints))
    rows = []
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            rows.append(_docs_row(method, path, op))
    return _PAGE.format(version=html.escape(__version__), rows="\n".join(rows))


def _docs_row(method: str, path: str, op: dict[str, Any]) -> str:
    params = "".join(
        f"<li><code>{html.escape(p['name'])}</code> ({p['in']}) "
        f"{html.escape(p.get('description', ''))}</li>"
        for p in op.get("parameters", [])
    )
    body = op.get("requestBody", {}).get("content", {})
    answers = op["responses"]["200"].get("content", {})
    return (
        f'<section id="{op["operationId"]}"><h3><span class="m {method}">{method.upper()}</span> '
        f"<code>{html.escape(path)}</code></h3><p>{html.escape(op['summary'])}</p>"
        + (f"<ul>{params}</ul>" if params else "")
        + _schemas("Request body", body)
        + _schemas("Answer", answers)
        + "</section>"
    )


def _schemas(title: str, content: dict[str, Any]) -> str:
    if not content:
        return ""
    parts = []
    for media, entry in content.items():
        schema = json.dumps(entry.get("schema", {}), indent=1)[:4000]
        parts.append(
            f"<details><summary>{html.escape(title)}: <code>{html.escape(media)}</code>"
            f"</summary><pre>{html.escape(schema)}</pre></details>"
        )
    return "".join(parts)


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>oars API {version}</title>
<style>
body {{ font: 15px/1.5 system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem; }}
section {{ border-top: 1px solid #ddd; padding: .5rem 0; }}
.m {{ font: bold 12px monospace; padding: 2px 6px; border-radius: 3px; color: #fff; }}
.get {{ background: #2a7ab0; }} .post {{ background: #2f9e44; }} .delete {{ background: #c92a2a; }}
pre {{ background: #f6f6f6; padding: .5rem; overflow: auto; max-height: 24rem; }}
</style></head><body>
<h1>oars API <small>{version}</small></h1>
<p>The OpenAI Responses API and its stored-state routes, and Chat Completions, served by oars. The whole document:
<a href="/openapi.json">/openapi.json</a> (OpenAPI 3.1). Try it in the <a href="/">playground</a>.</p>
{rows}
</body></html>
"""

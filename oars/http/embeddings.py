"""`POST /v1/embeddings`: texts to vectors, by the server's embedding model."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from oars.embeddings import NoEmbeddingModel, parse_request, response_body
from oars.http.common import JSON, read_json, shared


async def create(request: Request) -> Response:
    embedder = shared(request).embedder
    body = await read_json(request)
    if embedder is None:
        raise NoEmbeddingModel()
    wanted = parse_request(body, embedder.dimensions)
    embedded = await embedder.embed(wanted.texts)
    return JSON(response_body(embedded, wanted, embedder.model))

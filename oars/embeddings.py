"""`/v1/embeddings`: the embedding model (llama.cpp in-process), and the request and answer
in OpenAI's form.

One llama.cpp context with `embedding=True` and mean pooling runs every request, one at a
time, on a thread of its own, so the event loop never waits on it. A request's texts are
batched into forward passes of at most the model's context (512 tokens for MiniLM), as many
texts a pass as fit. A text longer than the context keeps its first tokens, as many as the
context holds (`[CLS]` first; its closing `[SEP]` falls off): llama-cpp-python's rule. A 400
instead would refuse what a client cannot count, as it does not hold this model's tokenizer.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from oars.errors import ClientError, InvalidRequest, SetupError, UpstreamError
from oars.store.base import EmbeddedBy

Vectors = npt.NDArray[np.float32]  # one unit-length row per text
MAX_INPUTS = 2048  # OpenAI's limit on the texts of one request


@dataclass(frozen=True)
class Embedded:
    """What one call embedded: a row per text, and the tokens the model read."""

    vectors: Vectors
    tokens: int


class Embedder(Protocol):
    """An embedding model: texts in, normalised float32 vectors out."""

    @property
    def model(self) -> str: ...

    @property
    def dimensions(self) -> int: ...

    async def embed(self, texts: Sequence[str]) -> Embedded:
        """One unit-length vector per text, in order (off the event loop)."""
        ...

    def close(self) -> None: ...


class LlamaEmbedder:
    """A GGUF embedding model (BERT family) in llama.cpp, on one thread of its own."""

    def __init__(self, path: Path, model: str, *, threads: int | None = None) -> None:
        import llama_cpp

        self._llama = llama_cpp.Llama(
            str(path),
            embedding=True,
            pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
            n_ctx=0,  # the model's own context: the longest text a pass can hold
            n_batch=1 << 16,  # capped at the context
            # every pass is a batch: llama.cpp's default, every core, stalled a pass for a
            # second while the chat engine held a core (`bench.lab.vector_search`)
            n_threads=threads,
            n_threads_batch=threads or max(1, (os.cpu_count() or 2) // 2),
            verbose=False,
        )
        self._model = model
        self._dimensions = int(self._llama.n_embd())
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="oars-embed")

    @property
    def model(self) -> str:
        return self._model

    @property
    def dimensions(self) -> int:
        return self._dimensions

    @property
    def context(self) -> int:
        """The most tokens of one text that are read (the model's trained context)."""
        return int(self._llama.n_batch)

    async def embed(self, texts: Sequence[str]) -> Embedded:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self._embed, list(texts))

    def _embed(self, texts: list[str]) -> Embedded:
        rows, tokens = self._llama.embed(texts, normalize=False, truncate=True, return_count=True)
        return Embedded(unit_rows(np.asarray(rows, dtype=np.float32)), int(tokens))

    def close(self) -> None:
        self._thread.shutdown(wait=True)
        self._llama.close()


UPSTREAM_CHARS = 1_500  # of a text sent to an embedding server (most refuse past their context)


class UpstreamEmbedder:
    """An embedding model another server runs (the gateway's): OpenAI's `/embeddings` at
    `url` (…/v1), the model it knows as `model`, its replicas `urls` tried in turn when one
    cannot be reached. Its dimension is learnt at startup (`probe`) by embedding one word.

    Each text goes as its first `UPSTREAM_CHARS` characters: vLLM and llama.cpp's server refuse
    a text past the model's context (512 tokens for the MiniLM and BGE families), where the
    model in-process keeps the tokens that fit; 1,500 characters of English are about 350 of
    their tokens."""

    def __init__(self, model: str, urls: Sequence[str], *, timeout: float = 300.0) -> None:
        import httpx

        self._model, self.urls = model, tuple(u.rstrip("/") for u in urls)
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10.0))
        self._dimensions = 0

    @property
    def model(self) -> str:
        return self._model

    @property
    def dimensions(self) -> int:
        return self._dimensions

    @classmethod
    def probe(cls, model: str, urls: Sequence[str]) -> UpstreamEmbedder:
        """The embedder, its dimension read from one embedding (a `SetupError` when the
        upstream cannot give one)."""
        import httpx

        async def once(embedder: UpstreamEmbedder) -> Embedded:
            async with httpx.AsyncClient(timeout=30.0) as client:  # (this loop's alone)
                return await embedder._post(["dimensions"], client)

        embedder = cls(model, urls)
        try:
            embedder._dimensions = int(asyncio.run(once(embedder)).vectors.shape[1])
        except UpstreamError as exc:
            raise SetupError(f"--embedding-model {model}: {exc}") from exc
        return embedder

    async def embed(self, texts: Sequence[str]) -> Embedded:
        embedded = await self._post(list(texts))
        if embedded.vectors.shape != (len(texts), self._dimensions):
            raise UpstreamError(
                f"the embedding upstream answered {embedded.vectors.shape[0]} vectors of "
                f"{embedded.vectors.shape[1]} dimensions for {len(texts)} texts of "
                f"{self._dimensions}"
            )
        return embedded

    async def _post(self, texts: list[str], client: Any = None) -> Embedded:
        import httpx

        client = client or self._client
        cut = [text[:UPSTREAM_CHARS] for text in texts]
        body = {"model": self._model, "input": cut, "encoding_format": "float"}
        failure = ""
        for url in self.urls:
            try:
                answer = await client.post(f"{url}/embeddings", json=body)
            except httpx.TransportError as exc:
                failure = f"{url}: {type(exc).__name__}"
                continue
            if answer.status_code != 200:
                raise UpstreamError(
                    f"the embedding upstream {url} answered {answer.status_code}: "
                    f"{answer.text[:300]}"
                )
            try:
                return _embedded(answer.json(), len(texts))
            except ValueError as exc:  # (not JSON: a page of something else at that URL)
                raise UpstreamError(f"the embedding upstream {url} answered no JSON") from exc
        raise UpstreamError(f"no embedding upstream could be reached ({failure})", retryable=True)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):  # (no loop runs: nothing is open)
            self._closing = asyncio.get_running_loop().create_task(self._client.aclose())


def _embedded(answer: Any, count: int) -> Embedded:
    """An upstream's `CreateEmbeddingResponse`, its rows in `index` order."""
    try:
        data = sorted(answer["data"], key=lambda d: d["index"])
        rows = np.asarray([d["embedding"] for d in data], dtype=np.float32)
        tokens = int((answer.get("usage") or {}).get("prompt_tokens") or 0)
    except (KeyError, TypeError, ValueError) as exc:
        raise UpstreamError(f"the embedding upstream's answer is not embeddings: {exc}") from exc
    if rows.ndim != 2 or len(rows) != count:
        raise UpstreamError(f"the embedding upstream answered {len(rows)} rows for {count} texts")
    return Embedded(unit_rows(rows), tokens)


def embedded_by(embedder: Embedder | None) -> EmbeddedBy | None:
    """Which model `embedder`'s vectors are of, as a store records it (None: no model)."""
    return None if embedder is None else EmbeddedBy(embedder.model, embedder.dimensions)


def unit_rows(vectors: Vectors) -> Vectors:
    """Each row scaled to length 1 (a zero row stays zero)."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit: Vectors = (vectors / np.maximum(norms, np.float32(1e-12))).astype(np.float32)
    return unit


def embedding_file(spec: str | None) -> tuple[Path, str] | None:
    """`--embedding-model`: a GGUF and the name it is served as, or None for no model.

    None (unset): the default model when `oars pull` has put it in the cache; `off`: none;
    else a file, or a model in the cache by name."""
    from oars.download import find
    from oars.weights import DEFAULT_EMBEDDING, model_path

    if spec == "off":
        return None
    if spec in (None, "default", DEFAULT_EMBEDDING.name):
        path = model_path(DEFAULT_EMBEDDING)
        if path.is_file():
            return path, DEFAULT_EMBEDDING.name
        if spec is None:
            return None
        raise SetupError(f"--embedding-model {spec}: not in the cache (`oars pull` fetches it)")
    file = Path(spec).expanduser()
    found = file if file.is_file() else find(spec)
    if found is None:
        raise SetupError(f"--embedding-model {spec!r} is neither a file nor a cached model")
    return found, DEFAULT_EMBEDDING.name if found.name == DEFAULT_EMBEDDING.filename else found.stem


# ---- the wire --------------------------------------------------------------------------------


Encoding = Literal["float", "base64"]
_ENCODINGS: dict[str | None, Encoding] = {None: "float", "float": "float", "base64": "base64"}


@dataclass(frozen=True)
class EmbeddingRequest:
    """A `/v1/embeddings` body, validated."""

    texts: tuple[str, ...]
    model: str
    encoding_format: Encoding


def parse_request(body: Any, dimensions: int) -> EmbeddingRequest:
    """The body as OpenAI reads it; what this server cannot honour is a 400 naming it.

    Text only: token arrays are ids of OpenAI's tokenizer, which no local model shares."""
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.", param=None)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required: a string.", param="model")
    raw = body.get("encoding_format")
    encoding = _ENCODINGS.get(raw) if raw is None or isinstance(raw, str) else None
    if encoding is None:
        raise InvalidRequest("'encoding_format' must be 'float' or 'base64'.",
                             param="encoding_format")  # fmt: skip
    wanted = body.get("dimensions")
    if wanted is not None and (type(wanted) is not int or wanted != dimensions):
        raise InvalidRequest(
            f"'dimensions' must be this model's own, {dimensions}: it cannot be shortened.",
            param="dimensions",
        )
    return EmbeddingRequest(_texts(body.get("input")), model, encoding)


def _texts(value: Any) -> tuple[str, ...]:
    texts = (value,) if isinstance(value, str) else value
    if not isinstance(texts, list | tuple) or not texts:
        raise InvalidRequest("'input' must be a string or a non-empty array of strings.",
                             param="input")  # fmt: skip
    if not all(isinstance(t, str) for t in texts):
        raise InvalidRequest(
            "'input' holds something other than strings: token arrays are not accepted here "
            "(they count tokens of OpenAI's tokenizer, not this model's); send the text.",
            param="input",
        )
    if len(texts) > MAX_INPUTS:
        raise InvalidRequest(f"'input' holds {len(texts)} texts; at most {MAX_INPUTS}.",
                             param="input")  # fmt: skip
    if any(not t for t in texts):
        raise InvalidRequest("'input' holds an empty string.", param="input")
    return tuple(texts)


def response_body(embedded: Embedded, request: EmbeddingRequest, model: str) -> dict[str, Any]:
    """A `CreateEmbeddingResponse`: base64 is the vector's float32 bytes, little-endian, as
    OpenAI sends it and its SDK decodes it."""
    data = [
        {"object": "embedding", "index": i, "embedding": _encoded(row, request.encoding_format)}
        for i, row in enumerate(embedded.vectors)
    ]
    usage = {"prompt_tokens": embedded.tokens, "total_tokens": embedded.tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}


def _encoded(row: Vectors, encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(row.astype("<f4").tobytes()).decode("ascii")
    return [float(x) for x in row]


class NoEmbeddingModel(ClientError):
    """The server runs no embedding model."""

    def __init__(self) -> None:
        super().__init__(
            "This server runs no embedding model: `oars pull` fetches the default one, "
            "`--embedding-model PATH|NAME` names another.",
            param="model",
            code="model_not_found",
        )

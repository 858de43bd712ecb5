"""The gateway's embeddings: `--embedding-model MODEL=URL` has another server embed (here
llama-cpp-python's own server, running the default embedding GGUF), for `/v1/embeddings` and
for vector stores, which then search by vectors as with the model in-process."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from oars.embeddings import LlamaEmbedder, UpstreamEmbedder
from oars.errors import SetupError
from oars.weights import DEFAULT_EMBEDDING, pull_embedding
from tests.conftest import files_server, sdk
from tests.model.conftest import _free_port, _stop, _wait_ready

pytestmark = pytest.mark.model

CORPUS = Path(__file__).parents[1] / "fixtures" / "corpus"
NAME = DEFAULT_EMBEDDING.name


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """llama-cpp-python's server embedding with the default model: its base URL (…/v1)."""
    port, log = _free_port(), tmp_path_factory.mktemp("embed") / "server.log"
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(pull_embedding())]
    cmd += ["--model_alias", NAME, "--embedding", "True", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--n_ctx", "512", "--n_threads", "2"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(base, proc, log, path="/v1/models")
        yield f"{base}/v1"
    finally:
        _stop(proc)


def test_the_upstream_embeds_for_the_api_and_for_vector_stores(
    upstream: str, tmp_path: Path
) -> None:
    remote = UpstreamEmbedder.probe(NAME, ["http://127.0.0.1:9/v1", upstream])  # one is down
    assert remote.dimensions == 384
    local = LlamaEmbedder(pull_embedding(), NAME)
    texts = ["A feline rested on the rug.", "The cat sat on the mat."]
    url = f"sqlite:///{tmp_path}/oars.db"
    try:
        with files_server(url, tmp_path / "files", embedder=remote) as base, sdk(base) as client:
            got = client.embeddings.create(model=NAME, input=texts)
            served = np.asarray([d.embedding for d in got.data], np.float32)
            mine = asyncio.run(local.embed(texts)).vectors
            assert np.allclose(served, mine, atol=2e-3)  # the same model, run elsewhere

            ids = [
                client.files.create(file=CORPUS / name, purpose="assistants").id
                for name in ("volcanoes.md", "sourdough.txt", "chess.html")
            ]
            vs = client.vector_stores.create(name="corpus")
            batch = client.vector_stores.file_batches.create_and_poll(
                vs.id, file_ids=ids, poll_interval_ms=20
            )
            assert batch.file_counts.completed == 3
            page = client.vector_stores.search(vs.id, query="homemade loaves leavened naturally")
            assert page.data[0].filename == "sourdough.txt"  # no shared word: by its vector
    finally:
        local.close()


def test_an_upstream_that_cannot_embed_is_refused_at_startup() -> None:
    with pytest.raises(SetupError, match="--embedding-model"):
        UpstreamEmbedder.probe(NAME, ["http://127.0.0.1:9/v1"])

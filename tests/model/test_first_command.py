"""The README's first command as a new user runs it: `make serve` builds a virtual environment
with only what `pip install -e '.[llama]'` brings (no test extra), and the server it starts
answers a streamed request on the default model.

A package that `oars serve` imports but that only the test extra pulls in (as `mcp` once was)
passes every other test here, since they run in the test environment; this one fails. The
environment is made by the Makefile's own rule, so what it checks is what the README promises.
After the first build pip takes the engine from its wheel cache: about a minute."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from oars.validator import validate_sse
from tests.model.conftest import MODEL, _free_port, _wait_ready

pytestmark = pytest.mark.model

REPO = Path(__file__).resolve().parents[2]


def test_make_serve_in_a_fresh_environment_streams_a_response(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    port = _free_port()
    log = tmp_path / "make-serve.log"
    # What a user's shell has, less this suite's environment: nothing of it may leak in.
    environ = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    cmd = [
        *("make", "-C", str(REPO), "serve", f"VENV={venv}"),
        f"SERVE_ARGS=--port {port} --store {tmp_path / 'oars.db'}",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=environ, start_new_session=True
        )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(base, proc, log)
        installed = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.lower()
        assert "pytest==" not in installed, "the fresh environment holds the test extra"
        body = {"model": MODEL, "input": "Say hi", "stream": True, "max_output_tokens": 8}
        response = httpx.post(f"{base}/v1/responses", json=body, timeout=300)
        assert response.status_code == 200, response.text
        report = validate_sse(response.text)
        assert report.ok, report.text()
        final = report.final
        assert final is not None and final["status"] in ("completed", "incomplete"), final
        texts = [part["text"] for item in final["output"] for part in item.get("content") or []]
        assert "".join(texts).strip(), final
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # make and the server it started
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

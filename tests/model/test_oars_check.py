"""`oars check` passes against oars itself on the real model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.model


def test_oars_check_passes_against_oars(server: str) -> None:
    cmd = [sys.executable, "-m", "oars.cli", "check", server, "--model", "default", "--json"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    results = {r["name"]: r for r in json.loads(run.stdout)}
    failed = {n: r for n, r in results.items() if r["status"] == "failed"}
    assert run.returncode == 0 and not failed, failed
    assert results["previous-response-id"]["status"] == "passed"
    assert len(results) == 11

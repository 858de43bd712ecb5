"""/metrics on a real `oars serve`: real requests move the counters and histograms by exactly
what their responses report."""

from __future__ import annotations

import httpx
import pytest

from tests.fast.test_operator import scrape, value
from tests.model.conftest import MODEL, stream

pytestmark = pytest.mark.model


def test_metrics_after_real_requests(server: str) -> None:
    base = server.removesuffix("/v1")
    before = scrape(httpx.get(f"{base}/metrics", timeout=30).text)
    body = {
        "model": MODEL,
        "input": "Count from one to twenty.",
        "max_output_tokens": 12,
        "temperature": 0,
    }
    plain = httpx.post(f"{server}/responses", json=body, timeout=300).json()
    streamed = stream(server, body).final
    assert httpx.post(f"{server}/responses", json={"model": MODEL}, timeout=30).status_code == 400
    after = scrape(httpx.get(f"{base}/metrics", timeout=30).text)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    model = plain["model"]
    usages = [plain["usage"], streamed["usage"]]
    posted = {"method": "POST", "route": "/v1/responses"}
    assert moved("oars_requests_total", **posted, status="200") == 2
    assert moved("oars_requests_total", **posted, status="400") == 1
    assert moved("oars_responses_total", model=model, status="incomplete") == 2  # 12 tokens
    assert moved("oars_tokens_total", model=model, kind="output") == 24
    assert moved("oars_tokens_total", model=model, kind="input") == sum(
        u["input_tokens"] for u in usages
    )
    assert moved("oars_tokens_total", model=model, kind="cached") == sum(
        u["input_tokens_details"]["cached_tokens"] for u in usages
    )
    assert moved("oars_time_to_first_token_seconds_count", model=model) == 2
    assert moved("oars_inter_token_latency_seconds_count", model=model) == 22  # 2 × (12 - 1)
    gaps = moved("oars_inter_token_latency_seconds_sum", model=model)
    assert 0 < gaps < 60
    # one writer transaction at least for each ending (its begin and log may share it or not)
    assert moved("oars_store_duration_seconds_count", operation="write") >= 2
    assert value(after, "oars_generations_running", model=model) == 0

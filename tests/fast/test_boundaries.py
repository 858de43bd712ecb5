"""The bench is a tool beside the server, not a part of its tests: nothing in `tests/` imports
`bench/`, and nothing in `bench/` imports `tests/` or a private name of `oars` (a module, name
or attribute that starts with an underscore). A rename on one side then breaks nothing on the
other. Imports are found at any depth (inside functions, under `if TYPE_CHECKING:`), and the
programs a bench runs with `python -c` are read as Python too."""

from __future__ import annotations

import ast
import contextlib
import functools
import re
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS_MODULE = re.compile(r"^tests(\.\w+)+$")  # what `python -m` would run
BENCH_MODULE = re.compile(r"^bench(\.\w+)+$")


@functools.cache
def _trees(folder: str) -> list[tuple[Path, ast.Module]]:
    return list(_parsed(folder))


def _parsed(folder: str) -> Iterator[tuple[Path, ast.Module]]:
    """Each module of `folder`, and each program embedded in it as a string."""
    for path in sorted((ROOT / folder).rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        yield path, tree
        programs = (
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
        )
        for program in programs:
            if "import " in program and "\n" in program:
                with contextlib.suppress(SyntaxError):
                    yield path, ast.parse(program)


def _imports(tree: ast.Module) -> Iterator[tuple[str, str | None]]:
    """(module, name imported from it) of every absolute import, at any depth."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield from ((node.module, alias.name) for alias in node.names)


def _private(dotted: str) -> bool:
    return any(p.startswith("_") and not p.endswith("__") for p in dotted.split("."))


def _is_module(dotted: str) -> bool:
    """Whether `dotted` names a module of this checkout (by its file: nothing is imported)."""
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _oars_aliases(tree: ast.Module) -> dict[str, str]:
    """Local names bound to a module of `oars` (`import oars.x as y`, `from oars import x`)."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "oars":
                    aliases[alias.asname or alias.name.split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "oars":
            for alias in node.names:
                if _is_module(f"{node.module}.{alias.name}"):
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


def _dotted(node: ast.expr) -> str | None:
    """`a.b.c` for a chain of attributes on a name."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


def _private_uses(tree: ast.Module) -> Iterator[str]:
    """Every private name of `oars` that `tree` imports or reaches through a module of it."""
    for module, name in _imports(tree):
        imported = f"{module}.{name}" if name else module
        if module.split(".")[0] == "oars" and _private(imported):
            yield imported
    aliases = _oars_aliases(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (reached := _dotted(node)):
            head, _, rest = reached.partition(".")
            if head in aliases and _private(rest):
                yield f"{aliases[head]}.{rest}"


def _importers(folder: str, package: str) -> list[str]:
    """Where a module of `folder` imports `package` or one of its modules."""
    return [
        f"{path.relative_to(ROOT)}: imports {module}"
        for path, tree in _trees(folder)
        for module, _ in _imports(tree)
        if module.split(".")[0] == package
    ]


def _namers(folder: str, names: Callable[[str], object]) -> list[str]:
    """Where a module of `folder` has a string that `names` (a module run with `python -m`,
    a path)."""
    return [
        f"{path.relative_to(ROOT)}: names {node.value!r}"
        for path, tree in _trees(folder)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and names(node.value)
    ]


def test_no_test_imports_or_runs_the_bench() -> None:
    assert _importers("tests", "bench") + _namers("tests", BENCH_MODULE.match) == []


def test_no_bench_imports_or_runs_the_tests() -> None:
    def names(text: str) -> bool:
        return bool(TESTS_MODULE.match(text)) or text.startswith("tests/")

    assert _importers("bench", "tests") + _namers("bench", names) == []


def test_no_bench_reaches_a_private_name_of_oars() -> None:
    found = [
        f"{path.relative_to(ROOT)}: {use}"
        for path, tree in _trees("bench")
        for use in _private_uses(tree)
    ]
    assert found == []


def test_the_walk_sees_imports_and_private_uses() -> None:
    """The checks above are not vacuous: the walk finds what they look for."""
    program = (
        "from oars.store.sql import _write\n"
        "from oars.engines import llama\n"
        "def f():\n"
        "    import tests.model.conftest\n"
        "    return llama._Sequence\n"
    )
    tree = ast.parse(program)
    assert ("tests.model.conftest", None) in set(_imports(tree))
    assert set(_private_uses(tree)) == {"oars.store.sql._write", "oars.engines.llama._Sequence"}
    assert any(
        module.startswith("oars.") for _, tree in _trees("bench") for module, _ in _imports(tree)
    )

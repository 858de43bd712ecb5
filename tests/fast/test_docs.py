"""The pages of docs/ against the code: the generated tables are what the code makes now, and
every relative link (README and docs/) reaches a file, and a heading where it names one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from oars import docs

ROOT = Path(__file__).parent.parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_DEFINITION = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
_HTML_ID = re.compile(r"""<a\s+(?:name|id)=["']([^"']+)["']""")


def _prose(text: str) -> str:
    """The page without its code, where a bracket is not a link."""
    return _CODE.sub("", _FENCE.sub("", text))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link counts by its text
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = _FENCE.sub("", page.read_text())
    seen: dict[str, int] = {}
    anchors = set(_HTML_ID.findall(text))
    for heading in _HEADING.findall(text):
        slug = _slug(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _targets(page: Path) -> list[str]:
    text = _prose(page.read_text())
    return [*_LINK.findall(text), *_DEFINITION.findall(text)]


def test_generated_tables_are_current() -> None:
    names = docs.stale(ROOT)
    assert not names, (
        f"generated tables out of date: {', '.join(names)}; "
        f"run `{docs.COMMAND}` from the repository root and commit the result"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path) -> None:
    broken: list[str] = []
    for target in _targets(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {broken}"


def test_a_block_fills_only_between_its_markers() -> None:
    block = docs.Block("page.md", "table", lambda: "| a |\n|---|")
    text = f"before\n{block.begin}\nold\nrows\n{block.end}\nafter\n"
    assert block.fill(text) == f"before\n{block.begin}\n| a |\n|---|\n{block.end}\nafter\n"
    assert block.fill(block.fill(text)) == block.fill(text)


def test_a_page_without_markers_is_an_error() -> None:
    block = docs.Block("page.md", "table", lambda: "")
    with pytest.raises(ValueError, match="markers"):
        block.fill("no markers here\n")


def test_check_names_a_stale_table_and_write_renews_it(tmp_path: Path) -> None:
    block = docs.Block("docs/page.md", "table", lambda: "fresh")
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "page.md"
    page.write_text(f"{block.begin}\nold\n{block.end}\n")
    assert docs.stale(tmp_path, [block]) == ["docs/page.md (table)"]
    assert docs.write(tmp_path, [block]) == ["docs/page.md (table)"]
    assert page.read_text() == f"{block.begin}\nfresh\n{block.end}\n"
    assert docs.stale(tmp_path, [block]) == []


def test_flag_tables_name_every_option_and_its_variable() -> None:
    tables = docs.flag_tables()
    assert "| `--port PORT` | `8000` | `OARS_PORT` |" in tables
    assert "| `--api-keys FILE` |  | `OARS_API_KEYS_FILE` |" in tables
    assert "`--log-format text\\|json`" in tables
    for command in ("serve", "pull", "models", "check", "validate"):
        assert f"### `oars {command}`" in tables

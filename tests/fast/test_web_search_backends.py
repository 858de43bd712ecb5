"""The backends web_search runs through (oars.web_search), against real services on loopback: one
HTTP server speaking SearXNG's, Brave's and Tavily's JSON, failing on purpose under `/fail`,
`/slow` and `/garbage`, and serving pages; and a real MCP server from the `mcp` package. Pages are
opened through the same SSRF guard as request-named MCP servers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from oars.errors import SetupError
from oars.events import Event, ResponseBuilder
from oars.mcp.config import McpConfig, OperatorServer
from oars.serve import web
from oars.settings import WebSettings
from oars.web_run import WebRun
from oars.web_search import (
    KEY_VARIABLE,
    MAX_PAGE_BYTES,
    Found,
    Page,
    WebSearch,
    WebSearchFailed,
    allowed,
    find_in_page,
    web_search,
)
from tests.conftest import free_port, serving

KEY = "sk-test-do-not-echo-4242"
ENV = {KEY_VARIABLE: KEY}
_T = TypeVar("_T")

# ---- the services -------------------------------------------------------------------------------

LISTED = [
    {
        "url": "https://example.org/a",
        "title": "<b>Alpha</b>\n page",
        "body": "The  alpha &amp; more",
    },
    {"url": "javascript:alert(1)", "title": "script", "body": "dropped"},
    {"url": "ftp://example.org/file", "title": "ftp", "body": "dropped"},
    {"title": "no url at all", "body": "dropped"},
    {"url": "https://example.org/b", "title": "Beta", "body": "beta <strong>bold</strong>"},
    {"url": "http://example.org/c", "title": "Gamma", "body": "gamma"},
]
EXPECTED = [
    Found("https://example.org/a", "Alpha page", "The alpha & more"),
    Found("https://example.org/b", "Beta", "beta bold"),
    Found("http://example.org/c", "Gamma", "gamma"),
]

ARTICLE = """<!doctype html><html><head><title>Herons of the Lower Marsh</title></head><body>
<nav><ul><li><a href="/">Menu home</a></li><li><a href="/shop">Menu shop</a></li></ul></nav>
<main><article><h1>Herons of the Lower Marsh</h1>
<p>The grey heron stands motionless in the shallow water of the lower marsh for hours at a time,
waiting for a fish to come within reach of its long and sharp yellow bill.</p>
<p>In spring the herons of the lower marsh build their nests high in the alders along the river,
and the colony has grown every year since the wardens first counted it in 1987.</p>
<p>Visitors are asked to keep to the boardwalk, where a hide gives a view of the colony without
disturbing the birds while they raise their young through the early summer months.</p>
</article></main><footer>Copyright footer text</footer></body></html>"""


def _rows(key: str) -> list[dict[str, Any]]:
    """LISTED, the snippet under `key`."""
    return [{**{k: v for k, v in r.items() if k != "body"}, key: r["body"]} for r in LISTED]


class Services:
    """The loopback HTTP server: what each request asked, and its base URL."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.base = ""

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/{path:path}", self._answer, methods=["GET", "POST"])])

    async def _answer(self, request: Request) -> Response:
        body = await request.body()
        self.seen.append(
            {
                "path": request.url.path,
                "query": dict(request.query_params),
                "headers": dict(request.headers),
                "json": json.loads(body) if body else None,
            }
        )
        first = request.url.path.split("/")[1]
        return await _ROUTES[first](request)


_UNAUTHORIZED = JSONResponse({"error": "bad key"}, status_code=401)


async def _searxng(request: Request) -> Response:
    return JSONResponse({"query": request.query_params["q"], "results": _rows("content")})


async def _brave(request: Request) -> Response:
    if request.headers.get("x-subscription-token") != KEY:
        return _UNAUTHORIZED
    return JSONResponse({"web": {"results": _rows("description")}})


async def _tavily(request: Request) -> Response:
    if request.headers.get("authorization") != f"Bearer {KEY}":
        return _UNAUTHORIZED
    return JSONResponse({"results": _rows("content")})


async def _fail(request: Request) -> Response:
    return PlainTextResponse(
        f"internal error, key {KEY}", status_code=int(request.url.path.split("/")[2])
    )


async def _slow(request: Request) -> Response:
    for _ in range(200):  # until the client gives up
        if await request.is_disconnected():
            break
        await asyncio.sleep(0.05)
    return JSONResponse({"results": []})


async def _garbage(request: Request) -> Response:
    return PlainTextResponse("this is not JSON {")


async def _shape(request: Request) -> Response:
    return JSONResponse({"results": "not a list", "web": {"results": 7}})


async def _page(request: Request) -> Response:
    return Response(ARTICLE, media_type="text/html; charset=utf-8")


async def _plain(request: Request) -> Response:
    return PlainTextResponse("line one\nline two about herons\n")


async def _big(request: Request) -> Response:
    return PlainTextResponse("a" * (MAX_PAGE_BYTES + 2**20))


async def _image(request: Request) -> Response:
    return Response(b"\x89PNG\r\n\x1a\n" + bytes(64), media_type="image/png")


async def _ok(request: Request) -> Response:
    """Under the prefix the tests allow: a page, and redirects within and beyond it."""
    rest = request.url.path.split("/", 2)[2]
    if rest == "page":
        return await _page(request)
    if rest == "go":
        return RedirectResponse("/ok/page", status_code=302)
    if rest == "jump":  # same host, outside the allowed prefix: the guard's to judge
        return RedirectResponse("/private/secret", status_code=302)
    if rest == "away":  # to the same page on another host name
        return RedirectResponse(str(request.url.replace(hostname="127.0.0.1", path="/page")))
    if rest == "broken":  # a Location that is no URL
        return Response(status_code=302, headers={"location": "http://[::1/"})
    if rest.startswith("hop/"):
        return RedirectResponse(f"/ok/hop/{int(rest[4:]) + 1}", status_code=302)
    return PlainTextResponse("no such page", status_code=404)


_ROUTES: dict[str, Callable[[Request], Awaitable[Response]]] = {
    "searxng": _searxng,
    "brave": _brave,
    "tavily": _tavily,
    "fail": _fail,
    "slow": _slow,
    "garbage": _garbage,
    "shape": _shape,
    "page": _page,
    "plain": _plain,
    "big": _big,
    "image": _image,
    "ok": _ok,
    "private": _page,
}


@pytest.fixture(scope="module")
def services() -> Iterator[Services]:
    running = Services()
    with serving(running.app()) as base:
        running.base = base
        yield running


def _run(make: Callable[[], WebSearch], use: Callable[[WebSearch], Awaitable[_T]]) -> _T:
    """`use` on a fresh WebSearch, in a loop of its own, closed after."""

    async def go() -> _T:
        search = make()
        try:
            return await use(search)
        finally:
            await search.aclose()

    return asyncio.run(go())


def _search(spec: str, count: int = 2, timeout: float = 10.0, **how: Any) -> list[Found]:
    return _run(
        lambda: web_search(spec, env=ENV, timeout=timeout),
        lambda search: search.search("grey herons", count, **how),
    )


# ---- the HTTP search APIs -----------------------------------------------------------------------


def test_searxng_maps_its_results_and_drops_what_is_not_http(services: Services) -> None:
    assert _search(f"searxng={services.base}/searxng", count=3) == EXPECTED
    asked = services.seen[-1]
    assert asked["path"] == "/searxng/search"
    assert asked["query"] == {"q": "grey herons", "format": "json"}


def test_searxng_takes_a_url_that_already_ends_in_search(services: Services) -> None:
    assert _search(f"searxng={services.base}/searxng/search/", count=1) == EXPECTED[:1]
    assert services.seen[-1]["path"] == "/searxng/search"


def test_brave_sends_the_key_count_and_country(services: Services) -> None:
    found = _search(f"brave={services.base}/brave", count=2, location={"country": "DE"})
    assert found == EXPECTED[:2]
    asked = services.seen[-1]
    assert asked["query"] == {"q": "grey herons", "count": "2", "country": "DE"}
    assert asked["headers"]["x-subscription-token"] == KEY


def test_tavily_posts_the_query_with_the_key_as_a_bearer_token(services: Services) -> None:
    assert _search(f"tavily={services.base}/tavily", count=5) == EXPECTED
    asked = services.seen[-1]
    assert asked["json"] == {"query": "grey herons", "max_results": 5}
    assert asked["headers"]["authorization"] == f"Bearer {KEY}"


def test_searxng_is_never_sent_the_key(services: Services) -> None:
    _search(f"searxng={services.base}/searxng")
    assert KEY not in json.dumps(services.seen[-1])


@pytest.mark.parametrize("kind", ["searxng", "brave", "tavily"])
@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("/fail/500", "the search backend answered HTTP 500"),
        ("/fail/401", "the search backend answered HTTP 401"),
        ("/garbage", "the search backend's answer is not JSON"),
        ("/shape", "the search backend's answer holds no list of results"),
        ("/slow", "the search backend did not answer within 0.5 s"),
    ],
)
def test_a_failing_backend_is_a_short_message_without_the_key(
    services: Services, kind: str, where: str, message: str
) -> None:
    with pytest.raises(WebSearchFailed) as failed:
        _search(f"{kind}={services.base}{where}", timeout=0.5)
    assert str(failed.value) == message
    assert KEY not in repr(failed.value) and failed.value.__cause__ is None


def test_a_backend_nobody_answers_at_is_a_failure_not_a_hang() -> None:
    with pytest.raises(WebSearchFailed, match="could not reach the search backend"):
        _search(f"brave=http://127.0.0.1:{free_port()}/search", timeout=5)


# ---- a tool on an MCP server --------------------------------------------------------------------

finder = MCPServer("finder")


@finder.tool()
def search(query: str, max_results: int, country: str = "") -> list[dict[str, str]]:
    """Search the finder's index: one object per result (one content block each)."""
    first = {
        "url": "https://finder.test/1",
        "title": f"<i>{query}</i>",
        "snippet": f"max {max_results} in {country}",
    }
    rest = [{"url": "javascript:void(0)", "title": "x", "content": "dropped"}]
    rest += [
        {"url": f"https://finder.test/{i}", "title": f"r{i}", "description": "more"}
        for i in range(2, 9)
    ]
    return [first, *rest]


@finder.tool()
def lookup(query: str) -> str:
    """The finder's answer as plain text."""
    return f"The answer to {query!r} is 42."


@finder.tool()
def wrapped(query: str) -> str:
    """Results as one JSON object with `results`."""
    return json.dumps({"results": [{"url": "https://finder.test/w", "title": "W", "content": "w"}]})


@finder.tool()
def broken(query: str) -> str:
    """A search that always fails."""
    raise ToolError("the index is offline")


@pytest.fixture(scope="module")
def mcp_config() -> Iterator[McpConfig]:
    with serving(finder.streamable_http_app()) as base:
        yield McpConfig.of([OperatorServer("finder", url=f"{base}/mcp")])


def _mcp_search(config: McpConfig, target: str, count: int = 3, **how: Any) -> list[Found]:
    return _run(
        lambda: web_search(f"mcp={target}", mcp=config, env={}),
        lambda s: s.search("grey herons", count, **how),
    )


def test_an_mcp_tool_s_json_results_are_mapped_and_cut_to_count(mcp_config: McpConfig) -> None:
    found = _mcp_search(
        mcp_config, "finder", count=3, location={"type": "approximate", "country": "FR"}
    )
    assert found == [
        Found("https://finder.test/1", "grey herons", "max 3 in FR"),
        Found("https://finder.test/2", "r2", "more"),
        Found("https://finder.test/3", "r3", "more"),
    ]


def test_an_mcp_tool_s_object_of_results_is_mapped(mcp_config: McpConfig) -> None:
    assert _mcp_search(mcp_config, "finder:wrapped") == [Found("https://finder.test/w", "W", "w")]


def test_an_mcp_tool_s_plain_text_is_one_result_without_a_url(mcp_config: McpConfig) -> None:
    found = _mcp_search(mcp_config, "finder:lookup")
    assert found == [Found("", "", "The answer to 'grey herons' is 42.")]


def test_an_mcp_tool_that_fails_or_is_missing_is_a_failure(mcp_config: McpConfig) -> None:
    with pytest.raises(WebSearchFailed, match="the index is offline"):
        _mcp_search(mcp_config, "finder:broken")
    with pytest.raises(WebSearchFailed, match="no tool 'absent'"):
        _mcp_search(mcp_config, "finder:absent")


# ---- opening pages ------------------------------------------------------------------------------


def _open(url: str, max_chars: int = 10_000, **how: Any) -> Page:
    return _run(
        lambda: web_search("searxng=http://127.0.0.1:1", **how),
        lambda s: s.open_page(url, max_chars),
    )


def _failure(url: str, **how: Any) -> str:
    with pytest.raises(WebSearchFailed) as failed:
        _open(url, **how)
    return str(failed.value)


def test_a_page_s_main_text_and_title_without_its_menu(services: Services) -> None:
    page = _open(f"{services.base}/page", allow=[services.base])
    assert page.url == f"{services.base}/page"
    assert page.title == "Herons of the Lower Marsh"
    assert "waiting for a fish to come within reach" in page.text
    assert "the colony has grown every year" in page.text
    assert "Menu shop" not in page.text and "<p>" not in page.text


def test_a_page_is_cut_to_max_chars(services: Services) -> None:
    whole = _open(f"{services.base}/page", allow=[services.base]).text
    assert _open(f"{services.base}/page", 60, allow=[services.base]).text == whole[:60]


def test_plain_text_is_read_as_it_is(services: Services) -> None:
    page = _open(f"{services.base}/plain", allow=[services.base])
    assert (page.title, page.text) == ("", "line one\nline two about herons\n")


def test_a_body_past_the_size_limit_is_cut(services: Services) -> None:
    page = _open(f"{services.base}/big", 10 * MAX_PAGE_BYTES, allow=[services.base])
    assert page.text == "a" * MAX_PAGE_BYTES


def test_a_redirect_within_the_allowed_prefix_is_followed(services: Services) -> None:
    page = _open(f"{services.base}/ok/go", allow=[f"{services.base}/ok/"])
    assert page.url == f"{services.base}/ok/page" and page.title == "Herons of the Lower Marsh"


def test_a_loopback_page_is_refused_unless_the_operator_allows_it(services: Services) -> None:
    message = _failure(f"{services.base}/page")
    assert message.startswith(f"{services.base}/page is not on a public address")
    assert "--web-allow" in message


def test_a_redirect_beyond_the_allowed_prefix_is_refused(services: Services) -> None:
    message = _failure(f"{services.base}/ok/jump", allow=[f"{services.base}/ok/"])
    assert "is not on a public address" in message and "/private" not in message


def test_redirects_stop_after_five(services: Services) -> None:
    message = _failure(f"{services.base}/ok/hop/0", allow=[f"{services.base}/ok/"])
    assert message == f"{services.base}/ok/hop/0 redirects more than 5 times"


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/image", "/image is not a page oars can read (content type image/png)"),
        ("/ok/missing", "/ok/missing answered HTTP 404"),
        ("/slow", "/slow did not load within 0.5 s"),
    ],
)
def test_what_cannot_be_read_is_a_failure_naming_the_url(
    services: Services, path: str, message: str
) -> None:
    assert (
        _failure(f"{services.base}{path}", allow=[services.base], timeout=0.5)
        == f"{services.base}{message}"
    )


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.org/x", "not a url"])
def test_only_http_urls_are_opened(url: str) -> None:
    assert _failure(url) == f"{url} does not lead to an http or https URL"


def test_a_url_that_urllib_cannot_split_is_a_failure_not_a_crash(services: Services) -> None:
    """`http://[::1` (a bracket never closed) makes urllib raise: the model's call fails."""
    assert _failure("http://[::1") == "http://[::1 does not lead to an http or https URL"
    assert not allowed("http://[::1", ["example.org"])
    broken = f"{services.base}/ok/broken"
    assert _failure(broken, allow=[services.base]) == f"could not load {broken} (not a valid URL)"


def test_a_redirect_off_the_allowed_domains_is_a_failed_call(services: Services) -> None:
    """`filters.allowed_domains` hold for the page a redirect leads to, not only the URL the
    model asked for."""
    local = services.base.replace("127.0.0.1", "localhost")

    async def go(search: WebSearch) -> tuple[list[Event], dict[str, str]]:
        run = WebRun(search, {}, domains=("localhost",))
        asked = json.dumps({"url": f"{local}/ok/away"})
        events = [e async for e in run.run(ResponseBuilder({}, model="m"), "open_page", asked)]
        return events, run.read

    events, read = _run(
        lambda: web_search("searxng=http://127.0.0.1:1", allow=[services.base, local]), go
    )
    assert events[-1]["item"]["status"] == "failed"
    assert list(read.values()) == [
        f"Error: {local}/ok/away leads to a page not on a domain this search may read"
    ]


def test_a_server_that_opens_no_pages_says_so(services: Services) -> None:
    message = _failure(f"{services.base}/page", allow=[services.base], fetch=False)
    assert message == "this server does not open pages"


def test_a_host_that_does_not_resolve_is_a_failure() -> None:
    assert (
        _failure("http://no-such-host.invalid/")
        == "could not load http://no-such-host.invalid/ (its host name does not resolve)"
    )


# ---- find_in_page and allowed -------------------------------------------------------------------

TEXT = "Herons wait.\nThe Grey   Heron stands still.\n" + "filler " * 100 + "A grey heron flies."


def test_find_in_page_gives_each_passage_with_context() -> None:
    found = find_in_page(TEXT, "grey heron")
    assert found.startswith("2 matches of 'grey heron':")
    assert "The Grey   Heron stands still." in found and "A grey heron flies." in found


def test_find_in_page_matches_across_line_breaks_and_keeps_to_its_limit() -> None:
    assert "wait.\nThe" in find_in_page(TEXT, "WAIT. the")
    assert len(find_in_page(TEXT * 50, "heron", limit=300)) == 300


def test_find_in_page_says_when_nothing_is_found() -> None:
    assert find_in_page(TEXT, "egret") == "'egret' is not on this page."
    assert find_in_page(TEXT, "  ") == "Nothing to find: the pattern is empty."


@pytest.mark.parametrize(
    ("url", "domains", "expected"),
    [
        ("https://example.com/a", [], True),
        ("https://example.com/a", ["example.com"], True),
        ("https://docs.Example.COM/a", ["example.com"], True),
        ("https://example.com/a", ["www.example.com"], True),
        ("https://api.example.com/a", ["WWW.Example.com"], True),
        ("https://example.com./a", ["https://example.com/"], True),
        ("https://evilexample.com/a", ["example.com"], False),
        ("https://example.com.evil.org/a", ["example.com"], False),
        ("https://example.org/a", ["example.com", "example.net"], False),
        ("not a url", ["example.com"], False),
        ("https://example.com/a", [""], False),
    ],
)
def test_allowed_domains_take_subdomains_and_nothing_that_merely_ends_alike(
    url: str, domains: list[str], expected: bool
) -> None:
    assert allowed(url, domains) is expected


# ---- configuration ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    ["bogus", "searxng", "searxng=", "searxng=ftp://x", "brave=not a url", "bing=http://x", "mcp="],
)
def test_a_spec_that_is_not_kind_equals_target_is_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="--web-search: expected searxng=URL"):
        web_search(spec, env=ENV)


@pytest.mark.parametrize("kind", ["brave", "tavily"])
def test_a_keyed_api_without_its_key_is_refused_naming_the_variable(kind: str) -> None:
    with pytest.raises(ValueError, match=KEY_VARIABLE):
        web_search(f"{kind}=https://api.example.com/search", env={})


def test_an_mcp_backend_names_a_configured_server() -> None:
    with pytest.raises(ValueError, match="no MCP server is labelled 'ghost'"):
        web_search("mcp=ghost", mcp=McpConfig())
    config = McpConfig.of([OperatorServer("finder", url="http://10.0.0.5/mcp")])
    assert _run(lambda: web_search("mcp=finder:find", mcp=config), _name) == "mcp"


def test_an_allowed_prefix_must_be_a_url() -> None:
    with pytest.raises(ValueError, match="--web-allow"):
        web_search("searxng=http://127.0.0.1:8888", allow=["127.0.0.1"])


@pytest.mark.parametrize("kind", ["searxng", "brave", "tavily"])
def test_each_kind_names_its_backend(kind: str) -> None:
    assert _run(lambda: web_search(f"{kind}=http://127.0.0.1:8888", env=ENV), _name) == kind


async def _name(search: WebSearch) -> str:
    return search.backend_name


def test_serve_builds_no_search_without_the_flag_and_refuses_a_bad_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(KEY_VARIABLE, raising=False)
    assert web(WebSettings(), McpConfig()) is None
    with pytest.raises(SetupError, match="--web-search"):
        web(WebSettings(search="bogus"), McpConfig())
    with pytest.raises(SetupError, match=KEY_VARIABLE):
        web(WebSettings(search="brave=https://api.example.com/x"), McpConfig())

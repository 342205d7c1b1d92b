"""The dashboard's pieces that need no database: display, filters, tokens, guards, credentials.

The app is built on an engine that is never connected (nothing here reaches a page's reads):
what is refused is refused before any SQL, and the security headers, the authorize hook and
the CLI's credentials are checked on their own.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from sa_jobqueue.database import create_engine
from sa_jobqueue.errors import InvalidJobError, WebConfigError
from sa_jobqueue.web import create_app
from sa_jobqueue.web._display import (
    CHART_HEIGHT,
    MAX_INDENT_DEPTH,
    chart,
    cut_note,
    json_text,
    minute_chart,
    relative,
    visible,
)
from sa_jobqueue.web._filters import PAGE, JobFilter, finished_statuses, read_filter
from sa_jobqueue.web._serve import CredentialsGate, UnderPrefix, basic_credentials, listen
from sa_jobqueue.web._tokens import CSRF_COOKIE, CSRF_FIELD, Signer
from tests.helpers.pages import LOCAL

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
ACTION_ROUTES = ("/jobs/1/retry", "/jobs/1/cancel", "/jobs/retry", "/purge")


@pytest.fixture
def unconnected() -> Iterator[sa.Engine]:
    """An engine on a port nobody listens on: any page that reached the database would fail."""
    engine = create_engine("postgresql://nobody@127.0.0.1:9/nothing")
    yield engine
    engine.dispose()


# -- display ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain", "plain"),
        ("tab\tand\nnewline", "tab\tand\nnewline"),
        ("bell\x07 escape\x1b[31m", "bell\\x07 escape\\x1b[31m"),
        ("del\x7f c1\x85", "del\\x7f c1\\x85"),
        ("right-to-left\u202eoverride", "right-to-left\\u202eoverride"),
    ],
)
def test_control_characters_are_made_visible(text: str, shown: str) -> None:
    assert visible(text) == shown


def test_non_strings_pass_through_visible() -> None:
    assert visible(3) == 3
    assert visible(None) is None


def test_relative_times_read_from_the_database_clock() -> None:
    assert relative(NOW - timedelta(minutes=3, seconds=12), NOW) == "3m12s ago"
    assert relative(NOW + timedelta(seconds=5), NOW) == "in 5.0s"
    assert relative(NOW, NOW) == "now"
    assert relative(None, NOW) == "-"


def test_whole_shallow_json_is_indented_and_cut_or_deep_json_is_shown_as_written() -> None:
    assert json_text('{"a": [1, 2]}', 13) == '{\n  "a": [\n    1,\n    2\n  ]\n}'
    cut = '{"a": "xxxx'
    assert json_text(cut, 1000) == cut
    deep = "[" * (MAX_INDENT_DEPTH + 1) + "]" * (MAX_INDENT_DEPTH + 1)
    assert json_text(deep, len(deep)) == deep
    brackets_in_strings = json.dumps({"s": "[[[[" * 100})
    assert json_text(brackets_in_strings, len(brackets_in_strings)).startswith("{\n")


def test_cut_note_says_how_much_is_shown() -> None:
    assert cut_note("x" * 10, 1_000_000) == "first 10 of 1,000,000 characters"
    assert cut_note("x" * 10, 10) == ""


def test_chart_stacks_each_minute_and_scales_to_the_busiest() -> None:
    bars = chart({"succeeded": [0, 3, 6], "dead": [0, 1, 0]}, scale=6)
    assert [(b.x, b.status, b.count, b.minutes_ago) for b in bars] == [
        (4, "succeeded", 3, 1),
        (4, "dead", 1, 1),
        (8, "succeeded", 6, 0),
    ]
    full = bars[2]
    assert (full.y, full.height) == (0.0, CHART_HEIGHT)
    assert bars[1].y + bars[1].height == bars[0].y  # the dead part sits on the succeeded one
    assert chart({"succeeded": [0, 0]}, scale=0) == []


def test_the_minute_chart_draws_the_same_bars_as_one_path_per_status() -> None:
    per_minute = {"succeeded": [0, 3, 6], "dead": [0, 1, 0], "cancelled": [0, 0, 0]}
    svg = str(minute_chart(per_minute, scale=6))
    paths = {s: d for d, s in re.findall(r'<path d="([^"]*)" class="bar-(\w+)">', svg)}
    assert set(paths) == {"succeeded", "dead"}  # no path for a status with no jobs
    drawn = {
        (status, float(x), float(y), float(h))
        for status, d in paths.items()
        for x, y, h in re.findall(r"M(\d+) ([\d.]+)h3v([\d.]+)h-3z", d)
    }
    bars = chart(per_minute, scale=6)
    assert drawn == {(b.status, b.x, b.y, b.height) for b in bars}
    assert "<title>9 succeeded in the last hour</title>" in svg
    assert minute_chart({"succeeded": [0, 0]}, scale=0).count("<path") == 0


# -- filters ---------------------------------------------------------------------------------


def test_a_filter_from_query_parameters() -> None:
    wanted = read_filter(
        {"queue": "emails", "task": "<b>odd</b>", "older_than": "2h", "order": "oldest"},
        ["dead", "dead", ""],
    )
    assert wanted == JobFilter(
        queue="emails",
        task="<b>odd</b>",
        statuses=("dead",),
        older_than=timedelta(hours=2),
        order="oldest",
    )
    assert wanted.within == "dead"
    assert wanted.query(after=7) == {
        "queue": "emails",
        "task": "<b>odd</b>",
        "status": ["dead"],
        "older_than": "2h",
        "order": "oldest",
        "after": "7",
    }
    assert read_filter({}, []) == JobFilter()
    assert read_filter({}, ["queued", "running"]).within == "live"
    assert read_filter({}, ["queued", "dead"]).within is None
    assert JobFilter().limit == PAGE


@pytest.mark.parametrize(
    ("params", "statuses", "message"),
    [
        ({}, ["finished"], "unknown status 'finished'"),
        ({"order": "random"}, [], "order must be"),
        ({"after": "x"}, [], "after must be a whole number"),
        ({"after": "-1"}, [], "after must be a job id"),
        ({"after": str(2**63)}, [], "after must be a job id"),
        ({"after": "1", "before": "2"}, [], "not both"),
        ({"limit": "0"}, [], "limit must be from 1"),
        ({"older_than": "soon"}, [], "not a duration"),
        ({"queue": "q" * 65}, [], "queue name is 1 to 64"),
        ({"task": "t" * 201}, [], "task name is 1 to 200"),
    ],
)
def test_bad_filters_are_refused_with_what_is_wrong(
    params: dict[str, str], statuses: list[str], message: str
) -> None:
    with pytest.raises(InvalidJobError, match=message):
        read_filter(params, statuses)


def test_only_finished_statuses_can_be_purged() -> None:
    assert finished_statuses(["dead", "succeeded"]) == ["dead", "succeeded"]
    with pytest.raises(InvalidJobError, match="not queued"):
        finished_statuses(["queued"])
    with pytest.raises(InvalidJobError, match="unknown status"):
        finished_statuses([])


# -- tokens ----------------------------------------------------------------------------------


def test_csrf_token_must_be_signed_and_equal_to_the_cookie() -> None:
    signer = Signer(b"k" * 32)
    token = signer.new_token()
    assert signer.form_accepted(token, token)
    assert not signer.form_accepted(token, signer.new_token())  # another browser's
    assert not signer.form_accepted(token, None)
    assert not signer.form_accepted(None, token)
    nonce, _ = token.split(".")
    forged = f"{nonce}.{'A' * 43}"
    assert not signer.form_accepted(forged, forged)  # planted cookie, matching form field
    assert not Signer(b"other" * 8).form_accepted(token, token)


def test_flash_messages_are_signed() -> None:
    signer = Signer(b"k" * 32)
    assert signer.read_flash(signer.flash(True, "job 3 is queued again")) == (
        True,
        "job 3 is queued again",
    )
    body = base64.urlsafe_b64encode(json.dumps([True, "forged"]).encode()).decode()
    assert signer.read_flash(f"{body}.{signer.sign('flash', 'other')}") is None
    assert signer.read_flash("garbage") is None
    for n in range(4):  # every length of base64 padding: none is kept, the value needs no quotes
        value = signer.flash(False, "x" * n)
        assert "=" not in value
        assert signer.read_flash(value) == (False, "x" * n)


# -- the app's guards, before any page reads ---------------------------------------------------


def test_every_response_carries_the_security_headers(unconnected: sa.Engine) -> None:
    with TestClient(create_app(unconnected), base_url=LOCAL) as client:
        response = client.get("/static/dashboard.css")
    assert response.status_code == 200
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy
    assert "frame-ancestors 'none'" in policy
    assert response.headers["x-content-type-options"] == "nosniff"
    # No Referer to other sites; and not "no-referrer", under which a browser posts the
    # dashboard's own forms with "Origin: null", which the origin check refuses.
    assert response.headers["referrer-policy"] == "same-origin"


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_authorize_refusing_answers_403_for_pages_and_actions(
    unconnected: sa.Engine, kind: str
) -> None:
    seen: list[str] = []

    def deny(request: Request) -> bool:
        seen.append(request.url.path)
        return False

    async def adeny(request: Request) -> bool:
        return deny(request)

    app = create_app(unconnected, allow_actions=True, authorize=deny if kind == "sync" else adeny)
    with TestClient(app, base_url=LOCAL) as client:
        for path in ("/", "/jobs", "/static/dashboard.js"):
            assert client.get(path).status_code == 403
        assert client.post("/jobs/1/retry").status_code == 403
    assert seen == ["/", "/jobs", "/static/dashboard.js", "/jobs/1/retry"]


@pytest.mark.parametrize("path", ACTION_ROUTES)
def test_with_actions_off_every_action_is_refused(unconnected: sa.Engine, path: str) -> None:
    with TestClient(create_app(unconnected), base_url=LOCAL) as client:
        response = client.post(path, data={CSRF_FIELD: "x"})
    assert response.status_code == 403
    assert "actions are off" in response.text


@pytest.mark.parametrize("path", ACTION_ROUTES)
def test_a_post_without_the_csrf_token_is_refused(unconnected: sa.Engine, path: str) -> None:
    signer_token = Signer(b"s" * 32).new_token()
    with TestClient(
        create_app(unconnected, allow_actions=True, secret=b"s" * 32), base_url=LOCAL
    ) as client:
        client.cookies.set(CSRF_COOKIE, signer_token)
        missing = client.post(path, data={})
        other = client.post(path, data={CSRF_FIELD: Signer(b"s" * 32).new_token()})
    for response in (missing, other):
        assert response.status_code == 403
        assert "security token" in response.text


def test_actions_answer_get_with_405(unconnected: sa.Engine) -> None:
    with TestClient(create_app(unconnected, allow_actions=True), base_url=LOCAL) as client:
        assert client.get("/jobs/1/retry").status_code == 405


# -- host names and origins ------------------------------------------------------------------


def test_by_default_only_localhost_names_are_answered(unconnected: sa.Engine) -> None:
    app = create_app(unconnected)
    for base, status in [
        ("http://localhost:8080", 200),
        ("http://127.0.0.1", 200),
        ("http://[::1]:8080", 200),
        ("http://evil.example:8080", 400),
        ("http://127.0.0.1.evil.example", 400),
    ]:
        with TestClient(app, base_url=base) as client:
            assert client.get("/static/dashboard.css").status_code == status, base


def test_allowed_hosts_of_a_mounted_dashboard(unconnected: sa.Engine) -> None:
    host = Starlette()
    host.mount("/jobs", create_app(unconnected, allowed_hosts=["jobs.example.com", "*.internal"]))
    for base, status in [
        ("http://jobs.example.com", 200),
        ("https://JOBS.example.com:8443", 200),
        ("http://ops.internal", 200),
        ("http://localhost", 400),  # the list replaces the default
        ("http://evil.example", 400),
    ]:
        with TestClient(host, base_url=base) as client:
            assert client.get("/jobs/static/dashboard.css").status_code == status, base
    anyone = create_app(unconnected, allowed_hosts=["*"])
    with TestClient(anyone, base_url="http://evil.example") as client:
        assert client.get("/static/dashboard.css").status_code == 200


@pytest.mark.parametrize("path", [*ACTION_ROUTES, "/queues/pause"])
def test_a_post_from_another_origin_is_refused(unconnected: sa.Engine, path: str) -> None:
    app = create_app(unconnected, allow_actions=True, trusted_origins=["https://admin.example.com"])
    with TestClient(app, base_url="http://localhost:8080") as client:
        for origin in ("http://evil.example:8080", "null", "http://localhost:9090"):
            refused = client.post(path, data={}, headers={"origin": origin})
            assert refused.status_code == 403, origin
            assert "another site" in refused.text
            assert refused.headers["x-frame-options"] == "DENY"
        # Past the origin's check, the missing token is what stops these.
        for origin in ("http://localhost:8080", "https://admin.example.com", None):
            headers = {"origin": origin} if origin else {}
            response = client.post(path, data={}, headers=headers)
            assert response.status_code == 403
            assert "security token" in response.text


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("allowed_hosts", ["jobs.example.com:8080"], "a host name or address, with no port"),
        ("allowed_hosts", ["http://jobs.example.com"], "a host name or address, with no port"),
        ("allowed_hosts", ["jobs.*.com"], "a host name or address, with no port"),
        ("allowed_hosts", [""], "a host name or address, with no port"),
        ("trusted_origins", ["admin.example.com"], "scheme://host[:port]"),
        ("trusted_origins", ["https://admin.example.com/jobs"], "scheme://host[:port]"),
    ],
)
def test_bad_host_and_origin_options_are_refused(
    unconnected: sa.Engine, option: str, value: list[str], says: str
) -> None:
    with pytest.raises(WebConfigError, match=re.escape(says)):
        create_app(unconnected, **{option: value})  # type: ignore[arg-type]


# -- the CLI's credentials ---------------------------------------------------------------------


def _hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


@pytest.fixture
def inner() -> Starlette:
    return Starlette(
        routes=[
            Route("/", _hello, methods=["GET", "POST"]),
            Route("/jobs", _hello),
            Route("/api/v1/jobs", _hello),
        ]
    )


def test_a_token_as_bearer_or_once_in_a_link(inner: Starlette) -> None:
    with TestClient(CredentialsGate(inner, token="t0ken")) as client:
        assert client.get("/").status_code == 401
        assert client.get("/", headers={"authorization": "Bearer wrong"}).status_code == 401
        assert client.get("/", headers={"authorization": "Bearer t0ken"}).text == "hello"
        assert client.get("/jobs?token=wrong").status_code == 401
        signed_in = client.get("/jobs?status=dead&token=t0ken", follow_redirects=False)
        assert signed_in.status_code == 303
        assert signed_in.headers["location"] == "/jobs?status=dead"  # the token left the URL
        assert client.get("/jobs").text == "hello"  # the cookie stands for it now
        assert client.post("/?token=t0ken").status_code == 200  # the cookie, not the query
        client.cookies.clear()
        assert client.post("/?token=t0ken").status_code == 401


def test_basic_credentials(inner: Starlette) -> None:
    with TestClient(CredentialsGate(inner, basic=("ops", "pa:ss"))) as client:
        refused = client.get("/")
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Basic ")
        assert client.get("/", auth=("ops", "pa:ss")).text == "hello"
        assert client.get("/", auth=("ops", "wrong")).status_code == 401
        assert client.get("/", headers={"authorization": "Basic %%%"}).status_code == 401


def unauthenticated(response: object, challenge: str) -> None:
    """A refusal of the API: 401, the typed JSON error, and the scheme(s) to answer with."""
    assert getattr(response, "status_code", None) == 401
    headers = response.headers  # type: ignore[attr-defined]
    assert headers["content-type"] == "application/json"
    assert headers["cache-control"] == "no-store"
    assert headers["www-authenticate"] == challenge
    body = response.json()  # type: ignore[attr-defined]
    assert set(body) == {"error"}
    assert body["error"]["type"] == "not_authenticated"
    assert "Authorization" in body["error"]["message"]


@pytest.mark.parametrize(
    ("gate", "challenge"),
    [
        ({"token": "t0ken"}, 'Bearer realm="sa_jobqueue"'),
        ({"basic": ("ops", "pa:ss")}, 'Basic realm="sa_jobqueue", charset="UTF-8"'),
        (
            {"token": "t0ken", "basic": ("ops", "pa:ss")},
            'Bearer realm="sa_jobqueue", Basic realm="sa_jobqueue", charset="UTF-8"',
        ),
    ],
)
def test_the_api_refuses_without_credentials_in_json(
    inner: Starlette, gate: dict[str, object], challenge: str
) -> None:
    with TestClient(CredentialsGate(inner, **gate)) as client:  # type: ignore[arg-type]
        for path in ("/api/v1/jobs", "/api/v1", "/api/v1/nothing-here"):
            unauthenticated(client.get(path), challenge)
        unauthenticated(client.post("/api/v1/jobs", json={}), challenge)
        unauthenticated(client.get("/api/v1/jobs", auth=("ops", "wrong")), challenge)
        page = client.get("/jobs")  # the pages keep their sign-in page
        assert page.status_code == 401
        assert page.headers["content-type"].startswith("text/html")
        assert "Sign in" in page.text
        assert "Bearer" not in page.headers.get("www-authenticate", "")
        assert client.get("/apis").headers["content-type"].startswith("text/html")


def test_the_api_refuses_in_json_under_a_root_path(inner: Starlette) -> None:
    served = UnderPrefix(CredentialsGate(inner, token="t0ken"), "/dashboard")
    with TestClient(served) as client:
        # As opened directly, and as a proxy that removed the prefix passes it on.
        for path in ("/dashboard/api/v1/jobs", "/api/v1/jobs"):
            unauthenticated(client.get(path), 'Bearer realm="sa_jobqueue"')
        assert client.get("/dashboard/jobs").headers["content-type"].startswith("text/html")
        bearer = {"authorization": "Bearer t0ken"}
        assert client.get("/dashboard/api/v1/jobs", headers=bearer).text == "hello"


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_connections_accepted_on_the_listening_socket_have_nagle_off(host: str) -> None:
    """TCP_NODELAY on what the server accepts: with Nagle on, each answer after the first on a
    kept-alive connection waited for the client's delayed ACK (40 ms on Linux).

    Served as uvicorn serves ``sockets=[...]``: ``loop.create_server(..., sock=sock)``, whose
    transports set the option only on sockets made with ``IPPROTO_TCP``.
    """
    try:
        sock = listen(host, 0)
    except OSError:
        pytest.skip(f"no {host} on this machine")

    async def nodelay_of_accepted() -> int:
        loop = asyncio.get_running_loop()
        found: asyncio.Future[int] = loop.create_future()

        class Record(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                accepted = transport.get_extra_info("socket")
                found.set_result(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await loop.create_server(Record, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
            try:
                return await asyncio.wait_for(found, timeout=10)
            finally:
                writer.close()
                await writer.wait_closed()

    assert asyncio.run(nodelay_of_accepted()) != 0


def test_basic_credentials_text() -> None:
    assert basic_credentials("ops:pa:ss") == ("ops", "pa:ss")
    for bad in ("ops", ":pw", "ops:"):
        with pytest.raises(ValueError, match="USER:PASSWORD"):
            basic_credentials(bad)

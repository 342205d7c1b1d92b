"""The dashboard's table of views (sa_jobqueue/web/_views.py): each entry is routed as its page
and under the JSON API, and says how both answer."""

from __future__ import annotations

from starlette.routing import Mount, Route, Router

from sa_jobqueue.database import create_engine
from sa_jobqueue.web import create_app
from sa_jobqueue.web._api_errors import API_PREFIX
from sa_jobqueue.web._views import VIEWS


def test_every_view_is_routed_as_its_page_and_under_the_api() -> None:
    app = create_app(create_engine("postgresql://nobody@127.0.0.1:9/nothing"))
    pages = {(r.path, r.name) for r in app.routes if isinstance(r, Route)}
    (api,) = [r for r in app.routes if isinstance(r, Mount) and r.path == API_PREFIX]
    router = api.app.app  # type: ignore[attr-defined]  # Marked(Router)
    assert isinstance(router, Router)
    answered = {r.path for r in router.routes if isinstance(r, Route)}
    for view in VIEWS:
        assert view.page is not None or view.api is not None, view.name
        if view.page is not None:
            assert (view.page, view.name) in pages
        if view.api is not None:
            assert view.api in answered


def test_each_page_has_a_template_and_its_context_or_answers_its_shape() -> None:
    assert len({view.name for view in VIEWS}) == len(VIEWS)
    for view in VIEWS:
        assert (view.template is None) == (view.context is None), view.name
        if view.page is None:
            assert view.template is None, view.name

"""The dashboard's pages and actions: each route's endpoint, and what they share.

The pages are made from the table of views (:data:`._views.VIEWS`), each the same
endpoint around its entry; the actions are methods here. Endpoints are coroutines; the
database work of each runs in Starlette's thread pool (the engine is synchronous), pages in
one read-only transaction, actions in one read-write one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, Final, TypeVar
from urllib.parse import urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from .. import __version__
from .._sql.dashboard import page_settings
from ..errors import InvalidJobError, JobQueueError, SchemaError
from ..models import DEAD, FINISHED_STATUSES, STATUSES
from ..ops.bulk import BULK_BATCH
from ..ops.health import Thresholds
from ..ops.requeue import REQUEUE_BATCH
from ..periodic import Schedule
from . import _actions, _bulk, _display, _requests, _workflow_reads
from ._db_errors import explain
from ._filters import JobFilter, age, queue_name, task_name
from ._tokens import CSRF_COOKIE, CSRF_FIELD, FLASH_COOKIE, Signer
from ._views import VIEWS, View

T = TypeVar("T")


_STATIC: Final = Path(__file__).parent / "static"


class Dashboard:
    """The pages and actions over one engine; :func:`sa_jobqueue.web.create_app` builds it."""

    def __init__(
        self,
        engine: Engine,
        *,
        allow_actions: bool,
        schedules: Mapping[str, Schedule] | None,
        secret: bytes,
        thresholds: Thresholds,
        statement_timeout: timedelta,
        title: str,
    ) -> None:
        self.engine = engine
        self.allow_actions = allow_actions
        self.schedules = schedules
        self.signer = Signer(secret)
        self.thresholds = thresholds
        self.timeout_ms = str(max(1, int(statement_timeout.total_seconds() * 1000)))
        self.title = title
        self.templates = Environment(
            loader=PackageLoader("sa_jobqueue.web", "templates"),
            autoescape=True,
            undefined=StrictUndefined,
            finalize=_display.visible,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.templates.filters.update(_display.FILTERS)
        self.routes: list[BaseRoute] = [
            *(
                Route(view.page, self._view(view), name=view.name)
                for view in VIEWS
                if view.page is not None
            ),
            Route("/jobs/retry", self.retry_matching, methods=["POST"], name="retry_matching"),
            Route("/jobs/bulk", self.bulk, methods=["POST"], name="bulk"),
            Route("/jobs/{job_id:int}/retry", self.retry, methods=["POST"], name="retry"),
            Route("/jobs/{job_id:int}/cancel", self.cancel, methods=["POST"], name="cancel"),
            Route(
                "/workflows/{workflow_id:int}/{action}",
                self.workflow_action,
                methods=["POST"],
                name="workflow_action",
            ),
            Route("/queues/limits", self.set_limits, methods=["POST"], name="set_limits"),
            Route("/queues/pause", self.pause_queue, methods=["POST"], name="pause_queue"),
            Route("/queues/resume", self.resume_queue, methods=["POST"], name="resume_queue"),
            Route("/purge", self.purge, methods=["POST"], name="purge"),
            Mount("/static", StaticFiles(directory=_STATIC), name="static"),
        ]
        # By name, so that a link asks its own route rather than every route in turn (a page
        # of jobs has a few hundred links).
        self._named = {
            route.name: route for route in self.routes if isinstance(route, Route | Mount)
        }
        self._plain_paths: dict[str, str] = {}

    # -- the pages ---------------------------------------------------------------------------

    def _view(self, view: View) -> Callable[[Request], Awaitable[Response]]:
        """The page of ``view``: what it asks, read in one snapshot, in its template."""

        async def page(request: Request) -> Response:
            try:
                asked = view.ask(request, self)
            except InvalidJobError as exc:
                raise _requests.PageError(400, str(exc)) from None
            data = await self._read(view.read, *asked)
            if data is None and view.missing is not None:
                raise _requests.PageError(404, view.missing.format(*asked))
            if view.template is None or view.context is None:
                answer = view.shape(request, asked, data)
                return answer if isinstance(answer, Response) else JSONResponse(answer)
            context = view.context(self, request, asked, data)
            return self._page(request, view.template, context.pop("as_of"), **context)

        return page

    # -- the actions -------------------------------------------------------------------------

    async def retry(self, request: Request) -> Response:
        form = await self._action_form(request)
        job_id = _requests.job_id_of(request)
        outcome = await self._act(_actions.retry, job_id, _requests.attempts_of(form))
        return self._after(request, outcome, self.url(request, "job", job_id=job_id))

    async def cancel(self, request: Request) -> Response:
        await self._action_form(request)
        job_id = _requests.job_id_of(request)
        outcome = await self._act(_actions.cancel, job_id)
        return self._after(request, outcome, self.url(request, "job", job_id=job_id))

    async def workflow_action(self, request: Request) -> Response:
        form = await self._action_form(request)
        workflow_id = _requests.workflow_id_of(request)
        action = request.path_params["action"]
        if action not in _requests.WORKFLOW_ACTIONS:
            raise _requests.PageError(404, f"no workflow action {action[:40]!r}")
        attempts = _requests.attempts_of(form)
        force = _requests.field(form, "force") == "yes"
        outcome = await self._act(
            _actions.workflow_action, workflow_id, action, attempts=attempts, force=force
        )
        deleted = action == "delete" and outcome.ok
        target = (
            self.url(request, "jobs")
            if deleted
            else self.url(request, "workflow_page", workflow_id=workflow_id)
        )
        return self._after(request, outcome, target)

    async def retry_matching(self, request: Request) -> Response:
        form = await self._action_form(request)
        try:
            age_text = _requests.field(form, "older_than").strip()
            wanted = JobFilter(
                queue=queue_name(_requests.field(form, "queue")),
                task=task_name(_requests.field(form, "task")),
                statuses=(DEAD,),
                older_than=age(age_text) if age_text else None,
                age_text=age_text,
            )
        except InvalidJobError as exc:
            raise _requests.PageError(400, str(exc)) from None
        attempts = _requests.attempts_of(form)
        outcome = await self._act(
            _actions.retry_matching,
            queue=wanted.queue,
            task=wanted.task,
            older_than=wanted.older_than,
            attempts=attempts,
        )
        return self._after(request, outcome, self.url(request, "jobs", query=wanted.query()))

    async def bulk(self, request: Request) -> Response:
        try:
            return await _bulk.handle(self, request)
        except InvalidJobError as exc:
            raise _requests.PageError(400, str(exc)) from None

    async def pause_queue(self, request: Request) -> Response:
        return await self._queue_action(request, _actions.pause)

    async def resume_queue(self, request: Request) -> Response:
        return await self._queue_action(request, _actions.resume)

    async def set_limits(self, request: Request) -> Response:
        form = await self._action_form(request)
        fields = {f: _requests.field(form, f) for f in _actions.LimitsForm.__dataclass_fields__}
        name = _requests.field(form, "queue")
        outcome = await self._act(_actions.set_limits, name, _actions.LimitsForm(**fields))
        return self._after(request, outcome, self.url(request, "queue", query={"name": name}))

    async def _queue_action(
        self, request: Request, action: Callable[[Connection, str], _actions.Outcome]
    ) -> Response:
        form = await self._action_form(request)
        # A bad name is refused by the action (InvalidNameError) and said in the flash.
        name = _requests.field(form, "queue")
        outcome = await self._act(action, name)
        # Back to the page the form was on: the queue's own, or the overview.
        on_queue_page = _requests.field(form, "back") == "queue"
        back = self.url(request, "queue", query={"name": name}) if on_queue_page else None
        return self._after(request, outcome, back or self.url(request, "overview"))

    async def purge(self, request: Request) -> Response:
        form = await self._action_form(request)
        statuses = [s for s in form.getlist("status") if isinstance(s, str)]
        age_text = _requests.field(form, "older_than")
        try:
            selection = _requests.purge_selection(statuses, age_text)
        except InvalidJobError as exc:
            raise _requests.PageError(400, str(exc)) from None
        outcome = await self._act(_actions.purge, **selection)
        back = {"status": statuses, "older_than": age_text}
        return self._after(request, outcome, self.url(request, "purge_form", query=back))

    # -- plumbing ----------------------------------------------------------------------------

    def url(
        self, request: Request, name: str, query: Mapping[str, Any] | None = None, **path: Any
    ) -> str:
        """The path of route ``name`` under wherever the app is mounted, with ``query``."""
        root: str = request.scope.get("root_path", "")
        url = root + (self._route_paths(name) if not path else self._route_path(name, **path))
        kept = {k: v for k, v in (query or {}).items() if v not in (None, "", [])}
        return url + ("?" + urlencode(kept, doseq=True) if kept else "")

    def _route_paths(self, name: str) -> str:
        # A page of a hundred queues asks for six links of each; the path of a route without
        # parameters is the same every time.
        if name not in self._plain_paths:
            self._plain_paths[name] = self._route_path(name)
        return self._plain_paths[name]

    def _route_path(self, name: str, **path: Any) -> str:
        return str(self._named[name].url_path_for(name, **path))

    async def _read(self, reader: Callable[..., T], *args: Any) -> T:
        return await run_in_threadpool(self._read_sync, reader, *args)

    def _read_sync(self, reader: Callable[..., T], *args: Any) -> T:
        """Run ``reader`` in a read-only REPEATABLE READ transaction: one snapshot a page."""
        try:
            with self.engine.connect() as conn:
                conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
                with conn.begin():
                    self._limit_time(conn)
                    return reader(conn, *args)
        except DBAPIError as exc:
            raise _requests.PageError(503, self._explain(exc)) from exc
        except SchemaError as exc:
            raise _requests.PageError(503, str(exc)) from exc

    async def _act(
        self, action: Callable[..., _actions.Outcome], *args: Any, **kwargs: Any
    ) -> _actions.Outcome:
        return await run_in_threadpool(self._act_sync, action, *args, **kwargs)

    def _act_sync(
        self, action: Callable[..., _actions.Outcome], *args: Any, **kwargs: Any
    ) -> _actions.Outcome:
        """Run ``action`` in a transaction of its own, committed if it returns."""
        try:
            with self.engine.begin() as conn:
                self._limit_time(conn)
                return action(conn, *args, **kwargs)
        except DBAPIError as exc:
            return _actions.Outcome(False, f"nothing changed: {self._explain(exc)}")
        except JobQueueError as exc:
            return _actions.Outcome(False, f"nothing changed: {exc}")

    def _limit_time(self, conn: Connection) -> None:
        conn.execute(page_settings(), {"timeout_ms": self.timeout_ms})

    def _explain(self, exc: DBAPIError) -> str:
        return explain(exc, self.engine, int(self.timeout_ms))

    async def _action_form(self, request: Request) -> FormData:
        """The POSTed form, once actions are allowed and its CSRF token holds."""
        if not self.allow_actions:
            raise _requests.PageError(
                403, "actions are off: the dashboard was started without them"
            )
        # Room for the jobs list's act-on-many form: a row's box and the page's id for each
        # of up to 500 rows, and the filter; Starlette's default stops at 1,000 fields.
        form = await request.form(max_fields=2_000)
        token = form.get(CSRF_FIELD)
        if not self.signer.form_accepted(
            request.cookies.get(CSRF_COOKIE), token if isinstance(token, str) else None
        ):
            raise _requests.PageError(
                403,
                "the form's security token is missing or does not match this browser's:"
                " reload the page and try again",
            )
        return form

    def _after(self, request: Request, outcome: _actions.Outcome, target: str) -> Response:
        """Redirect to ``target`` (a GET), which then shows ``outcome``."""
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            FLASH_COOKIE,
            self.signer.flash(outcome.ok, outcome.text),
            max_age=60,
            path=_requests.cookie_path(request),
            secure=request.url.scheme == "https",
            httponly=True,
            samesite="strict",
        )
        return response

    def _page(
        self, request: Request, template: str, as_of: Any, status: int = 200, **context: Any
    ) -> Response:
        token = request.cookies.get(CSRF_COOKIE)
        fresh = None if self.signer.token_valid(token) else self.signer.new_token()
        flash = self.signer.read_flash(request.cookies.get(FLASH_COOKIE))
        html = self.templates.get_template(template).render(
            title=self.title,
            version=__version__,
            allow_actions=self.allow_actions,
            as_of=as_of,
            rel=(lambda moment: _display.relative(moment, as_of)) if as_of is not None else None,
            chart=_display.chart,
            minute_chart=_display.minute_chart,
            url=lambda name, query=None, **path: self.url(request, name, query, **path),
            static=lambda path: self.url(request, "static", path=path) + f"?v={__version__}",
            csrf_field=CSRF_FIELD,
            csrf_token=fresh or token,
            flash=flash,
            statuses=STATUSES,
            finished_statuses=FINISHED_STATUSES,
            max_batch=_actions.MAX_BATCH,
            most_jobs=_workflow_reads.MOST_JOBS,
            counted=_workflow_reads.COUNTED,
            retry_batch=REQUEUE_BATCH,
            bulk_batch=BULK_BATCH,
            request_path=request.url.path,
            **context,
        )
        response = HTMLResponse(html, status_code=status)
        cookie_path = _requests.cookie_path(request)
        secure = request.url.scheme == "https"
        if fresh is not None:
            response.set_cookie(
                CSRF_COOKIE,
                fresh,
                path=cookie_path,
                secure=secure,
                httponly=True,
                samesite="strict",
            )
        if flash is not None:
            response.delete_cookie(
                FLASH_COOKIE, path=cookie_path, secure=secure, httponly=True, samesite="strict"
            )
        return response

    async def page_error(self, request: Request, exc: Exception) -> Response:
        """The page for a :class:`~._requests.PageError`: its status and why."""
        assert isinstance(exc, _requests.PageError)
        return self._page(request, "message.html", None, status=exc.status, message=exc.message)

"""The viewer's web server (aiohttp): the page, its static files, and a small JSON API.

Every request is checked: the access token (from the printed address's ``?token=``, then
a cookie for the page's files and videos, and a header for the API; a POST takes it from
the header only, so that another site cannot make the browser post) and the ``Host``
header (so that a name that resolves to this machine cannot be used to reach it from
another page). A refused request gets a 403 page, a log line, and its connection closed.
Routes are fixed; static files come from a list made when the server starts, and videos
by job number: no path from the page reaches the file system.

Every answer that is not the data asked for is one line, in JSON for the API
(``{"error": ...}``) and an HTML page elsewhere, and never a traceback: 400 for a bad
parameter, 408 for a body that did not arrive in time, 409 for an archive replaced since
the page (or the viewer) opened it, 413 for a request past a bound of
:class:`~flyarchive.view.limits.Limits` (with the bound and how to narrow it), 429 with
``Retry-After`` for a render queue that is full, 503 for storage that does not answer, 500
for a fault of the viewer itself (its type and place logged, for a report).

Every API request that reads the archive first checks that it is still the archive the
viewer opened (:meth:`~flyarchive.view.shown_archive.ViewedArchive.check_same`: answers from
kept states never outlive a replacement), and that it is the one the page shows (the
page sends its ``archive_id`` in ``X-Flyarchive-Archive``: a page left open while another
opened the archive again is told so, not answered from another archive).
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import html
import json
import logging
import math
import mimetypes
import re
import secrets
import time
import traceback
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web

from flyarchive.errors import (
    ArchiveReplacedError,
    FlyarchiveError,
    RequestTimeoutError,
    RequestTooLargeError,
    SelectionError,
    ServerBusyError,
    StorageError,
)
from flyarchive.view.limits import Limits
from flyarchive.view.logs import visible
from flyarchive.view.table import query_table

log = logging.getLogger("flyarchive.view")

STATIC = Path(__file__).parent / "static"
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: Headers the page sends with every API request: the access token, the page's own id
#: (renders are queued fairly between pages), the archive_id the page shows.
TOKEN_HEADER = "X-Flyarchive-Token"
CLIENT_HEADER = "X-Flyarchive-Client"
ARCHIVE_HEADER = "X-Flyarchive-Archive"
#: JSON answers longer than this (characters) are compressed when the client takes it.
COMPRESS_ABOVE = 32 << 10


def static_files() -> dict[str, tuple[bytes, str]]:
    """The page's files, read once: name (``app.js``, ``vendor/three.module.js``...) ->
    (bytes, content type)."""
    files = {}
    for path in sorted(STATIC.rglob("*")):
        if path.is_file():
            name = path.relative_to(STATIC).as_posix()
            kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
            if name.endswith(".js"):
                kind = "text/javascript"
            files[name] = (path.read_bytes(), kind)
    return files


def _page(title: str, text: str, status: int) -> web.Response:
    body = (f"<!doctype html><meta charset=utf-8><title>{html.escape(title)}</title>"
            "<body style='font-family:sans-serif;margin:3em;max-width:50em'>"
            f"<h1>{html.escape(title)}</h1><p id=message>{html.escape(text)}</p></body>")
    return web.Response(text=body, status=status, content_type="text/html")


@dataclass
class Binary:
    """An API answer of bytes (packed arrays, meshes) rather than JSON."""

    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    compress: bool = False


class ViewApp:
    """The aiohttp application of one viewer.

    Args:
        state: The viewer's state (:class:`flyarchive.view.app.Viewer`): the archive, the
            model and its poser, the renders.
        token: The access token.
        limits: The bounds (:class:`~flyarchive.view.limits.Limits`).

    Attributes:
        hosts: ``Host`` header values accepted (``127.0.0.1:PORT``...); None: any.
        connections: The accept loop (:class:`~flyarchive.view.connections.Connections`),
            once serving; it is told which connections showed the token.
    """

    def __init__(self, state: Any, token: str | None = None, limits: Limits | None = None
                 ) -> None:
        self.state = state
        self.token = token or secrets.token_urlsafe(24)
        self.limits = limits or Limits()
        self.hosts: set[str] | None = None
        self.connections: Any = None
        self.cookie = "flyarchive-view"
        self.files = static_files()
        self.app = web.Application(middlewares=[self._guard],
                                   client_max_size=self.limits.max_body_bytes)
        get, post = self.app.router.add_get, self.app.router.add_post
        get("/", self.index)
        get("/favicon.ico", self.favicon)
        get("/static/{name:.+}", self.static)
        # the answers that read states (heavy) have threads of their own: a filter never
        # waits behind traces of 50 worlds
        self._light = ThreadPoolExecutor(4, thread_name_prefix="flyarchive-view-light")
        self._heavy = ThreadPoolExecutor(6, thread_name_prefix="flyarchive-view-heavy")
        get("/api/info", self._api(self.info))
        get("/api/model", self._api(self.model))
        get("/api/table", self._api(self.table))
        get("/api/traces", self._api(self.traces, heavy=True))
        get("/api/scene", self._api(self.scene, heavy=True))
        get("/api/meshes", self._api(self.meshes, heavy=True))
        get("/api/poses", self._api(self.poses, heavy=True))
        get("/api/gait", self._api(self.gait, heavy=True))
        get("/api/scatter", self._api(self.scatter))
        get("/api/changes", self._api(self.changes))
        post("/api/render", self._api(self.render))
        post("/api/renders", self._api(self.render_many))
        get("/api/render/{job:[0-9]{1,9}}", self._api(self.render_status, archive=False))
        post("/api/render/{job:[0-9]{1,9}}/cancel", self._api(self.render_cancel, archive=False))
        post("/api/reopen", self._api(self.reopen, archive=False))
        get("/video/{job:[0-9]{1,9}}.mp4", self.video)

    def close(self) -> None:
        """Let the request threads end (answers under way finish)."""
        self._light.shutdown(wait=False, cancel_futures=True)
        self._heavy.shutdown(wait=False, cancel_futures=True)

    def serve_on(self, hosts: set[str], port: int, *, any_address: bool = False) -> None:
        """Accept the ``Host`` headers of ``hosts`` at ``port`` (with ``any_address``, also
        any IP address at it: a server bound to every interface, reached by one of its
        addresses; a name that is not one of ``hosts`` is still refused, so that a page of
        another site cannot reach it through a name it controls); name the cookie after it."""
        self.hosts = {f"{h}:{port}" for h in hosts}
        self.port = port
        self.any_address = any_address
        self.cookie = f"flyarchive-view-{port}"

    # ------------------------------------------------------------------ guard
    @web.middleware
    async def _guard(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        transport, connections = request.transport, self.connections
        answered = connections.begin(transport) if connections is not None else 0
        try:
            response = await self._checked(request, handler)
        finally:
            if connections is not None:
                connections.end(transport)
        if answered + 1 >= self.limits.max_requests_per_connection:
            response.force_close()  # the client opens another connection
        return response

    async def _checked(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        refused = self._refusal(request)
        if refused:
            log.warning("403 %s %s from %s: %s", request.method, _path(request),
                        request.remote, refused)
            response = _answer_error(request, 403, refused) if _is_api(request) else \
                _page("403: not allowed", refused, 403)
            response.force_close()  # nothing more is read from this connection
            return response
        if self.connections is not None:
            self.connections.trust(request.transport)
        try:
            response = await handler(request)
        except web.HTTPNotFound:
            log.warning("404 %s %s: no such page", request.method, _path(request))
            return _page("404: no such page",
                         f"The viewer has no page {visible(request.path, 200)!r}. It serves its "
                         "own page, the archive's data through its API, and the videos it "
                         "rendered; nothing else is read from this machine.", 404)
        except web.HTTPMethodNotAllowed as err:
            message = (f"{request.method} is not how {visible(request.path, 200)!r} is asked; "
                       f"use {' or '.join(sorted(err.allowed_methods))}.")
            log.warning("405 %s %s: %s", request.method, _path(request), message)
            return _answer_error(request, 405, message)
        except web.HTTPException as err:  # aiohttp's own refusals: one line, no more
            message = f"{err.status} {err.reason}."
            log.warning("%s %s %s: %s", err.status, request.method, _path(request), err.text)
            return _answer_error(request, err.status, message)
        except Exception as err:  # noqa: BLE001 - a fault of the viewer: one line, logged
            message = _internal(request, err)
            return _answer_error(request, 500, message)
        if request.query.get("token") and request.path == "/":
            response.set_cookie(self.cookie, self.token, httponly=True, samesite="Strict")
        return response

    def _refusal(self, request: web.Request) -> str:
        """Why ``request`` is refused, or ``""``."""
        if self.hosts is not None and request.host not in self.hosts \
                and not (self.any_address and _an_address_at(request.host, self.port)):
            return (f"The viewer does not answer requests for host "
                    f"{visible(request.host, 100)!r}; open the address that `flyarchive view` "
                    "printed.")
        given = request.headers.get(TOKEN_HEADER, "")
        if request.method not in ("GET", "HEAD") and not given:
            return (f"A {request.method} request needs the token in the {TOKEN_HEADER} header "
                    "(the viewer's page sends it); one in the address or a cookie is not taken, "
                    "so that another site cannot make the browser send it.")
        if request.method in ("GET", "HEAD"):
            given = given or request.query.get("token", "") or request.cookies.get(self.cookie, "")
        if not given:
            return ("No access token. Open the address that `flyarchive view` printed: it ends "
                    "in ?token=...")
        if not hmac.compare_digest(given.encode(errors="replace"), self.token.encode()):
            return ("Wrong access token. Open the address that `flyarchive view` printed (it "
                    "ends in ?token=...); a restarted viewer has a new token.")
        return ""

    # ------------------------------------------------------------------ the page
    async def index(self, request: web.Request) -> web.Response:
        body, _ = self.files["index.html"]
        return web.Response(body=body, content_type="text/html",
                            headers={"Cache-Control": "no-store"})

    async def favicon(self, request: web.Request) -> web.Response:
        return web.Response(status=204)

    async def static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        found = self.files.get(name)
        if found is None:
            raise web.HTTPNotFound()
        body, kind = found
        # the vendored libraries (three.js: 0.8 MB) stay in the browser's cache for an hour:
        # a page opened again does not fetch them again; the page's own files are checked
        cache = "private, max-age=3600" if name.startswith("vendor/") else "no-cache"
        response = web.Response(body=body, content_type=kind, headers={"Cache-Control": cache})
        response.enable_compression()
        return response

    async def video(self, request: web.Request) -> web.StreamResponse:
        path = self.state.renders.video(int(request.match_info["job"]))
        if path is None:
            raise web.HTTPNotFound()
        return web.FileResponse(path, headers={"Content-Type": "video/mp4"})

    # ------------------------------------------------------------------ the API
    def _api(self, method: Callable[[web.Request, Any], Any], *, archive: bool = True,
             heavy: bool = False) -> _Handler:
        """Run ``method(request, body)`` (blocking work) on a thread (of the ``heavy``
        pool for what reads states); its result as JSON (:class:`Binary` as bytes); its
        error as one line (see the module's text). With ``archive``, the archive is
        checked first (replaced? the one the page shows?)."""
        pool = self._heavy if heavy else self._light

        @functools.wraps(method)
        async def handler(request: web.Request) -> web.StreamResponse:
            start = time.perf_counter()
            try:
                body = await self._body(request) if request.method == "POST" else {}
            except FlyarchiveError as err:  # the rest of the body is not read: close after
                response = self._refused(request, err)
                response.force_close()
                return response

            def work() -> Any:
                if archive:
                    self.state.check_archive(request.headers.get(ARCHIVE_HEADER))
                return method(request, body)

            try:
                result = await asyncio.get_running_loop().run_in_executor(pool, work)
            except (FlyarchiveError, OSError) as err:
                return self._refused(request, err)
            if isinstance(result, Binary):
                response = web.Response(body=result.body, content_type="application/octet-stream",
                                        headers={**result.headers, **_took(start)})
                if result.compress:
                    response.enable_compression()
                return response
            text = _dumps(result)
            response = web.Response(text=text, content_type="application/json",
                                    headers=_took(start))
            if len(text) > COMPRESS_ABOVE:  # the gait of 9 worlds: 320 kB of JSON, 120 kB gzipped
                response.enable_compression()
            return response

        return handler

    def _refused(self, request: web.Request, err: Exception) -> web.Response:
        """The answer to a request that failed with ``err`` (its status: see the module's
        text), and its log line."""
        status, message, extra = _status(err)
        log.warning("%s %s %s: %s", status, request.method, _path(request), message)
        response = _answer_error(request, status, message, **extra)
        if isinstance(err, ServerBusyError):
            response.headers["Retry-After"] = str(max(1, math.ceil(err.retry_after_s)))
        return response

    async def _body(self, request: web.Request) -> Any:
        """The request's body as JSON (``{}`` when there is none), read within the body
        timeout and size.

        Raises:
            RequestTimeoutError: too slow.
            RequestTooLargeError: too big.
            SelectionError: not UTF-8 JSON, NaN or infinity, nested too deep.
        """
        limits = self.limits
        if not request.can_read_body:
            return {}
        try:
            raw = await asyncio.wait_for(request.read(), limits.body_timeout_s)
        except TimeoutError:
            raise RequestTimeoutError(f"The request's body did not arrive within "
                                      f"{limits.body_timeout_s:g} s.") from None
        except web.HTTPRequestEntityTooLarge:
            raise RequestTooLargeError(f"The request's body is over {limits.max_body_bytes:,} "
                                       "bytes, the most the viewer reads; a render request is "
                                       "a few hundred.") from None
        if not raw.strip():
            return {}
        try:
            return json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
        except RecursionError:
            raise SelectionError("The request's body is JSON nested too deep to read; the "
                                 "viewer's requests are flat objects.") from None
        except UnicodeDecodeError:
            raise SelectionError("The request's body is not UTF-8 text.") from None
        except ValueError as err:
            raise SelectionError(f"The request's body is not JSON ({visible(str(err), 120)}).") \
                from None

    def info(self, request: web.Request, body: Any) -> dict[str, Any]:
        return self.state.info()

    def model(self, request: web.Request, body: Any) -> dict[str, Any]:
        return self.state.model_info()

    def table(self, request: web.Request, body: Any) -> dict[str, Any]:
        q = request.query
        answer = query_table(self.state.viewed.columns, where=q.get("where", ""),
                             sort=q.get("sort", "world"), descending=q.get("desc") == "1",
                             page=_int(q, "page", 0), page_size=_int(q, "size", 50))
        self.state.first_page.set()  # the page is up: the model may load
        return answer

    def traces(self, request: web.Request, body: Any) -> Binary:
        return Binary(self.state.traces(request.query))

    def scene(self, request: web.Request, body: Any) -> dict[str, Any]:
        return self.state.scene()[0]

    def meshes(self, request: web.Request, body: Any) -> Binary:
        return Binary(self.state.scene()[1], compress=True)

    def poses(self, request: web.Request, body: Any) -> Binary:
        blob, shape = self.state.poses(request.query)
        return Binary(blob, {"X-Shape": ",".join(map(str, shape))})

    def gait(self, request: web.Request, body: Any) -> dict[str, Any]:
        return self.state.gait(request.query)

    def scatter(self, request: web.Request, body: Any) -> dict[str, Any]:
        return self.state.scatter(request.query)

    def changes(self, request: web.Request, body: Any) -> dict[str, Any]:
        return self.state.changes()

    def render(self, request: web.Request, body: Any) -> dict[str, Any]:
        return self.state.render(body, client=_client(request))

    def render_many(self, request: web.Request, body: Any) -> dict[str, Any]:
        return self.state.render_many(body, client=_client(request))

    def render_status(self, request: web.Request, body: Any) -> dict[str, Any]:
        return self.state.renders.status(int(request.match_info["job"]))

    def render_cancel(self, request: web.Request, body: Any) -> dict[str, Any]:
        return self.state.renders.cancel(int(request.match_info["job"]))

    def reopen(self, request: web.Request, body: Any) -> dict[str, Any]:
        self.state.reopen()
        return self.state.info()


def _an_address_at(host: str, port: int) -> bool:
    """Whether a ``Host`` header names an IP address (``192.0.2.2:8750``, ``[::1]:8750``)
    at ``port``."""
    import ipaddress

    name, _, at = host.rpartition(":")
    if at != str(port):
        return False
    try:
        ipaddress.ip_address(name[1:-1] if name.startswith("[") and name.endswith("]") else name)
    except ValueError:
        return False
    return True


def _status(err: Exception) -> tuple[int, str, dict[str, Any]]:
    """The HTTP status of a failed request, its one-line message, and what more the page
    is told (``replaced``)."""
    if isinstance(err, ArchiveReplacedError):
        return 409, str(err), {"replaced": True}
    if isinstance(err, RequestTooLargeError):
        return 413, str(err), {}
    if isinstance(err, RequestTimeoutError):
        return 408, str(err), {}
    if isinstance(err, ServerBusyError):
        return 429, str(err), {}
    if isinstance(err, StorageError):
        return 503, (f"The archive's storage did not answer: {err} The viewer keeps running; "
                     "try again when it answers."), {}
    if isinstance(err, FlyarchiveError):
        return 400, str(err), {}
    return 503, (f"Reading failed: {type(err).__name__}: {err}. The viewer keeps running; "
                 "try again."), {}


def _is_api(request: web.Request) -> bool:
    return request.path.startswith("/api/")


def _answer_error(request: web.Request, status: int, message: str, **extra: Any
                  ) -> web.Response:
    """One line: JSON ``{"error": ...}`` for the API, a page elsewhere."""
    line = " ".join(message.split("\n"))
    if _is_api(request):
        return web.Response(text=json.dumps({"error": line, **extra}), status=status,
                            content_type="application/json")
    return _page(f"{status}: not answered", line, status)


def _internal(request: web.Request, err: BaseException) -> str:
    """Log a fault of the viewer (its type, message and place, one line); what the client
    is told."""
    place = traceback.extract_tb(err.__traceback__)[-1:] if err.__traceback__ else []
    where = f" at {Path(place[0].filename).name}:{place[0].lineno}" if place else ""
    log.error("500 %s %s: internal error %s: %s%s (a fault of flyarchive view: please report "
              "it with this line)", request.method, _path(request), type(err).__name__,
              visible(str(err), 300), where)
    return (f"The viewer failed to answer ({type(err).__name__}); its log has a line to report. "
            "It keeps running.")


def _path(request: web.Request) -> str:
    """The request's path for a log line (no query: it may hold the token)."""
    return visible(request.path, 200)


def _client(request: web.Request) -> str:
    """Who asks, for fair queues: the page's own id (``X-Flyarchive-Client``), else the
    address it comes from."""
    given = request.headers.get(CLIENT_HEADER, "")
    if 0 < len(given) <= 64 and given.replace("-", "").isalnum() and given.isascii():
        return given
    return str(request.remote or "")


def _no_constant(name: str) -> Any:
    raise SelectionError(f"The request's body holds {name}, which is no number; send numbers "
                         "as numbers.")


def _took(start: float) -> dict[str, str]:
    """The ``Server-Timing`` header: how long the server worked on the answer (ms)."""
    return {"Server-Timing": f"app;dur={(time.perf_counter() - start) * 1000:.1f}"}


_WHOLE = re.compile(r"-?[0-9]{1,18}")


def _int(query: Any, name: str, default: int) -> int:
    text = query.get(name, "")
    if not text:
        return default
    if not _WHOLE.fullmatch(text):
        raise SelectionError(f"{name} must be a whole number below 10**18, not "
                             f"{visible(text, 40)!r}.")
    return int(text)


def _dumps(value: Any) -> str:
    return json.dumps(value, default=_jsonable, allow_nan=False)


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON")

"""The viewer's web server (aiohttp): the page, its static files, and a small JSON API.

Every request is checked: the access token (from the printed address's ``?token=``, then
a cookie for the page's files and videos, and a header for the API; a POST needs the
header, so another site cannot make the browser post) and the ``Host`` header (so a
name that resolves to this machine cannot be used to reach it from another page). A
wrong token gets a 403 page and a log line. Routes are fixed; static files come from a
list made when the server starts, and videos by job number: no path from the page
reaches the file system.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import html
import json
import logging
import mimetypes
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web

from flyarchive.errors import ArchiveReplacedError, FlyarchiveError, SelectionError
from flyarchive.view.table import query_table

log = logging.getLogger("flyarchive.view")

STATIC = Path(__file__).parent / "static"
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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


class ViewApp:
    """The aiohttp application of one viewer.

    Args:
        state: The viewer's state (:class:`flyarchive.view.app.Viewer`): the archive, the
            model and its poser, the renders.
        token: The access token.
        hosts: ``Host`` header values accepted (``127.0.0.1:PORT``...); None: any.
    """

    def __init__(self, state: Any, token: str | None = None) -> None:
        self.state = state
        self.token = token or secrets.token_urlsafe(24)
        self.hosts: set[str] | None = None
        self.cookie = "flyarchive-view"
        self.files = static_files()
        self.app = web.Application(middlewares=[self._guard], client_max_size=1 << 20)
        get, post = self.app.router.add_get, self.app.router.add_post
        get("/", self.index)
        get("/favicon.ico", self.favicon)
        get("/static/{name:.+}", self.static)
        get("/api/info", self._api(self.info))
        get("/api/model", self._api(self.model))
        get("/api/table", self._api(self.table))
        get("/api/traces", self._api(self.traces))
        get("/api/scene", self._api(self.scene))
        get("/api/meshes", self.meshes)
        get("/api/poses", self.poses)
        post("/api/render", self._api(self.render))
        get("/api/render/{job:[0-9]+}", self._api(self.render_status))
        post("/api/reopen", self._api(self.reopen))
        get("/video/{job:[0-9]+}.mp4", self.video)

    def serve_on(self, hosts: set[str], port: int) -> None:
        """Accept the ``Host`` headers of ``hosts`` at ``port``; name the cookie after it."""
        self.hosts = {f"{h}:{port}" for h in hosts}
        self.cookie = f"flyarchive-view-{port}"

    # ------------------------------------------------------------------ guard
    @web.middleware
    async def _guard(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        refused = self._refusal(request)
        if refused:
            log.warning("403 %s %s from %s: %s", request.method, request.path, request.remote,
                        refused)
            if request.path.startswith("/api/"):
                return web.json_response({"error": refused}, status=403)
            return _page("403: not allowed", refused, 403)
        try:
            response = await handler(request)
        except web.HTTPNotFound:
            log.warning("404 %s %s: no such page", request.method, request.path_qs[:200])
            return _page("404: no such page",
                         f"The viewer has no page {request.path[:200]!r}. It serves its own page, "
                         "the archive's data through its API, and the videos it rendered; "
                         "nothing else is read from this machine.", 404)
        except web.HTTPException:
            raise
        if request.query.get("token") and request.path == "/":
            response.set_cookie(self.cookie, self.token, httponly=True, samesite="Strict")
        return response

    def _refusal(self, request: web.Request) -> str:
        """Why ``request`` is refused, or ``""``."""
        if self.hosts is not None and request.host not in self.hosts:
            return (f"The viewer does not answer requests for host {request.host!r}; open the "
                    "address that `flyarchive view` printed.")
        header = request.headers.get("X-Flyarchive-Token", "")
        given = header or request.query.get("token", "")
        if request.method != "POST":
            given = given or request.cookies.get(self.cookie, "")
        if not given:
            return ("No access token. Open the address that `flyarchive view` printed: it ends "
                    "in ?token=...")
        if not hmac.compare_digest(given.encode(), self.token.encode()):
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
        # the vendored libraries (three.js: 2 MB) stay in the browser's cache for an hour:
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
    def _api(self, method: Callable[[web.Request], Any]) -> _Handler:
        """Run ``method`` (blocking work) on a thread; its result as JSON (bytes as they
        are); its error as a JSON ``{"error": ...}`` the page shows, and a log line."""

        @functools.wraps(method)
        async def handler(request: web.Request) -> web.Response:
            try:
                body = await request.json() if request.method == "POST" and \
                    request.can_read_body else {}
            except ValueError:
                log.warning("%s %s: the body is not JSON", request.method, request.path)
                return web.json_response({"error": "The request's body is not JSON."}, status=400)
            start = time.perf_counter()
            try:
                result = await asyncio.get_running_loop().run_in_executor(
                    None, method, request, body)
            except ArchiveReplacedError as err:
                log.warning("%s %s: %s", request.method, request.path, err)
                return web.json_response({"error": str(err), "replaced": True}, status=409)
            except (FlyarchiveError, OSError) as err:
                message = str(err) if isinstance(err, FlyarchiveError) else \
                    f"{type(err).__name__}: {err}"
                log.warning("%s %s: %s", request.method, request.path_qs[:300], message)
                return web.json_response({"error": message}, status=400)
            if isinstance(result, bytes):  # packed arrays (traces)
                return web.Response(body=result, content_type="application/octet-stream",
                                    headers=_took(start))
            return web.json_response(result, dumps=_dumps, headers=_took(start))

        return handler

    def info(self, request: web.Request, body: Any) -> dict[str, Any]:
        return self.state.info()

    def model(self, request: web.Request, body: Any) -> dict[str, Any]:
        return self.state.model_info()

    def table(self, request: web.Request, body: Any) -> dict[str, Any]:
        q = request.query
        viewed = self.state.viewed
        viewed.check_same()
        answer = query_table(viewed.columns, where=q.get("where", ""),
                             sort=q.get("sort", "world"), descending=q.get("desc") == "1",
                             page=_int(q, "page", 0), page_size=_int(q, "size", 50))
        self.state.first_page.set()  # the page is up: the model may load
        return answer

    def traces(self, request: web.Request, body: Any) -> bytes:
        return self.state.traces(request.query)

    def scene(self, request: web.Request, body: Any) -> dict[str, Any]:
        return self.state.scene()[0]

    async def meshes(self, request: web.Request) -> web.Response:
        blob = await asyncio.get_running_loop().run_in_executor(
            None, lambda: self.state.scene()[1])
        response = web.Response(body=blob, content_type="application/octet-stream")
        response.enable_compression()
        return response

    async def poses(self, request: web.Request) -> web.Response:
        start = time.perf_counter()
        try:
            blob, shape = await asyncio.get_running_loop().run_in_executor(
                None, self.state.poses, request.query)
        except ArchiveReplacedError as err:
            log.warning("GET /api/poses: %s", err)
            return web.json_response({"error": str(err), "replaced": True}, status=409)
        except FlyarchiveError as err:
            log.warning("GET %s: %s", request.path_qs[:300], err)
            return web.json_response({"error": str(err)}, status=400)
        return web.Response(body=blob, content_type="application/octet-stream",
                            headers={"X-Shape": ",".join(map(str, shape)), **_took(start)})

    def render(self, request: web.Request, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise SelectionError("A render request is a JSON object.")
        return self.state.render(body)

    def render_status(self, request: web.Request, body: Any) -> dict[str, Any]:
        job = self.state.renders.jobs.get(int(request.match_info["job"]))
        if job is None:
            raise SelectionError(f"No render {request.match_info['job']!r} in this viewer.")
        return job.as_json()

    def reopen(self, request: web.Request, body: Any) -> dict[str, Any]:
        self.state.reopen()
        return self.state.info()


def _took(start: float) -> dict[str, str]:
    """The ``Server-Timing`` header: how long the server worked on the answer (ms)."""
    return {"Server-Timing": f"app;dur={(time.perf_counter() - start) * 1000:.1f}"}


def _int(query: Any, name: str, default: int) -> int:
    text = query.get(name, "")
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise SelectionError(f"{name} must be a whole number, not {text!r}.") from None


def _dumps(value: Any) -> str:
    return json.dumps(value, default=_jsonable, allow_nan=False)


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON")


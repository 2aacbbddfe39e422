"""Harness of the viewer's tests and its benchmark: a small archive with world variables
(and one of a six-legged walker whose gait is known, for the gait panels), a viewer served in this process on a free port, its log lines, requests as a client sends
them (whole, or as raw bytes: :func:`exchange`), connections that never finish their
request (:func:`half_open`), and a Chromium page driven by Playwright.

Needs aiohttp (``flyarchive[view]``); the page helpers need playwright and Chromium
(:data:`flyarchive.testing.markers.CHROMIUM`).
"""

from __future__ import annotations

import json
import logging
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import numpy as np

__all__ = ["WORLD_VARS", "view_archive", "walker_gaits", "walker_view_archive", "LogLines", "serving", "origin", "ask", "exchange",
           "half_open", "closed_by_server", "open_page", "wait_ready"]

#: The world variables of :func:`view_archive`'s four worlds.
WORLD_VARS = {"success": np.array([1, 0, 1, 0]), "distance": np.array([6.0, 2.0, 7.5, np.nan])}


def view_archive(url: str, *, n_worlds: int = 4, n_steps: int = 200, mode: str = "w-") -> str:
    """Record ``n_worlds`` worlds of the tiny model (51 frames with the default steps, its
    model kept), with :data:`WORLD_VARS` when there are four worlds."""
    import flyarchive
    from flyarchive.testing import tiny_model
    from flyarchive.testing.fixtures import record

    record(tiny_model(), url, n_worlds=n_worlds, n_steps=n_steps, mode=mode)
    if n_worlds == len(WORLD_VARS["success"]):
        flyarchive.add_world_vars(url, WORLD_VARS)
    return url


def walker_gaits(n_worlds: int = 20) -> list[Any]:
    """The gaits of :func:`walker_view_archive`'s worlds: world ``w`` steps at
    ``6 + 0.4 w`` Hz, ``0.6 + 0.03 (w % 7)`` mm a step."""
    from flyarchive.testing.walker import WalkerGait

    return [WalkerGait(frequency=6.0 + 0.4 * w, step_length=0.6 + 0.03 * (w % 7))
            for w in range(n_worlds)]


def walker_view_archive(url: str, *, n_worlds: int = 20, frames: int = 100) -> str:
    """``n_worlds`` worlds of the six-legged walker (:func:`flyarchive.testing.walker.walker_archive`,
    ``frames`` frames at 125 frames/s, its model kept) walking the gaits of
    :func:`walker_gaits`, side by side 1 mm apart, with world variables ``frequency`` (Hz)
    and ``step_length`` (mm)."""
    import flyarchive
    from flyarchive.testing.walker import walker_archive

    gaits = walker_gaits(n_worlds)
    walker_archive(url, gaits, frames=frames, spread=1.0)
    flyarchive.add_world_vars(url, {"frequency": np.array([g.frequency for g in gaits]),
                                    "step_length": np.array([g.step_length for g in gaits])})
    return url


class LogLines(logging.Handler):
    """The viewer's log lines (logger ``flyarchive.view``) while it is attached."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def having(self, fragment: str) -> list[str]:
        """The lines that contain ``fragment``."""
        return [line for line in self.lines if fragment in line]


@contextmanager
def serving(url: str, **viewer: Any) -> Iterator[tuple[Any, LogLines]]:
    """A viewer of ``url`` on a free loopback port: ``(served, log)``; ``served.url`` holds
    the token. ``viewer``: options of :class:`flyarchive.view.app.Viewer`."""
    from flyarchive.view.app import Viewer, start

    lines = LogLines()
    log = logging.getLogger("flyarchive.view")
    log.addHandler(lines)
    log.setLevel(logging.INFO)
    served = start(Viewer(url, **viewer), port=0)
    try:
        yield served, lines
    finally:
        served.stop()
        log.removeHandler(lines)


def render_until_stopped(out: str, on_stop: Callable[[str], object]) -> None:
    """Stand in for a render that runs until it is stopped, as ``render_videos`` does:
    its partial files first (``.parts-1/run.json`` in ``out``); on
    :class:`~flyarchive.errors.Terminated` (Ctrl-C, SIGTERM, a cancel) they are removed,
    ``on_stop(out)`` is called, and the error goes on."""
    import shutil
    from pathlib import Path

    from flyarchive.errors import Terminated

    parts = Path(out) / ".parts-1"
    parts.mkdir(parents=True)
    (parts / "run.json").write_text("{}")
    try:
        while True:
            time.sleep(0.01)
    except Terminated:
        on_stop(out)
        shutil.rmtree(parts)
        raise


def origin(served: Any) -> str:
    """``http://127.0.0.1:PORT`` of a viewer (``served.url`` without path and token)."""
    return "{0.scheme}://{0.netloc}".format(urlsplit(served.url))


def ask(url: str, *, method: str = "GET", headers: dict[str, str] | None = None,
        body: Any = None, data: bytes | None = None, timeout: float = 60
        ) -> tuple[int, dict[str, str], bytes]:
    """One request as a client sends it: ``body`` as JSON (or ``data`` as it is).
    Returns ``(status, headers, body)``, errors included."""
    if body is not None:
        data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def exchange(url: str, raw: bytes, *, timeout: float = 30) -> bytes:
    """Send ``raw`` bytes to the server of ``url`` on a new connection; what it answers
    until it closes the connection (or ``timeout`` seconds pass without a byte)."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as sock:
        try:
            sock.sendall(raw)
        except OSError:  # closed by the server while sending: read what it said
            pass
        chunks = []
        try:
            while chunk := sock.recv(1 << 16):
                chunks.append(chunk)
        except (TimeoutError, ConnectionResetError):
            pass
    return b"".join(chunks)


def half_open(url: str, n: int, *, head: bytes = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n"
              ) -> list[socket.socket]:
    """``n`` connections to the server of ``url`` that each send the start of ``head``
    and never finish it (the slow clients of a "slowloris"); the caller closes them."""
    parts = urlsplit(url)
    held = []
    for _ in range(n):
        sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
        sock.sendall(head)
        held.append(sock)
    return held


def closed_by_server(sock: socket.socket, timeout: float) -> bool:
    """Whether the server closes ``sock`` within ``timeout`` seconds (what it answers
    first is read and dropped)."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            if not sock.recv(1 << 16):
                return True
        except TimeoutError:
            return False
        except OSError:  # reset: closed too
            return True
    return False


def open_page(browser: Any, url: str) -> Any:
    """A new page of ``browser`` at ``url``, ready (:func:`wait_ready`)."""
    page = browser.new_page(viewport={"width": 1280, "height": 860})
    page.goto(url)
    wait_ready(page)
    return page


def wait_ready(page: Any, timeout_ms: float = 60_000) -> None:
    """Wait until the page has drawn its table and built its 3D scene."""
    page.wait_for_function("window.flyarchiveView && window.flyarchiveView.ready",
                           timeout=timeout_ms)

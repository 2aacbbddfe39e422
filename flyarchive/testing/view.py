"""Harness of the viewer's tests: a small archive with world variables, a viewer served in
this process on a free port, its log lines, and a Chromium page driven by Playwright.

Needs aiohttp (``flyarchive[view]``); the page helpers need playwright and Chromium
(:data:`flyarchive.testing.markers.CHROMIUM`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

__all__ = ["WORLD_VARS", "view_archive", "LogLines", "serving", "open_page", "wait_ready"]

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

"""Fixtures of the viewer's tests: one archive, one viewer and one headless Chromium per
module (starting Chromium takes seconds on the 2-core machine), a fresh page per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def view_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("view")


@pytest.fixture(scope="module")
def viewed(view_dir: Path) -> Iterator[tuple[Any, Any]]:
    """``(served, log)``: a viewer of a 4-world archive (:func:`view_archive`), rendering
    with OpenGL into ``view_dir / "videos"``."""
    from flyarchive.testing.view import serving, view_archive

    url = view_archive(str(view_dir / "run.zarr"))
    with serving(url, out=view_dir / "videos", backend="opengl") as found:
        yield found


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    from flyarchive.testing.markers import CHROMIUM, CHROMIUM_ARGS

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS))
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any, viewed: tuple[Any, Any]) -> Iterator[Any]:
    """The viewer's page, ready (table drawn, 3D scene built)."""
    from flyarchive.testing.view import open_page

    opened = open_page(browser, viewed[0].url)
    yield opened
    opened.close()

"""The gait panels in a real browser (headless Chromium through Playwright), on an archive
of the six-legged walker whose gait is known (flyarchive.testing.walker): the footfall
diagram of the selected world, the thorax paths of the shown worlds, and the scatter of
two world variables whose brush filters the table and queues renders. What the page drew
is checked against the gait functions and the archive's states (the panels keep the data
and pixels they drew), and the canvas's pixels where a bar or a path was drawn."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import flyarchive
from flyarchive.testing.markers import requires_chromium

pytestmark = [pytest.mark.browser, requires_chromium]

STATE = "window.flyarchiveView"
STANCE_RGB = (0x2A, 0x31, 0x42)  # gait.js's stance colour


@pytest.fixture(scope="module")
def walked(view_dir: Path) -> Iterator[tuple[Any, Any]]:
    """``(served, log)``: a viewer of 20 walker worlds (100 frames each), rendering with
    OpenGL into ``view_dir / "walker-videos"``."""
    from flyarchive.testing.view import serving, walker_view_archive

    url = walker_view_archive(str(view_dir / "walker.zarr"))
    with serving(url, out=view_dir / "walker-videos", backend="opengl") as found:
        yield found


@pytest.fixture
def page(browser: Any, walked: tuple[Any, Any]) -> Iterator[Any]:
    from flyarchive.testing.view import open_page

    opened = open_page(browser, walked[0].url)
    yield opened
    opened.close()


def select_and_wait_for_gait(page: Any, *worlds: int) -> None:
    """Click the rows of ``worlds``; wait until the gait panels show them all."""
    for world in worlds:
        page.click(f"#table tbody tr[data-world='{world}']")
    shown = ",".join(map(str, worlds))
    page.wait_for_function(
        f"{STATE}.gait && {STATE}.gait.worlds.map(w => w.world).join() === '{shown}'",
        timeout=60_000)


def pixel(page: Any, canvas: str, x: float, y: float) -> tuple[int, int, int]:
    """The colour of a canvas at CSS pixel (x, y)."""
    return tuple(page.evaluate(
        "([id, x, y]) => { const c = document.getElementById(id), r = window.devicePixelRatio || 1;"
        " return Array.from(c.getContext('2d').getImageData(Math.round(x * r), Math.round(y * r), 1, 1)"
        ".data.slice(0, 3)); }", [canvas, x, y]))


def test_the_footfall_diagram_draws_each_legs_stances_of_the_selected_world(page, walked):
    url = walked[0].viewer.viewed.url
    epochs = flyarchive.gait_epochs(url, worlds=[3])
    stance = epochs[epochs.phase == "stance"]

    select_and_wait_for_gait(page, 3)

    bars = page.evaluate("window.flyarchiveView.footfallBars()")
    legs = ["lf", "lm", "lh", "rf", "rm", "rh"]
    assert sorted({b["leg"] for b in bars}) == sorted(legs)
    for leg in legs:
        drawn = [[b["start"], b["stop"]] for b in bars if b["leg"] == leg]
        expected = stance[stance.leg == leg][["start_time", "stop_time"]].to_numpy()
        assert len(drawn) >= 3  # 0.8 s at 7.2 Hz: several steps of each leg
        np.testing.assert_allclose(drawn, expected, rtol=0, atol=1e-9)
    middle = max(bars, key=lambda b: b["w"])
    assert pixel(page, "footfall", middle["x"] + middle["w"] / 2, middle["y"] + middle["h"] / 2) \
        == STANCE_RGB
    legend = page.inner_text("#footfall-legend")
    assert "step frequency (Hz)" in legend and "duty factor" in legend


def test_the_path_plot_draws_the_thorax_path_of_each_shown_world(page, walked):
    viewed = walked[0].viewer.viewed
    qpos = {w: s["qpos"] for w, s in zip((0, 7), viewed.states([0, 7]))}

    select_and_wait_for_gait(page, 0, 7)

    drawn = page.evaluate("window.flyarchiveView.pathsDrawn()")
    paths = page.evaluate(f"{STATE}.gait.worlds.map(w => [w.world, w.path.x, w.path.y])")
    assert [d["world"] for d in drawn] == [0, 7]
    for world, x, y in paths:
        np.testing.assert_allclose(x, qpos[world][:, 0], rtol=0, atol=1e-6)  # every frame
        np.testing.assert_allclose(y, qpos[world][:, 1], rtol=0, atol=1e-6)
    for d in drawn:
        assert len(d["points"]) == 100
        px, py = d["points"][50]
        assert pixel(page, "paths", px, py) != (255, 255, 255)  # a line was drawn there
    legend = page.inner_text("#paths-legend")
    assert "world 0:" in legend and "world 7:" in legend and "mm/s" in legend


def test_brushing_the_scatter_filters_the_table_and_queues_renders_of_those_worlds(page, walked):
    served = walked[0]
    columns = served.viewer.viewed.columns
    page.wait_for_function(f"{STATE}.scatterSeq >= 1")
    points = {p["world"]: p for p in page.evaluate(f"{STATE}.scatterPoints()")}
    page.locator("#scatter").scroll_into_view_if_needed()
    box = page.locator("#scatter").bounding_box()
    corner = [min(points[w]["px"] for w in (2, 3, 4)) - 4, min(points[w]["py"] for w in (2, 3, 4)) - 4]
    far = [max(points[w]["px"] for w in (2, 3, 4)) + 4, max(points[w]["py"] for w in (2, 3, 4)) + 4]
    seq = page.evaluate(f"{STATE}.tableSeq")

    page.mouse.move(box["x"] + corner[0], box["y"] + corner[1])
    page.mouse.down()
    page.mouse.move(box["x"] + far[0], box["y"] + far[1], steps=4)
    page.mouse.up()
    page.wait_for_function(f"{STATE}.tableSeq > {seq}")

    brush = page.evaluate(f"{STATE}.brush")
    inside = (columns["frequency"] >= brush["x0"]) & (columns["frequency"] <= brush["x1"]) & \
        (columns["step_length"] >= brush["y0"]) & (columns["step_length"] <= brush["y1"])
    expected = [int(w) for w in columns["world"][inside]]
    rows = [int(w) for w in page.eval_on_selector_all("#table tbody tr", "rs => rs.map(r => r.dataset.world)")]
    assert {2, 3, 4} <= set(expected) and len(expected) < 20
    assert rows == expected
    assert sorted(page.evaluate(f"{STATE}.scatterBrushed()")) == expected
    assert page.inner_text("#page-info").startswith(f"{len(expected)} of 20 worlds")

    page.fill("#size", "48x64")
    page.click("#render-brushed")
    page.wait_for_function(f"{STATE}.batch && {STATE}.batch.jobs.length === 1 && "
                           f"{STATE}.batch.jobs[0].state === 'done'", timeout=240_000)

    batch = page.evaluate(f"{STATE}.batch")
    assert batch["queued"] == expected and batch["not_queued"] == []
    assert f"Queued 1 render of {len(expected)} worlds" in page.inner_text("#batch-status")
    job = served.viewer.renders.jobs[batch["jobs"][0]["id"]]
    assert job.worlds == expected and job.video is not None and job.video.is_file()


def test_a_recording_longer_than_a_gait_request_shows_the_window_around_the_cursor(browser, walked,
                                                                                  view_dir):
    from flyarchive.testing.view import open_page, serving
    from flyarchive.view.limits import Limits

    url = walked[0].viewer.viewed.url
    with serving(url, out=view_dir / "walker-videos-short", backend="opengl",
                 limits=Limits(max_gait_frames=120)) as (served, _):
        page = open_page(browser, served.url)
        select_and_wait_for_gait(page, 0, 1)  # 60 frames each at most, of 100
        first = page.evaluate(f"{STATE}.gait.window")
        page.evaluate("f => { const t = document.querySelector('#time'); t.value = f; "
                      "t.dispatchEvent(new Event('input')); }", 80)
        seq = page.evaluate(f"{STATE}.gaitSeq")
        page.click("#gait-here")
        page.wait_for_function(f"{STATE}.gaitSeq > {seq}")
        later = page.evaluate(f"{STATE}.gait.window")
        bars = page.evaluate(f"{STATE}.footfallBars()")
        page.close()

    assert first == pytest.approx([0.0, 59 * 0.008])
    assert later == pytest.approx([40 * 0.008, 99 * 0.008])  # 60 frames, the last ones
    assert bars and min(b["start"] for b in bars) >= 40 * 0.008 - 1e-9

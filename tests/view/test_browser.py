"""The viewer in a real browser (headless Chromium through Playwright): the table, the
selection, traces, the 3D view's time cursor and a render played in the page; and bad
input, which shows a message on the page and a line in the log, never a blank page."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest

from flyarchive.testing.markers import requires_chromium

pytestmark = [pytest.mark.browser, requires_chromium]

STATE = "window.flyarchiveView"


def table_worlds(page: Any) -> list[int]:
    return [int(w) for w in page.eval_on_selector_all(
        "#table tbody tr", "rows => rows.map(r => r.dataset.world)")]


def apply_filter(page: Any, text: str) -> None:
    seq, errors = page.evaluate(f"[{STATE}.tableSeq, {STATE}.errors]")
    page.fill("#filter", text)
    page.click("#filter-form button")
    page.wait_for_function(f"{STATE}.tableSeq > {seq} || {STATE}.errors > {errors}")


def select(page: Any, *worlds: int) -> None:
    """Click the rows of ``worlds``; wait until the traces show them all (an answer for
    the first click may arrive before the second) and a pose is drawn."""
    seq = page.evaluate(f"{STATE}.tracesSeq")
    for world in worlds:
        page.click(f"#table tbody tr[data-world='{world}']")
    page.wait_for_function(
        f"{STATE}.tracesSeq > {seq} && {STATE}.poseSeq >= 1 && "
        f"[...new Set({STATE}.traceWorlds)].join() === {STATE}.selected.join()")


def move_cursor(page: Any, frame: int) -> None:
    """Move the time cursor to ``frame``; wait until the 3D view has drawn it after the
    move (the frame may be the one drawn already: its own draw is still to come)."""
    seq = page.evaluate(f"{STATE}.poseSeq")
    page.evaluate("f => { const t = document.querySelector('#time'); t.value = f; "
                  "t.dispatchEvent(new Event('input')); }", frame)
    page.wait_for_function(f"{STATE}.poseSeq > {seq} && {STATE}.poseFrame === {frame}")


def message(page: Any) -> str:
    page.wait_for_selector("#message.error")
    return page.inner_text("#message")


# ----------------------------------------------------------------------------- using it
def test_the_page_lists_every_world_with_its_variables(page):
    expected = [0, 1, 2, 3]

    actual = table_worlds(page)

    assert actual == expected
    assert page.inner_text("#page-info").startswith("4 of 4 worlds")
    headers = page.eval_on_selector_all("#table th", "hs => hs.map(h => h.textContent)")
    assert {"world", "n_frames", "success", "distance"} <= set(headers)


def test_a_filter_keeps_the_worlds_it_matches(page):
    apply_filter(page, "success == 1 and distance > 5")

    assert table_worlds(page) == [0, 2]
    assert page.inner_text("#page-info").startswith("2 of 4 worlds")


def test_a_column_header_sorts_the_table_largest_first_on_a_second_click(page):
    seq = page.evaluate(f"{STATE}.tableSeq")
    page.click("#table th:text-is('distance')")
    page.wait_for_function(f"{STATE}.tableSeq > {seq}")
    page.click("#table th:text-is('distance')")
    page.wait_for_function(f"{STATE}.tableSeq > {seq + 1}")

    assert table_worlds(page) == [2, 0, 1, 3]  # 7.5, 6, 2, then NaN last


def test_selected_worlds_get_one_trace_each_with_the_shared_time_cursor(page, viewed):
    select(page, 0, 2)

    lines = page.evaluate(f"{STATE}.traceWorlds")
    assert lines == [0, 2]
    dof = page.input_value("#dof")
    expected = viewed[0].viewer.viewed.states([2])[0]["qpos"][:, viewed[0].viewer.viewed.dofs.index(dof)]
    drawn = page.evaluate(f"{STATE}.traceValues[1]")
    np.testing.assert_allclose(drawn, expected)  # 51 frames: drawn as they are


def test_traces_have_a_legend_of_their_worlds_and_the_dofs_unit(page):
    select(page, 0, 2)

    items = page.eval_on_selector_all("#traces-legend .legend-item", "xs => xs.map(x => x.textContent.trim())")

    assert page.input_value("#dof") == "shoulder"  # a hinge: radians
    assert items == ["world 0", "world 2", "shoulder (rad)"]


def test_moving_the_time_cursor_poses_the_3d_view(page):
    select(page, 1)
    move_cursor(page, 0)
    first = page.locator("#view3d").screenshot()

    move_cursor(page, 45)
    later = page.locator("#view3d").screenshot()
    cursor = page.evaluate(f"{STATE}.traceCursor")
    move_cursor(page, 0)
    again = page.locator("#view3d").screenshot()

    assert later != first  # the pose changed
    assert again == first  # and it is the frame's pose, not drift
    assert cursor == pytest.approx(45 * 0.008)  # the traces' cursor moved along


def test_a_cursor_move_over_the_kept_frames_asks_the_server_nothing(page):
    select(page, 1)
    move_cursor(page, 0)
    first = page.locator("#view3d").screenshot()
    page.wait_for_function(f"{STATE}.posesKept() === {STATE}.info.frames")  # all 51 fetched
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url))

    move_cursor(page, 45)
    later = page.locator("#view3d").screenshot()
    move_cursor(page, 0)
    again = page.locator("#view3d").screenshot()

    assert not [url for url in asked if "/api/poses" in url]
    assert later != first and again == first  # kept poses are the frames' poses


def test_cursor_moves_between_two_animation_frames_draw_only_the_last(page):
    select(page, 1)
    move_cursor(page, 0)
    seq = page.evaluate(f"{STATE}.poseSeq")

    page.evaluate("() => { const t = document.querySelector('#time'); for (const f of [10, 20, 30]) "
                  "{ t.value = f; t.dispatchEvent(new Event('input')); } }")
    page.wait_for_function(f"{STATE}.poseFrame === 30")

    assert page.evaluate(f"{STATE}.poseSeq") == seq + 1  # 10 and 20 were never drawn
    assert page.inner_text("#time-label").startswith("frame 30")


def test_traces_arrive_packed_and_draw_every_frame_of_each_world(page, viewed):
    select(page, 3, 1)

    drawn = page.evaluate(f"{STATE}.traceValues")
    dof = viewed[0].viewer.viewed.dofs.index(page.input_value("#dof"))
    expected = [s["qpos"][:, dof] for s in viewed[0].viewer.viewed.states([3, 1])]
    assert page.evaluate(f"{STATE}.traceWorlds") == [3, 1]
    np.testing.assert_array_equal(drawn[0], expected[0])  # float64 sent as it is
    np.testing.assert_array_equal(drawn[1], expected[1])


def test_a_render_of_the_selected_worlds_plays_in_the_page(page, view_dir):
    select(page, 0, 2)

    page.click("#render")
    page.wait_for_function("document.querySelector('#render-status').dataset.state === 'done'",
                           timeout=240_000)
    page.wait_for_function("document.querySelector('#video').readyState >= 1")

    duration = page.evaluate("document.querySelector('#video').duration")
    assert duration == pytest.approx(51 / 25, abs=0.05)  # 51 frames at 25 fps
    videos = list((view_dir / "videos").glob("*-worlds-0-2/mosaic000/*.mp4"))
    assert len(videos) == 1  # both worlds tiled into one video, in the output folder
    assert str(view_dir / "videos") in page.inner_text("#header-out")


# ----------------------------------------------------------------------------- bad input
def test_a_filter_that_does_not_parse_says_where_and_keeps_the_table(page, viewed):
    apply_filter(page, "success = 1")

    text = message(page)
    assert "Cannot read the filter 'success = 1'" in text
    assert "Use == to compare: success == 1" in text
    assert table_worlds(page) == [0, 1, 2, 3]  # the last good table stays
    assert viewed[1].having("Cannot read the filter 'success = 1'")


def test_a_filter_naming_no_variable_suggests_the_closest(page, viewed):
    apply_filter(page, "sucess == 1")

    text = message(page)
    assert "names 'sucess', which is no world variable. Did you mean 'success'?" in text
    assert viewed[1].having("names 'sucess'")


def test_a_render_that_cannot_be_made_says_why_before_it_is_queued(page, viewed):
    select(page, 1)
    page.fill("#size", "241x320")

    page.click("#render")

    text = message(page)
    assert "(241, 320) has an odd side" in text
    assert viewed[1].having("400 POST /api/render")
    assert page.evaluate("document.querySelector('#render-status').dataset.state") is None


def test_a_wrong_token_gets_a_403_page_and_a_log_line(browser, viewed):
    served, log = viewed
    parts = urlsplit(served.url)
    context = browser.new_context()  # no cookie from other tests
    page = context.new_page()

    response = page.goto(f"{parts.scheme}://{parts.netloc}/?token=wrong")

    assert response.status == 403
    assert "Wrong access token" in page.inner_text("#message")
    assert log.having("403 GET / from 127.0.0.1: Wrong access token")
    context.close()


@pytest.mark.parametrize("path", ["/static/..%2F..%2Fapp.py", "/static/%2e%2e/%2e%2e/archive.py",
                                  "/video/..%2F..%2Frun.zarr%2Fzarr.json",
                                  "/run.zarr/zarr.json", "/api/file?path=/etc/passwd"])
def test_a_path_outside_the_viewer_is_refused(browser, viewed, path):
    parts = urlsplit(viewed[0].url)  # the token passes: only the path is wrong
    page = browser.new_page()

    response = page.goto(f"{parts.scheme}://{parts.netloc}{path}"
                         f"{'&' if '?' in path else '?'}{parts.query}")

    assert response.status == 404
    assert "nothing else is read from this machine" in page.inner_text("#message")
    body = response.body()
    assert b"import" not in body and b"archive_id" not in body and b"root:" not in body
    assert viewed[1].having("404 GET")
    page.close()


def test_an_archive_replaced_while_the_page_is_open_is_said_and_opened_again(browser, view_dir):
    from flyarchive.testing.view import open_page, serving, view_archive

    url = view_archive(str(view_dir / "replaced.zarr"))
    with serving(url, out=view_dir / "videos-replaced", backend="opengl") as (served, log):
        page = open_page(browser, served.url)
        view_archive(url, n_worlds=3, mode="w")  # written again while the page is open

        apply_filter(page, "world >= 0")
        text = message(page)
        page.click("#reopen")
        page.wait_for_function("document.querySelector('#page-info').textContent.startsWith('3 of 3')")

        assert "was replaced" in text or "replaced" in text.lower()
        assert table_worlds(page) == [0, 1, 2]
        assert log.having("replaced")
        page.close()


def test_frames_appended_while_the_page_is_open_are_said_and_shown_when_opened_again(browser, view_dir):
    from flyarchive.testing import tiny_model
    from flyarchive.testing.fixtures import record
    from flyarchive.testing.view import open_page, serving, view_archive

    url = view_archive(str(view_dir / "grown.zarr"), n_steps=100)  # 26 frames a world
    with serving(url, out=view_dir / "videos-grown", backend="opengl") as (served, log):
        page = open_page(browser, served.url)
        page.wait_for_function(f"{STATE}.changesSeq === 1")  # asked as the page opened
        quiet = page.is_hidden("#message")
        record(tiny_model(), url, n_worlds=4, n_steps=200, mode="a")  # 25 frames more each

        page.evaluate(f"{STATE}.checkChanges()")  # what the page asks every 15 s
        page.wait_for_function(f"{STATE}.changesSeq === 2")
        text = page.inner_text("#message")
        seq = page.evaluate(f"{STATE}.tableSeq")
        page.click("#reopen")
        page.wait_for_function(f"{STATE}.tableSeq > {seq}")
        header = page.inner_text("#archive")
        frames = page.eval_on_selector_all("#table tbody tr td:nth-child(2)",
                                           "cells => cells.map(c => c.textContent)")

        assert quiet
        assert "changed since the viewer opened it: 100 more frames in 4 worlds." in text
        assert frames == ["51"] * 4 and "4 worlds x 51 frames" in header
        page.close()


def test_world_variables_set_while_the_page_is_open_are_said_and_filter_when_opened_again(
        browser, view_dir):
    """gait --save or set-world-var beside an open viewer: the table filtered on the values
    of when the viewer opened, and a new variable was 'no world variable'."""
    import flyarchive
    from flyarchive.testing.view import open_page, serving, view_archive

    url = view_archive(str(view_dir / "variables.zarr"))  # success 1, 0, 1, 0
    with serving(url, out=view_dir / "videos-variables", backend="opengl") as (served, log):
        page = open_page(browser, served.url)
        page.wait_for_function(f"{STATE}.changesSeq === 1")
        flyarchive.add_world_vars(url, {"success": [0, 1, 0, 1]}, overwrite=True)
        flyarchive.add_world_vars(url, {"speed": [1.0, 2.0, 3.0, 4.0]})

        page.evaluate(f"{STATE}.checkChanges()")
        page.wait_for_function(f"{STATE}.changesSeq === 2")
        text = page.inner_text("#message")
        seq = page.evaluate(f"{STATE}.tableSeq")
        page.click("#reopen")
        page.wait_for_function(f"{STATE}.tableSeq > {seq}")
        apply_filter(page, "success == 1 and speed > 3")

        assert "world variables success, speed added, replaced or removed" in text
        assert table_worlds(page) == [3]
        page.close()


def test_a_brush_over_variables_named_as_python_keywords_or_with_spaces_filters(browser,
                                                                                view_dir):
    """A variable named class was on the scatter's axes, and its brush wrote 'class >= ...',
    which the filter could not read: the brush was dropped."""
    import flyarchive
    from flyarchive.testing.view import open_page, serving, view_archive

    url = view_archive(str(view_dir / "keywords.zarr"))
    flyarchive.add_world_vars(url, {"class": [0.0, 1.0, 2.0, 3.0], "wing span": [5.0, 6.0, 7.0, 9.0]})
    with serving(url, out=view_dir / "videos-keywords", backend="opengl") as (served, log):
        page = open_page(browser, served.url)
        page.wait_for_function(f"{STATE}.scatterSeq >= 1")
        page.select_option("#scatter-x", "class")
        page.select_option("#scatter-y", "wing span")
        page.wait_for_function(f"{STATE}.scatter && {STATE}.scatter.x === 'class' && "
                               f"{STATE}.scatter.y === 'wing span'")  # the last answer drawn
        points = {p["world"]: p for p in page.evaluate(f"{STATE}.scatterPoints()")}
        box = page.locator("#scatter").bounding_box()
        seq = page.evaluate(f"{STATE}.tableSeq")

        page.mouse.move(box["x"] + points[1]["px"] - 4, box["y"] + min(points[1]["py"], points[2]["py"]) - 4)
        page.mouse.down()
        page.mouse.move(box["x"] + points[2]["px"] + 4, box["y"] + max(points[1]["py"], points[2]["py"]) + 4,
                        steps=4)
        page.mouse.up()
        page.wait_for_function(f"{STATE}.tableSeq > {seq} || {STATE}.errors > 0")

        assert page.evaluate(f"{STATE}.errors") == 0
        assert table_worlds(page) == [1, 2]
        page.close()


def test_a_page_without_a_model_shows_the_table_and_says_why_there_is_no_3d_view(browser, view_dir):
    from flyarchive.testing import tiny_model
    from flyarchive.testing.fixtures import record
    from flyarchive.testing.view import open_page, serving

    url = record(tiny_model(), str(view_dir / "no-model.zarr"), store_model=False)
    with serving(url, out=view_dir / "videos-none", backend="opengl") as (served, log):
        page = open_page(browser, served.url)

        page.click("#table tbody tr[data-world='0']")
        page.wait_for_function(f"{STATE}.gaitError")

        assert table_worlds(page) == [0, 1]
        assert "No 3D view" in page.inner_text("#view3d-note")
        assert page.is_disabled("#render")
        assert log.having("no 3D view or renders")
        note = page.inner_text("#gait-note")
        assert note.startswith("No gait: The archive at ") and "keeps no model" in note
        assert "--model FILE" in note and "\n" not in note
        assert page.get_attribute("#gait-note", "class") == "error"
        assert not log.having("GET /api/gait")  # known from /api/model: not asked
        page.close()


def test_a_model_without_a_fly_says_why_there_is_no_gait_without_a_failed_request(
        browser, view_dir):
    from flyarchive.testing import tiny_model
    from flyarchive.testing.fixtures import record
    from flyarchive.testing.view import serving, wait_ready

    url = record(tiny_model(), str(view_dir / "no-fly.zarr"))
    with serving(url, out=view_dir / "videos-no-fly", backend="opengl") as (served, log):
        page = browser.new_page(viewport={"width": 1280, "height": 860})
        errors = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(served.url)
        wait_ready(page)

        page.click("#table tbody tr[data-world='0']")
        page.click("#table tbody tr[data-world='1']", modifiers=["Control"])
        page.wait_for_function(f"{STATE}.gaitError")

        note = page.inner_text("#gait-note")
        assert note.startswith("No gait: the model has no thorax named as a flygym fly's")
        assert not page.is_disabled("#render")  # the model is there: renders are
        assert not log.having("GET /api/gait") and errors == []
        page.close()



def test_control_characters_in_world_variable_text_are_shown_escaped(browser, view_dir):
    import flyarchive
    from flyarchive.testing.view import open_page, serving, view_archive

    url = view_archive(str(view_dir / "texts.zarr"))
    texts = ["\x1b[31mred\x1b[0m", "\u202eevil.exe", "<img src=x onerror=window.pwned=1>",
             "line\u2028two\x00end"]
    flyarchive.add_world_vars(url, {"label": np.array(texts)})
    with serving(url, out=view_dir / "videos-texts", backend="opengl") as (served, _):
        page = open_page(browser, served.url)
        column = page.eval_on_selector_all("#table th", "hs => hs.map(h => h.textContent)")
        cells = page.eval_on_selector_all(
            f"#table tbody td:nth-child({column.index('label') + 1})", "ds => ds.map(d => d.textContent)")
        pwned = page.evaluate("window.pwned")
        page.close()

    assert cells == ["\\x1b[31mred\\x1b[0m", "\\u202eevil.exe", "<img src=x onerror=window.pwned=1>",
                     "line\\u2028two\\x00end"]
    assert pwned is None


@pytest.mark.s3
def test_an_s3_endpoint_down_mid_session_is_said_on_the_page_and_it_recovers(browser, view_dir,
                                                                           s3_server):
    import uuid

    from flyarchive.testing.faultproxy import FaultPlan, FaultProxy
    from flyarchive.testing.fixtures import copy_archive
    from flyarchive.testing.view import open_page, serving, view_archive

    url = copy_archive(view_archive(str(view_dir / "for-s3.zarr")),
                       f"s3://flyarchive-test/{uuid.uuid4().hex}.zarr", s3_server.storage_options())
    with FaultProxy(s3_server.endpoint_url) as proxy, \
            serving(url, storage_options=proxy.storage_options(), out=view_dir / "videos-s3",
                    backend="opengl") as (served, log):
        page = open_page(browser, served.url)
        proxy.plan = FaultPlan(drop=1.0)

        apply_filter(page, "success == 1")
        text = message(page)
        proxy.plan = FaultPlan()
        page.wait_for_function(f"{STATE}.errors >= 1")
        for _ in range(30):  # the check under way ends when the storage answers again
            apply_filter(page, "success == 1")
            if table_worlds(page) == [0, 2]:
                break
        worlds = table_worlds(page)
        page.close()

    assert "The archive's storage did not answer" in text and "keeps running" in text
    assert worlds == [0, 2]
    assert log.having("503 GET /api/table")


def test_a_render_is_cancelled_from_the_page_and_leaves_nothing(browser, view_dir, monkeypatch):
    from pathlib import Path

    import flyarchive
    from flyarchive.testing.view import open_page, render_until_stopped, serving, view_archive

    stopped = []

    def rendering(url, model, camera, out, **kwargs):  # runs until it is stopped
        render_until_stopped(out, stopped.append)

    url = view_archive(str(view_dir / "cancelled.zarr"))
    monkeypatch.setattr(flyarchive, "render_videos", rendering)
    with serving(url, out=view_dir / "videos-cancelled", backend="opengl") as (served, log):
        page = open_page(browser, served.url)
        page.wait_for_function(f"{STATE}.ready")
        select(page, 1)
        page.click("#render")
        page.wait_for_function("document.querySelector('#render-status').dataset.state === "
                               "'running'")
        page.click("#render-cancel .cancel-render")
        page.wait_for_function("document.querySelector('#render-status').dataset.state === "
                               "'cancelled'")

        assert "cancelled while it rendered; nothing of it was kept" in page.inner_text("#message")
        assert len(stopped) == 1 and not Path(stopped[0]).exists()
        assert page.inner_html("#render-cancel") == ""  # no button once it ended
        page.close()

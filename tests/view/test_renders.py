"""Renders asked of the viewer (issue 33): the queue is bounded per page and in all (429
with the wait), pages are served in turn, the job table keeps the last few jobs, the output
folder removed while a render runs is said and made again, and a video is served by byte
ranges with bad ranges refused."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flyarchive.testing.markers import requires_view
from flyarchive.testing.view import ask, origin, render_until_stopped

pytestmark = requires_view

#: A render of two frames, small: about a second on the 2-core machine.
SHORT = {"camera": "front", "size": "64x64", "start": 0.0, "end": 0.01}


@pytest.fixture(scope="module")
def view_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    from flyarchive.testing.view import view_archive

    return view_archive(str(tmp_path_factory.mktemp("view-renders") / "run.zarr"))


@pytest.fixture
def served(view_url: str, tmp_path: Path) -> Iterator[tuple[Any, Any]]:
    from flyarchive.testing.view import serving
    from flyarchive.view.limits import Limits

    limits = Limits(max_queued_per_client=1, max_queued_renders=2, max_jobs=3)
    with serving(view_url, out=tmp_path / "videos", backend="opengl", limits=limits) as found:
        found[0].viewer.load_model()
        yield found


def post(served: Any, body: dict[str, Any], client: str) -> tuple[int, dict[str, str], Any]:
    status, headers, text = ask(f"{origin(served)}/api/render", method="POST", body=body,
                                headers={"X-Flyarchive-Token": served.token,
                                         "X-Flyarchive-Client": client,
                                         "Content-Type": "application/json"})
    return status, headers, json.loads(text)


def finished(served: Any, number: int, timeout: float = 120) -> dict[str, Any]:
    """Job ``number`` once it is done or failed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, _, text = ask(f"{origin(served)}/api/render/{number}",
                              headers={"X-Flyarchive-Token": served.token})
        job = json.loads(text)
        if status != 200 or job["state"] in ("done", "failed"):
            return job
        time.sleep(0.05)
    raise AssertionError(f"render {number} did not finish in {timeout} s")


def test_100_render_requests_of_one_page_in_a_burst_are_bounded_with_the_wait(served):
    viewer = served[0].viewer

    answers = [post(served[0], {"worlds": [0], **SHORT}, "page-a") for _ in range(100)]
    other = post(served[0], {"worlds": [1], **SHORT}, "page-b")

    accepted = [a for a in answers if a[0] == 200]
    refused = [a for a in answers if a[0] == 429]
    assert len(accepted) + len(refused) == 100
    assert 1 <= len(accepted) <= 4  # one running, one waiting (more if renders ended meanwhile)
    assert int(refused[0][1]["Retry-After"]) >= 1
    assert "This page has 1 renders waiting already" in refused[0][2]["error"]
    assert other[0] == 200  # another page still gets its turn
    assert len(viewer.renders.jobs) <= 3 + 2  # the table: the last 3, and those not finished


@pytest.mark.slow  # four renders
def test_pages_are_served_in_turn_not_in_the_order_they_asked(view_url, tmp_path):
    from flyarchive.testing.view import serving
    from flyarchive.view.limits import Limits

    limits = Limits(max_queued_per_client=3, max_queued_renders=8)
    with serving(view_url, out=tmp_path / "videos", backend="opengl", limits=limits) as (served, _):
        served.viewer.load_model()
        a = [post(served, {"worlds": [0], **SHORT}, "page-a")[2]["id"] for _ in range(3)]
        b = post(served, {"worlds": [1], **SHORT}, "page-b")[2]["id"]
        jobs = {n: finished(served, n) for n in (*a, b)}
        order = sorted(jobs, key=lambda n: served.viewer.renders.jobs[n].started)

    assert all(job["state"] == "done" for job in jobs.values())
    assert order.index(b) < order.index(a[2])  # first come, first served would put b last


def test_the_job_table_forgets_the_oldest_finished_jobs(view_url, tmp_path):
    from flyarchive.testing.view import serving
    from flyarchive.view.limits import Limits

    with serving(view_url, out=tmp_path / "videos", backend="opengl",
                 limits=Limits(max_jobs=1)) as (server, _):
        server.viewer.load_model()
        _, _, first = post(server, {"worlds": [0], **SHORT}, "page-a")
        finished(server, first["id"])
        _, _, second = post(server, {"worlds": [1], **SHORT}, "page-a")

        status, _, text = ask(f"{origin(server)}/api/render/{first['id']}",
                              headers={"X-Flyarchive-Token": server.token})
        done = finished(server, second["id"])

    assert status == 400
    assert f"No render '{first['id']}' in this viewer (it remembers the last 1)" in \
        json.loads(text)["error"]
    assert done["state"] == "done"
    assert Path(first["folder"]).is_dir()  # its video stays in the output folder


def test_an_output_folder_removed_while_a_render_runs_is_said_and_made_again(served,
                                                                           monkeypatch):
    import threading

    import flyarchive

    server, log = served
    out = Path(server.viewer.out)
    real, removed = flyarchive.render_videos, threading.Event()

    def first_render(url, model, camera, folder, **kwargs):  # the folder goes mid-render
        monkeypatch.setattr(flyarchive, "render_videos", real)  # the next render is real
        parts = Path(folder) / ".parts-1"
        parts.mkdir()
        removed.wait(60)
        (parts / "segment.mp4").write_bytes(b"")  # as a render's next segment: no folder

    monkeypatch.setattr(flyarchive, "render_videos", first_render)
    status, _, job = post(server, {"worlds": [0], "camera": "front"}, "page-a")
    assert status == 200
    deadline = time.monotonic() + 60
    folder = Path(job["folder"])
    while not (folder / ".parts-1").is_dir():  # the render has begun to write
        assert time.monotonic() < deadline
        time.sleep(0.005)
    shutil.rmtree(out)
    removed.set()

    failed = finished(server, job["id"])
    status, _, again = post(server, {"worlds": [0], **SHORT}, "page-a")
    done = finished(server, again["id"])

    assert failed["state"] == "failed"
    assert "was removed while it rendered; the next render makes it again" in failed["message"]
    assert log.having(f"render {job['id']} failed")
    assert done["state"] == "done" and out.is_dir()
    video_status, headers, body = ask(f"{origin(server)}{done['video']}",
                                      headers={"X-Flyarchive-Token": server.token})
    assert video_status == 200 and headers["Content-Type"] == "video/mp4" and body[4:8] == b"ftyp"


@pytest.fixture(scope="module")
def video(view_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, str]]:
    """``(served, log, path)``: a viewer and the address of a video it rendered."""
    from flyarchive.testing.view import serving

    out = tmp_path_factory.mktemp("view-video") / "videos"
    with serving(view_url, out=out, backend="opengl") as (server, log):
        server.viewer.load_model()
        _, _, job = post(server, {"worlds": [0], **SHORT}, "page-a")
        yield server, log, finished(server, job["id"])["video"]


@pytest.mark.parametrize("value, status", [
    ("bytes=0-99", 206),
    ("bytes=0-" + "9" * 5000, 416),  # past Python's int digits: refused, not a 500
    ("bytes=0-1,4-5", 416),  # several ranges: not served
    ("bytes=99999999999999-", 416),
    ("chunks=0-9", 416),
])
def test_a_video_is_served_by_byte_ranges_and_bad_ranges_are_refused(video, value, status):
    server, log, path = video

    got, headers, body = ask(f"{origin(server)}{path}",
                             headers={"X-Flyarchive-Token": server.token, "Range": value})

    assert got == status
    if status == 206:
        assert len(body) == 100 and headers["Content-Range"].startswith("bytes 0-99/")
    assert not log.having("internal error")


def test_the_render_thread_runs_at_a_lower_priority_than_the_server(served):
    import os
    import sys
    import threading

    if not sys.platform.startswith("linux"):
        pytest.skip("per-thread nice values are Linux's")
    server, _ = served
    server.viewer.renders.warm()  # starts the render thread
    thread = server.viewer.renders._thread
    deadline = time.monotonic() + 30
    ours = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    while os.getpriority(os.PRIO_PROCESS, thread.native_id) == ours:  # set as it starts
        assert time.monotonic() < deadline
        time.sleep(0.01)

    assert thread.name == "flyarchive-view-render"
    assert os.getpriority(os.PRIO_PROCESS, thread.native_id) == min(19, ours + 10)


# ----------------------------------------------------------------------------- brushed worlds
@pytest.fixture(scope="module")
def walker_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    from flyarchive.testing.view import walker_view_archive

    return walker_view_archive(str(tmp_path_factory.mktemp("view-renders-walker") / "walker.zarr"))


def post_many(served: Any, worlds: list[int], client: str) -> tuple[int, dict[str, str], Any]:
    status, headers, text = ask(f"{origin(served)}/api/renders", method="POST",
                                body={"worlds": worlds, "camera": "top", "size": "48x64",
                                      "start": 0.0, "end": 0.008},
                                headers={"X-Flyarchive-Token": served.token,
                                         "X-Flyarchive-Client": client,
                                         "Content-Type": "application/json"})
    return status, headers, json.loads(text)


def test_brushed_worlds_are_queued_as_even_mosaics_as_far_as_the_queue_takes_them(walker_url,
                                                                                  tmp_path):
    from flyarchive.testing.view import serving
    from flyarchive.view.limits import Limits

    limits = Limits(max_queued_per_client=1, max_queued_renders=2)
    with serving(walker_url, out=tmp_path / "videos", backend="opengl", limits=limits) as (served, _):
        status, _, answer = post_many(served, list(range(18)), "page-a")
        done = finished(served, answer["jobs"][0]["id"])

    assert status == 200
    assert [job["worlds"] for job in answer["jobs"]] == [list(range(9))]  # 18 by 16: 9 and 9
    assert answer["queued"] == list(range(9)) and answer["not_queued"] == list(range(9, 18))
    assert answer["message"].startswith("Queued 1 render of 9 worlds (at most 16 tiled in a video). "
                                        "9 worlds were not queued: This page has 1 renders "
                                        "waiting already")
    assert done["state"] == "done" and done["frames"] == 2


def test_brushed_worlds_that_the_queue_cannot_take_answer_429_with_the_wait(walker_url, tmp_path):
    from flyarchive.testing.view import serving
    from flyarchive.view.limits import Limits

    with serving(walker_url, out=tmp_path / "videos", backend="opengl",
                 limits=Limits(max_queued_renders=0)) as (served, log):
        status, headers, answer = post_many(served, list(range(20)), "page-a")

        assert status == 429 and int(headers["Retry-After"]) >= 1
        assert answer["error"].startswith("0 renders are waiting already, the most the viewer keeps")
        assert served.viewer.renders.jobs == {}
        assert log.having("429 POST /api/renders")


def test_a_viewer_stopped_while_it_renders_stops_the_render_and_leaves_no_partial_folder(
        view_url, tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM of `flyarchive view` mid-render left the render's folder with its
    resume files (.parts-*/run.json, run.lock) and no video: render_videos ran on the
    viewer's render thread, which the interrupt never reached."""
    import flyarchive
    from flyarchive.testing.view import serving

    seen = []

    def rendering(url, model, camera, out, **kwargs):  # as render_videos: partial files first
        render_until_stopped(out, lambda _: seen.append("interrupted"))

    monkeypatch.setattr(flyarchive, "render_videos", rendering)
    with serving(view_url, out=tmp_path / "videos", backend="opengl") as (served, log):
        served.viewer.load_model()
        job = served.viewer.renders.submit([0], "front", None, None, (48, 64))
        deadline = time.monotonic() + 60
        while not (job.folder / ".parts-1" / "run.json").exists() and time.monotonic() < deadline:
            time.sleep(0.01)

    assert seen == ["interrupted"]
    assert job.state == "failed" and "stopped while it rendered" in job.message
    assert not job.folder.exists()


def test_two_viewers_of_one_output_folder_render_into_folders_of_their_own(view_url, tmp_path):
    """Both numbered their first render 1 and chose its folder as it queued: the second
    wrote into the first's and failed ("Pass overwrite=True", which view has not)."""
    from flyarchive.testing.view import serving

    out = tmp_path / "videos"
    with serving(view_url, out=out, backend="opengl") as (one, _), \
            serving(view_url, out=out, backend="opengl") as (two, _):
        one.viewer.load_model()
        two.viewer.load_model()
        jobs = [v.viewer.renders.submit([0], "front", 0.0, 0.01, (64, 64)) for v in (one, two)]
        states = [finished(v, 1)["state"] for v in (one, two)]

    assert states == ["done", "done"]
    assert jobs[0].folder != jobs[1].folder
    assert all(job.video is not None and job.video.is_file() for job in jobs)


def test_a_render_cancelled_waiting_never_runs_one_cancelled_running_stops_and_the_next_runs(
        view_url, tmp_path, monkeypatch):
    """A render could not be cancelled: a large one held the render thread for minutes."""
    from types import SimpleNamespace

    import flyarchive
    from flyarchive.testing.view import serving
    from flyarchive.view.limits import Limits

    asked, seen = [], []

    def rendering(url, model, camera, out, **kwargs):  # the first runs until stopped
        asked.append(kwargs["worlds"])
        if len(asked) == 1:
            render_until_stopped(out, lambda _: seen.append("interrupted"))
        video = Path(out) / "video.mp4"
        video.write_bytes(b"\0")
        return SimpleNamespace(videos=[{"path": str(video), "frames": 2, "fps": 25.0}])

    monkeypatch.setattr(flyarchive, "render_videos", rendering)
    limits = Limits(max_queued_per_client=4, max_queued_renders=4)
    with serving(view_url, out=tmp_path / "videos", backend="opengl", limits=limits) as (served,
                                                                                         log):
        served.viewer.load_model()
        first, second, third = (served.viewer.renders.submit([w], "front", None, None, (48, 64))
                                for w in (0, 1, 2))
        deadline = time.monotonic() + 60
        while not (first.folder / ".parts-1").exists() and time.monotonic() < deadline:
            time.sleep(0.01)

        def cancel(number: int) -> tuple[int, dict[str, Any]]:
            status, _, text = ask(f"{origin(served)}/api/render/{number}/cancel", method="POST",
                                  headers={"X-Flyarchive-Token": served.token})
            return status, json.loads(text)

        waiting = cancel(second.id)
        running = cancel(first.id)
        done = finished(served, third.id)
        again = cancel(third.id)  # finished: stays as it is
        unknown = cancel(999)

    assert waiting == (200, {**waiting[1], "state": "cancelled",
                             "message": "cancelled before it started"})
    assert running[0] == 200 and running[1]["state"] == "running"  # stopping
    assert first.state == "cancelled" and first.message == "cancelled while it rendered"
    assert seen == ["interrupted"] and not first.folder.exists()
    assert asked == [[0], [2]]  # the cancelled waiting one never ran; the thread went on
    assert done["state"] == "done" and again[1]["state"] == "done"
    assert unknown[0] == 400 and "No render '999'" in unknown[1]["error"]

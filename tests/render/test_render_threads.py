"""OpenGL on render threads of this process (the default placement of ``"opengl"``): each
thread with its own GL context, segments taken in order and joined per video; the videos
are those of one thread (the pictures of a joined video barely differ from one encode); a
failed segment stops the others and its error is raised; Ctrl-C stops the threads and
keeps the videos finished before it; every thread's GL context is freed at the end.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from flyarchive.distribute.api import RenderOptions, render_videos
from flyarchive.errors import CorruptArchiveError
from flyarchive.render import opengl_pipeline as opengl
from flyarchive.testing.fixtures import record
from flyarchive.video import VideoOptions, read_video

CAMERAS = ["front", "top"]
# Segments of 6 frames of 11: 6 + 5 per world, 4 segments on 2 threads.
OPTIONS = RenderOptions(size=(48, 64), segment_frames=6, video=VideoOptions(threads=1))


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> str:
    """Worlds 3 and 7 of the tiny model, 11 frames each, recorded once: tests only read it."""
    from flyarchive.testing import tiny_model

    return record(tiny_model(), str(tmp_path_factory.mktemp("threads") / "tiny.zarr"),
                  world_ids=[3, 7], n_steps=40)


@pytest.fixture
def two_cores(monkeypatch):
    """Two render threads, whatever this machine has."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)


def render_threads_left() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("flyarchive-render-")]


def test_threads_render_every_video_as_one_thread_does(archive, tiny, tmp_path, two_cores,
                                                       monkeypatch):
    seen = set()
    segment = opengl.render_segment
    monkeypatch.setattr(opengl, "render_segment", lambda *a, **k: seen.add(
        threading.current_thread().name) or segment(*a, **k))

    threads = render_videos(archive, tiny, CAMERAS, str(tmp_path / "threads"), options=OPTIONS)
    here = render_videos(archive, tiny, CAMERAS, str(tmp_path / "here"), options=OPTIONS,
                         n_workers=0)

    assert seen >= {"flyarchive-render-0", "flyarchive-render-1"}
    expected = {(v["world"], v["camera"]): v for v in here.videos}
    assert [(v["world"], v["camera"]) for v in threads.videos] == list(expected)  # plan order
    for video in threads.videos:
        frames = read_video(video["path"]).astype(float)
        alone = read_video(expected[(video["world"], video["camera"])]["path"]).astype(float)
        assert frames.shape == alone.shape == (11, 48, 64, 3)
        assert np.abs(frames - alone).mean() < 2.0  # joined segments: other keyframes
    listed = json.loads(Path(threads.manifest).read_text())["videos"]
    assert sorted(v["path"] for v in listed) == sorted(v["path"] for v in threads.videos)
    assert not list((tmp_path / "threads").glob(".parts-*"))
    assert render_threads_left() == []


def test_a_failed_segment_stops_the_other_threads_and_its_error_is_raised(
        archive, tiny, tmp_path, two_cores, monkeypatch):
    segment, started = opengl.render_segment, []

    def failing(plan, blob, parts, job, k0, k1, **kwargs):
        started.append((job.world_id, k0))
        if (job.world_id, k0) == (3, 6):
            raise CorruptArchiveError("world 3, frames 6..10: damaged (a test)")
        return segment(plan, blob, parts, job, k0, k1, **kwargs)

    monkeypatch.setattr(opengl, "render_segment", failing)

    with pytest.raises(CorruptArchiveError, match="a test"):
        render_videos(archive, tiny, CAMERAS, str(tmp_path / "v"), options=OPTIONS)

    assert len(started) < 4  # the segments after the failure were not begun
    assert not list((tmp_path / "v").rglob("*.mp4"))  # world 3 was never finished
    assert render_threads_left() == []


def test_ctrl_c_stops_the_threads_and_keeps_the_videos_finished_before(
        archive, tiny, tmp_path, two_cores, monkeypatch):
    segment, join, joined = opengl.render_segment, opengl.join_segments, []

    def held(plan, blob, parts, job, k0, k1, *, stopped, **kwargs):
        if job.world_id == 7 and k0 > 0:  # world 7 cannot finish before the stop
            for _ in range(3000):
                if stopped():
                    break
                time.sleep(0.01)
        return segment(plan, blob, parts, job, k0, k1, stopped=stopped, **kwargs)

    def joining(*args, **kwargs):
        entry = join(*args, **kwargs)
        joined.append(entry["path"])
        if len(joined) == 2:  # world 3's two videos: Ctrl-C reaches the main thread
            os.kill(os.getpid(), signal.SIGINT)
        return entry

    monkeypatch.setattr(opengl, "render_segment", held)
    monkeypatch.setattr(opengl, "join_segments", joining)
    out = tmp_path / "v"

    with pytest.raises(KeyboardInterrupt):
        render_videos(archive, tiny, CAMERAS, str(out), options=OPTIONS)

    listed = [v["path"] for v in json.loads((out / "manifest.json").read_text())["videos"]]
    assert listed == [str(out / "world00003" / f"{c}.mp4") for c in CAMERAS]
    assert sorted(str(p) for p in out.rglob("*.mp4")) == sorted(listed)
    assert not list(out.glob(".parts-*"))
    assert render_threads_left() == []


def test_the_second_context_is_made_after_the_first_frame_and_each_is_freed(
        archive, tiny, tmp_path, two_cores, monkeypatch):
    from flyarchive.replay.opengl_frames import OpenGLRenderer
    from flyarchive.video.output_files import OutputWriter

    events = []
    init, close, write = OpenGLRenderer.__init__, OpenGLRenderer.close, OutputWriter.write
    name = lambda: threading.current_thread().name  # noqa: E731
    monkeypatch.setattr(OpenGLRenderer, "__init__", lambda self, *a, **k: (
        events.append(("made", name())), init(self, *a, **k))[1])
    monkeypatch.setattr(OpenGLRenderer, "close", lambda self: (
        events.append(("freed", name())) if self._renderer is not None else None,
        close(self))[1])
    monkeypatch.setattr(OutputWriter, "write", lambda self, *a, **k: (
        events.append(("frame", name())), write(self, *a, **k))[1])

    render_videos(archive, tiny, CAMERAS, str(tmp_path / "v"), options=OPTIONS)

    made = [e for e in events if e[0] == "made"]
    assert made == [("made", "flyarchive-render-0"), ("made", "flyarchive-render-1")]
    assert events.index(("frame", "flyarchive-render-0")) < events.index(made[1])
    assert sorted(e for e in events if e[0] == "freed") == [
        ("freed", "flyarchive-render-0"), ("freed", "flyarchive-render-1")]

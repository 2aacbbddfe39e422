"""Archive -> mp4 on the Warp batch renderer (backend "warp-cpu": Warp's CPU device).

What every backend does with an archive (frame k shows state k, NaN frames black) is in
the replay conformance suite (tests/replay/test_warp.py::TestWarpReplay).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from flyarchive.distribute.api import RenderOptions, render_videos
from flyarchive.query.selection import VideoJob
from flyarchive.errors import OutputExistsError, RenderBackendError
from flyarchive.testing import (
    block_columns,
    flip_bits,
    shard_file,
    slider_columns,
    slider_model,
    tiny_model,
)
from flyarchive.testing.fixtures import record, slider_archive
from flyarchive.testing.markers import WARP_BACKEND, WARP_DEVICE, requires_no_cuda, requires_warp
from flyarchive.video import VideoOptions, read_video
from flyarchive.video.manifest import read_manifest

pytestmark = [requires_warp, pytest.mark.timeout(600)]

SIZE = (48, 64)  # (height, width)
# Warp's CPU device in CI; FLYARCHIVE_TEST_WARP_DEVICE=cuda runs these tests on a GPU ("gpu").
BACKEND = WARP_BACKEND
WARP = RenderOptions(backend=BACKEND, size=SIZE, batch_worlds=8)
SLIDER_FRAMES = 11  # not a multiple of the batch: videos straddle batches


def render_here(*args, **kwargs):
    """``render_videos`` in this process (warp-cpu would start a LocalCluster)."""
    return render_videos(*args, n_workers=0, **kwargs)


def record_tiny(url: str, n_worlds: int = 3, n_steps: int = 40) -> None:
    """A float64 CPU recording of the tiny model: 11 frames per world (every 4 steps)."""
    record(tiny_model(), url, n_worlds=n_worlds, n_steps=n_steps, chunk_frames=8)


def slider_qpos(n_worlds: int, n_frames: int) -> np.ndarray:
    """``(worlds, frames, 1)`` slider positions, shuffled in time and different per world."""
    rng = np.random.default_rng(7)
    xs = np.linspace(-0.8, 0.8, n_frames)
    return np.stack([rng.permutation(xs) for _ in range(n_worlds)])[..., None]


@pytest.fixture(scope="module")
def tiny_archive(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = str(tmp_path_factory.mktemp("tiny") / "run.zarr")
    record_tiny(url)
    return url


@pytest.fixture(scope="module")
def slider_worlds(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, np.ndarray]:
    url = str(tmp_path_factory.mktemp("slider") / "run.zarr")
    qpos = slider_qpos(2, SLIDER_FRAMES)
    return slider_archive(url, qpos), qpos


@pytest.fixture(scope="module", autouse=True)
def warm_warp() -> None:
    """Import mujoco-warp and load its cached kernels once for the module."""
    from flyarchive.replay.warp_frames import WarpBatchRenderer

    WarpBatchRenderer(slider_model(), "front", SIZE, batch_worlds=1, device=WARP_DEVICE)


# -- packing ----------------------------------------------------------------------


def test_batches_are_full_world_major_and_keep_frame_order():
    from flyarchive.render.plan import pack_batches

    jobs = [VideoJob(0, 0, 0, 5), VideoJob(3, 2, 2, 9)]

    batches = pack_batches(jobs, 4)

    assert [b.n for b in batches] == [4, 4, 4]
    flat = [(p.job, k) for b in batches for p in b.pieces for k in range(p.start, p.stop)]
    assert flat == [(0, k) for k in range(5)] + [(1, k) for k in range(2, 9)]
    assert all(p.offset + p.n <= 4 for b in batches for p in b.pieces)


def test_batches_with_lanes_feed_that_many_videos_each_in_frame_order():
    from flyarchive.render.plan import pack_batches

    jobs = [VideoJob(w, w, 0, 12) for w in range(5)] + [VideoJob(9, 9, 3, 7)]

    batches = pack_batches(jobs, 8, lanes=4)

    assert [b.n for b in batches[:-1]] == [8] * (len(batches) - 1)  # all full but the last
    assert sum(b.n for b in batches) == 5 * 12 + 4
    assert all(len({p.job for p in b.pieces}) == 4 for b in batches[:2])  # 4 videos at once
    for j, job in enumerate(jobs):
        frames = [k for b in batches for p in b.pieces if p.job == j for k in range(p.start, p.stop)]
        assert frames == list(range(job.start, job.stop))
    for b in batches:  # the pieces tile the batch
        assert sorted((p.offset, p.offset + p.n) for p in b.pieces) == [
            (o, o + n) for o, n in sorted((p.offset, p.n) for p in b.pieces)]
        assert sum(p.n for p in b.pieces) == b.n and max(p.offset + p.n for p in b.pieces) == b.n


def test_groups_hold_whole_videos_of_about_equal_frames():
    from flyarchive.render.plan import split_groups

    jobs = [VideoJob(w, w, 0, 10) for w in range(6)]

    groups = split_groups(jobs, 8, 3)

    assert [len(g) for g in groups] == [2, 2, 2]
    assert [j for g in groups for j in g] == jobs


@requires_no_cuda
def test_gpu_backend_without_cuda_suggests_the_cpu_backends():
    from flyarchive.render.warp_pipeline import warp_device

    with pytest.raises(RenderBackendError, match="warp-cpu"):
        warp_device("gpu")


# -- archive -> mp4 ---------------------------------------------------------------


def test_one_video_per_world_and_camera_with_every_frame(tiny_archive, tmp_path):
    out = tmp_path / "videos"

    result = render_here(tiny_archive, tiny_model(), ["front", "top"], str(out), options=WARP)

    expected = [(w, c) for w in (0, 1, 2) for c in ("front", "top")]
    assert [(v["world"], v["camera"]) for v in result.videos] == expected
    for video in result.videos:
        frames = read_video(video["path"])
        assert frames.shape == (11, *SIZE, 3) == (video["frames"], *SIZE, 3)
        assert frames.std() > 5  # a scene, not a blank frame
    manifest = json.loads(Path(result.manifest).read_text())
    assert [v["path"] for v in manifest["videos"]] == [v["path"] for v in result.videos]
    assert [v["backend"] for v in manifest["videos"]] == [BACKEND] * len(expected)


def test_time_window_and_world_subset(slider_worlds, tmp_path):
    url, qpos = slider_worlds
    window = (0.03, 0.07)  # frames 3..7 (time = 0.01 k)

    result = render_here(url, slider_model(), "front", str(tmp_path / "v"), worlds=[1],
                           time=window, options=WARP)

    (video,) = result.videos
    assert (video["world"], video["first_frame"], video["frames"]) == (1, 3, 5)
    assert not (tmp_path / "v" / "world00000").exists()
    actual = block_columns(read_video(video["path"]))
    np.testing.assert_allclose(actual, slider_columns(qpos[1, 3:8, 0], SIZE), atol=1.5)


def test_batches_feeding_several_videos_at_once_make_the_same_videos(tiny_archive, tmp_path,
                                                                      monkeypatch):
    lossless = VideoOptions(crf=0, preset="ultrafast")
    one_by_one = RenderOptions(backend=BACKEND, size=SIZE, batch_worlds=4, video=lossless)
    together = RenderOptions(backend=BACKEND, size=SIZE, batch_worlds=32, video=lossless)
    monkeypatch.setenv("FLYARCHIVE_ENCODERS", "3")  # 3 lanes: 32 states, 3 worlds x 11 frames

    a = render_here(tiny_archive, tiny_model(), "front", str(tmp_path / "a"), options=one_by_one)
    b = render_here(tiny_archive, tiny_model(), "front", str(tmp_path / "b"), options=together)

    assert len(a.videos) == len(b.videos) == 3
    for va, vb in zip(a.videos, b.videos):
        np.testing.assert_array_equal(read_video(va["path"]), read_video(vb["path"]))


def test_cpu_recording_replays_like_the_opengl_backend(tiny_archive, tmp_path):
    model = copy.deepcopy(tiny_model())
    model.vis.quality.offsamples = 0  # OpenGL samples pixel centres, as the ray tracer does
    size = (96, 128)  # bodies large enough that yuv420p's half-resolution colour edges
    fine = VideoOptions(crf=10)  # (and crf 23's blur) leave their silhouettes
    cpu = RenderOptions(backend="cpu", size=size, video=fine)
    warp = RenderOptions(backend=BACKEND, size=size, batch_worlds=8, video=fine)

    expected = render_here(tiny_archive, model, "front", str(tmp_path / "gl"), options=cpu)
    actual = render_here(tiny_archive, model, "front", str(tmp_path / "warp"), options=warp)

    for gl_video, warp_video in zip(expected.videos, actual.videos, strict=True):
        gl, wa = bodies(read_video(gl_video["path"])), bodies(read_video(warp_video["path"]))
        assert gl.any() and not gl.all()
        assert np.mean(wa == gl) >= 0.99
        assert (wa & gl).sum() / (wa | gl).sum() >= 0.85  # the bodies cover ~1% of pixels


def bodies(frames: np.ndarray) -> np.ndarray:
    """Pixels of the coloured bodies: saturated colours, unlike the grey floor and black sky."""
    rgb = frames.astype(np.int16)
    return (rgb.max(axis=-1) - rgb.min(axis=-1)) > 60


def test_a_chunk_with_flipped_bits_is_a_corrupt_archive_error(tmp_path):
    from flyarchive.errors import CorruptArchiveError

    url = str(tmp_path / "bad.zarr")
    slider_archive(url, slider_qpos(1, SLIDER_FRAMES))
    flip_bits(shard_file(url, "qpos"))

    with pytest.raises(CorruptArchiveError, match="verify") as err:
        render_here(url, slider_model(), "front", str(tmp_path / "v"), options=WARP)

    assert "worlds [0]" in str(err.value)
    assert not (tmp_path / "v" / "world00000" / "front.mp4").exists()


def test_existing_videos_are_refused_without_overwrite(slider_worlds, tmp_path):
    url, _ = slider_worlds
    out = str(tmp_path / "v")
    render_here(url, slider_model(), "front", out, worlds=[0], options=WARP)

    with pytest.raises(OutputExistsError, match="overwrite"):
        render_here(url, slider_model(), "front", out, worlds=[0], options=WARP)


def test_overwrite_replaces_existing_videos(slider_worlds, tmp_path):
    url, _ = slider_worlds
    out = tmp_path / "v"
    render_here(url, slider_model(), "front", str(out), worlds=[0], time=(0.0, 0.02),
                  options=WARP)
    options = RenderOptions(backend=BACKEND, size=SIZE, batch_worlds=8, overwrite=True)

    result = render_here(url, slider_model(), "front", str(out), worlds=[0], options=options)

    assert read_video(result.videos[0]["path"]).shape[0] == SLIDER_FRAMES


# -- Dask -------------------------------------------------------------------------


@pytest.mark.cluster
def test_gpu_batches_on_a_cluster_without_gpu_workers_are_refused(slider_worlds, tmp_path):
    from distributed import Client, LocalCluster

    url, _ = slider_worlds
    gpu = RenderOptions(backend="gpu", size=SIZE, batch_worlds=8)
    with LocalCluster(n_workers=1, processes=False, dashboard_address="127.0.0.1:0",
                      silence_logs=40) as cluster, Client(cluster) as client:
        with pytest.raises(RenderBackendError, match="resources GPU=1"):
            render_videos(url, slider_model(), "front", str(tmp_path / "v"), options=gpu,
                          client=client)

    assert not (tmp_path / "v" / "world00000").exists()


def test_warp_cpu_runs_in_this_process_unless_worker_processes_are_asked_for():
    from flyarchive.distribute.placement import placement, runs_here

    assert not runs_here("warp-cpu", 4, n_workers=2)
    assert runs_here("warp-cpu", 4)
    assert runs_here("warp-cpu", 4, n_workers=0)
    assert runs_here("warp-cpu", 4, n_workers=2, in_process=True)
    assert runs_here("warp-cpu", 1, n_workers=2)  # one video: nothing to spread
    assert not runs_here("gpu", 4, scheduler="tcp://127.0.0.1:8786")
    threads = placement("warp-cpu", 3)  # one thread per core, at most one per video
    assert threads.where == ("threads" if (os.cpu_count() or 1) > 1 else "here")
    assert threads.where == "here" or threads.n_workers == min(3, os.cpu_count() or 1)


@pytest.mark.skipif(BACKEND != "warp-cpu", reason="render threads are warp-cpu's")
def test_render_threads_make_the_videos_one_thread_makes(tiny_archive, tmp_path):
    from flyarchive.render import warp_pipeline
    from flyarchive.render.diagnostics import PipelineProfile
    from flyarchive.render.warp_pipeline import render_threads

    lossless = RenderOptions(backend=BACKEND, size=SIZE, batch_worlds=4,
                             video=VideoOptions(crf=0, preset="ultrafast"))
    one = render_here(tiny_archive, tiny_model(), "front", str(tmp_path / "one"), options=lossless)
    used = []
    real = warp_pipeline.render_jobs

    def spy(*args, **kwargs):
        used.append(kwargs["slot"])
        return real(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp, PipelineProfile() as profile:
        mp.setattr(warp_pipeline, "render_jobs", spy)
        mp.setattr("flyarchive.distribute.api.placement",
                   lambda *a, **k: _threads(3))  # 3 threads, whatever the cores
        three = render_videos(tiny_archive, tiny_model(), "front", str(tmp_path / "three"),
                              options=lossless)

    assert sorted(used) == [0, 1, 2] and render_threads.__name__ == "render_threads"
    assert profile.results["frames"] == 33  # the threads' timings reach the caller's profile
    assert [v["world"] for v in three.videos] == [v["world"] for v in one.videos]
    for a, b in zip(one.videos, three.videos, strict=True):
        np.testing.assert_array_equal(read_video(a["path"]), read_video(b["path"]))


def _threads(n: int):
    from flyarchive.distribute.placement import Placement

    return Placement("threads", device="cpu", n_workers=n)


@pytest.mark.skipif(BACKEND != "warp-cpu", reason="render threads are warp-cpu's")
def test_a_failing_render_thread_stops_the_others_and_its_error_is_raised(tiny_archive, tmp_path):
    from flyarchive.render.warp_pipeline import BatchSource
    from flyarchive.errors import CorruptArchiveError

    real = BatchSource.read

    def read(self, batch):
        if any(self._jobs[p.job].world_id == 2 for p in batch.pieces):
            raise CorruptArchiveError("world 2 cannot be read")
        return real(self, batch)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(BatchSource, "read", read)
        mp.setattr("flyarchive.distribute.api.placement", lambda *a, **k: _threads(3))
        with pytest.raises(CorruptArchiveError, match="world 2"):
            render_videos(tiny_archive, tiny_model(), "front", str(tmp_path / "v"),
                          options=RenderOptions(backend=BACKEND, size=SIZE, batch_worlds=4))

    assert not (tmp_path / "v" / "world00002").exists()
    videos = sorted(p for p in (tmp_path / "v").rglob("*.mp4"))
    leftovers = [p for p in (tmp_path / "v").rglob("*")
                 if p.is_file() and p.suffix != ".mp4" and p.name != "manifest.json"]
    assert leftovers == []  # no parts, no partial files
    listed = read_manifest(str(tmp_path / "v" / "manifest.json"))["videos"] if videos else []
    assert sorted(Path(v["path"]) for v in listed) == videos  # finished videos kept, listed
    for video in (tmp_path / "v").rglob("*.mp4"):  # finished ones are whole
        assert read_video(video).shape[0] == 11


@pytest.fixture(scope="module")
def spread(slider_worlds, tmp_path_factory):
    """The slider worlds rendered with a progress bar on the LocalCluster of 2 worker
    processes that render_videos starts; the result, and what this process and its worker
    processes wrote to stderr."""
    url, _ = slider_worlds
    out = tmp_path_factory.mktemp("spread") / "v"
    options = RenderOptions(backend=BACKEND, size=SIZE, batch_worlds=8, progress=True)

    with tempfile.TemporaryFile("w+") as err:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)  # worker processes started meanwhile inherit it
        try:
            with contextlib.redirect_stderr(err):
                result = render_videos(url, slider_model(), "front", str(out), options=options,
                                       n_workers=2)
        finally:
            err.flush()
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        return result, err.read()


@pytest.mark.cluster
@pytest.mark.skipif(BACKEND != "warp-cpu", reason="the LocalCluster default is warp-cpu's")
def test_local_cluster_videos_equal_the_in_process_ones(slider_worlds, spread, tmp_path):
    url, _ = slider_worlds

    here = render_here(url, slider_model(), "front", str(tmp_path / "here"), options=WARP)
    result, _ = spread

    assert [v["world"] for v in result.videos] == [0, 1]
    for a, b in zip(here.videos, result.videos, strict=True):
        np.testing.assert_array_equal(read_video(a["path"]), read_video(b["path"]))
        assert Path(b["path"]).read_bytes() == Path(a["path"]).read_bytes()


@pytest.mark.cluster
@pytest.mark.skipif(BACKEND != "warp-cpu", reason="the LocalCluster default is warp-cpu's")
def test_warp_workers_on_a_local_cluster_show_one_progress_bar(spread):
    _, err = spread
    total = 2 * SLIDER_FRAMES

    bars = [line for line in err.replace("\r", "\n").split("\n") if line.startswith("frames:")]
    done = [line for line in bars if f"{total}/{total}" in line]
    per_worker = [line for line in bars if f"/{SLIDER_FRAMES} " in line]
    assert done and per_worker == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("threads", [0, 3], ids=["one-thread", "render-threads"])
def test_an_encoder_failing_mid_video_fails_the_render_and_leaves_no_partial_video(
        tiny_archive, tmp_path, threads):
    from flyarchive.render.encoders import Encoders
    from flyarchive.errors import VideoEncodeError

    real = Encoders._encode

    def encode(self, piece, cam, frames, maps):
        if self._jobs[piece.job].world_id == 1 and piece.start >= 4:  # world 1, mid-way
            raise VideoEncodeError("ffmpeg stopped (injected)")
        return real(self, piece, cam, frames, maps)

    out = tmp_path / "v"
    out.mkdir()
    options = RenderOptions(backend=BACKEND, size=SIZE, batch_worlds=4)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Encoders, "_encode", encode)
        if threads:
            mp.setattr("flyarchive.distribute.api.placement", lambda *a, **k: _threads(threads))
        with pytest.raises(VideoEncodeError, match="injected"):
            render_videos(tiny_archive, tiny_model(), "front", str(out), options=options,
                          n_workers=None if threads else 0)

    assert not (out / "world00001").exists()
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []  # no parts left
    for video in out.rglob("*.mp4"):  # any finished one is whole
        assert read_video(video).shape[0] == 11

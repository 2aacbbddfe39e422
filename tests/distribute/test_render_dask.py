"""render_videos and render_frames on a real Dask LocalCluster of worker processes (EGL)."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("MUJOCO_GL", "egl")

from flyarchive.distribute.api import RenderOptions, render_videos  # noqa: E402
from flyarchive.distribute.frames import render_frames  # noqa: E402
from flyarchive.models import model_bytes  # noqa: E402
from flyarchive.query import open_archive  # noqa: E402
from flyarchive.recorders import TrajectoryRecorder  # noqa: E402
from flyarchive.replay.opengl_frames import OpenGLRenderer  # noqa: E402
from flyarchive.testing import simulate, tiny_model  # noqa: E402
from flyarchive.video import VideoOptions, read_video  # noqa: E402

pytestmark = pytest.mark.cluster

distributed = pytest.importorskip("distributed")

SIZE = (48, 64)
CAMERAS = ("front", "top")
SEGMENT = 4
N_WORLDS = 2
# 160 steps of 2 ms at playback 1.0 and 25 fps: a frame every 20 steps, 9 frames, so
# segments of 4 frames are 4 + 4 + 1 (a short last segment).
N_STEPS = 160
N_FRAMES = 9
# One encoder thread everywhere: x264's output depends on its thread count.
OPTIONS = RenderOptions(size=SIZE, segment_frames=SEGMENT, video=VideoOptions(threads=1))
WORKER_ENV = {"MUJOCO_GL": "egl", "LP_NUM_THREADS": "1"}


def _cluster(n_workers: int) -> Any:
    return distributed.LocalCluster(
        n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0",
        env=WORKER_ENV, silence_logs=40,
    )


@pytest.fixture(scope="module")
def client(dask_client: Any) -> Any:
    """The run's shared cluster of 2 worker processes (tests/conftest.py)."""
    return dask_client


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_model()


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory, model: Any) -> str:
    url = str(tmp_path_factory.mktemp("dask") / "run.zarr")
    with TrajectoryRecorder(url, model, output_fps=25, playback_speed=1.0, chunk_frames=8) as rec:
        simulate(model, N_WORLDS, N_STEPS, rec.record_as_needed)
    return url


@pytest.fixture(scope="module")
def in_process_videos(archive: str, model: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    out = tmp_path_factory.mktemp("here") / "videos"
    return render_videos(archive, model, CAMERAS, str(out), options=OPTIONS, n_workers=0)


@pytest.fixture(scope="module")
def dask_videos(archive: str, model: Any, client: Any,
                tmp_path_factory: pytest.TempPathFactory) -> Any:
    out = tmp_path_factory.mktemp("dask") / "videos"
    return render_videos(archive, model, CAMERAS, str(out), options=OPTIONS, client=client)


def _keyframes(path: str) -> list[int]:
    """Indices of the keyframes of a video (ffmpeg's showinfo filter)."""
    import imageio_ffmpeg

    command = [imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-i", path,
               "-vf", "showinfo", "-f", "null", "-"]
    log = subprocess.run(command, capture_output=True, text=True, check=True).stderr
    return [int(n) for n, key in re.findall(r"n:\s*(\d+)\s.*?iskey:([01])", log) if key == "1"]


def _by_video(result: Any) -> dict[tuple[int, str], dict[str, Any]]:
    return {(v["world"], v["camera"]): v for v in result.videos}


def test_dask_writes_one_video_per_world_and_camera_with_every_frame(dask_videos: Any) -> None:
    expected = {(w, c) for w in range(N_WORLDS) for c in CAMERAS}

    videos = _by_video(dask_videos)

    assert set(videos) == expected
    for video in videos.values():
        assert read_video(video["path"]).shape == (N_FRAMES, *SIZE, 3)
        assert video["frames"] == N_FRAMES


def test_dask_video_is_segments_joined_each_starting_on_a_keyframe(dask_videos: Any) -> None:
    segment_starts = list(range(0, N_FRAMES, SEGMENT))

    keyframes = _keyframes(dask_videos.videos[0]["path"])

    assert len(segment_starts) > 1
    assert set(segment_starts) <= set(keyframes)


def test_dask_manifest_lists_every_video_and_no_parts_remain(dask_videos: Any) -> None:
    import json

    manifest = json.loads(Path(dask_videos.manifest).read_text())
    out = Path(dask_videos.manifest).parent

    listed = {(v["world"], v["camera"], v["path"], v["frames"]) for v in manifest["videos"]}
    assert listed == {(v["world"], v["camera"], v["path"], N_FRAMES) for v in dask_videos.videos}
    assert all(Path(p).is_file() for _, _, p, _ in listed)
    assert not list(out.glob(".parts-*"))


def test_dask_videos_match_in_process_videos(dask_videos: Any, in_process_videos: Any) -> None:
    # In this process a video is one encode; on Dask it is joined from segments that
    # each start on a keyframe, so the H.264 bytes differ, the pictures barely.
    here = _by_video(in_process_videos)

    for key, video in _by_video(dask_videos).items():
        expected_frames = read_video(here[key]["path"]).astype(float)
        actual_frames = read_video(video["path"]).astype(float)
        assert actual_frames.shape == expected_frames.shape
        assert np.abs(actual_frames - expected_frames).mean() < 2.0


# Four EGL renderers at once in processes of their own (mujoco #3444) are rendered by default
# in tests/reliability/test_reliability.py::test_four_cpu_render_processes_at_once_all_finish;
# this case repeats it in Dask worker processes of a cluster of its own.
@pytest.mark.sweep
@pytest.mark.timeout(180)
def test_four_egl_worker_processes_render_at_once(archive: str, model: Any, tmp_path: Path) -> None:
    from flyarchive.render.frame_blocks import render_block_outputs  # what render_frames' tasks run

    ds = open_archive(archive).isel(world=0, time=slice(0, 3))
    with OpenGLRenderer(model, "front", SIZE) as renderer:
        expected = renderer.render(ds.qpos.values, ds.mocap_pos.values, ds.mocap_quat.values)[:, 0]

    with _cluster(4) as cluster, distributed.Client(cluster, set_as_default=False) as four:
        four.wait_for_workers(4, timeout=120)
        # client.run calls every worker at once: four EGL contexts are created together.
        frames = four.run(render_block_outputs, archive, {}, model_bytes(model), "front", SIZE,
                          0, 0, 3, committed=3, backend="cpu")
        result = render_videos(archive, model, "front", str(tmp_path / "v"), client=four,
                               options=RenderOptions(size=SIZE, segment_frames=SEGMENT))

    assert len(frames) == 4
    for actual in frames.values():
        np.testing.assert_array_equal(actual["rgb"], expected)
    assert sorted(v["frames"] for v in result.videos) == [N_FRAMES] * N_WORLDS


def test_render_frames_on_cluster_equal_cpu_renderer_frames(
    archive: str, model: Any, client: Any
) -> None:
    window = slice(2, 9)
    ds = open_archive(archive).isel(time=window)
    qpos, mocap_pos, mocap_quat = ds.qpos.values, ds.mocap_pos.values, ds.mocap_quat.values
    with OpenGLRenderer(model, "top", SIZE) as renderer:
        expected = np.stack([renderer.render(qpos[w], mocap_pos[w], mocap_quat[w])[:, 0]
                             for w in range(N_WORLDS)])

    lazy = render_frames(archive, model, "top", size=SIZE, block_frames=SEGMENT)
    actual = client.compute(lazy.isel(time=window).data).result()

    assert actual.shape == (N_WORLDS, window.stop - window.start, *SIZE, 3)
    np.testing.assert_array_equal(actual, expected)


def test_render_frames_under_a_default_client_send_the_model_to_its_workers_once(
    archive: str, model: Any, client: Any
) -> None:
    key = f"flyarchive-model-{hashlib.sha256(model_bytes(model)).hexdigest()}"
    ds = open_archive(archive).isel(world=1, time=slice(0, 8))
    with OpenGLRenderer(model, "top", SIZE) as renderer:
        expected = renderer.render(ds.qpos.values, ds.mocap_pos.values, ds.mocap_quat.values)[:, 0]

    with client.as_current():  # the default client of this thread
        lazy = render_frames(archive, model, "top", size=SIZE, block_frames=SEGMENT)
        holders = client.who_has()[key]  # before anything is computed
        first = lazy.isel(world=1, time=slice(0, 4)).values
        second = lazy.isel(world=1, time=slice(4, 8)).values

    assert holders  # sent (by this test, or by a render of this client before: once per client)
    assert key not in dict(lazy.data.__dask_graph__())  # each graph names it, holds no bytes
    np.testing.assert_array_equal(np.concatenate([first, second]), expected)


def test_dask_render_to_s3_lands_in_the_bucket(
    archive: str, model: Any, client: Any, s3_server: Any, tmp_path: Path
) -> None:
    out = f"s3://flyarchive-test/{uuid.uuid4().hex}/videos"
    fs = s3_server.filesystem()

    result = render_videos(archive, model, "front", out, worlds=[1], client=client,
                           options=OPTIONS, out_storage_options=s3_server.storage_options())

    (video,) = result.videos
    assert video["path"] == f"{out}/world00001/front.mp4"
    local = tmp_path / "front.mp4"
    fs.get_file(video["path"], str(local))
    assert read_video(local).shape == (N_FRAMES, *SIZE, 3)
    assert fs.exists(f"{out}/manifest.json")
    assert not fs.glob(f"{out}/.parts-*")


def test_render_videos_accepts_a_client_that_is_not_default(
    archive: str, model: Any, client: Any, tmp_path: Path
) -> None:
    result = render_videos(archive, model, "front", str(tmp_path / "v"), worlds=[0],
                           client=client, options=OPTIONS)

    assert [v["frames"] for v in result.videos] == [N_FRAMES]


def test_the_model_is_sent_to_each_worker_once_under_its_hash(client: Any) -> None:
    from flyarchive.models.shipping import scatter_model

    blob = b"model bytes " * 1000
    first = scatter_model(client, blob)
    again = scatter_model(client, blob)

    assert first.key == again.key and hashlib.sha256(blob).hexdigest() in first.key
    holders = client.who_has([first])[first.key]
    assert len(holders) == len(client.scheduler_info()["workers"]) == 2
    assert client.submit(len, first, pure=False).result() == len(blob)


def test_a_local_cluster_never_asks_for_the_busy_dashboard_port(
        archive: str, model: Any, tmp_path: Path) -> None:
    import socket
    import warnings

    busy = socket.socket()
    try:
        busy.bind(("", 8787))  # if another dashboard holds it already, so much the better
        busy.listen()
    except OSError:
        pass
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            render_videos(archive, model, "front", str(tmp_path / "v"), worlds=[0],
                          options=OPTIONS, n_workers=1)
    finally:
        busy.close()

    messages = [str(w.message) for w in seen]
    assert not [m for m in messages if "already in use" in m]


def test_dask_lists_each_video_in_the_manifest_when_its_join_completes(
        archive: str, model: Any, client: Any, tmp_path: Path, monkeypatch: Any) -> None:
    from flyarchive.video import manifest

    seen, add = [], manifest.ManifestJournal.add
    monkeypatch.setattr(manifest.ManifestJournal, "add",
                        lambda self, video: (seen.append(video["path"]), add(self, video))[1])

    result = render_videos(archive, model, CAMERAS, str(tmp_path / "v"), worlds=[0],
                           options=OPTIONS, client=client)

    assert sorted(seen) == sorted(v["path"] for v in result.videos) and len(seen) == len(CAMERAS)


def test_a_cluster_given_renders_every_segment_on_its_workers(
        archive: str, model: Any, client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only a cluster flyarchive starts for the render has its first segment rendered in
    # the caller's process (tests/distribute/test_early_cluster.py); a given one is the user's.
    from flyarchive.distribute import api

    here: list[Any] = []
    monkeypatch.setattr(api, "_render_here", lambda *args: here.append(args))

    result = render_videos(archive, model, "front", str(tmp_path / "v"), client=client,
                           options=OPTIONS)

    assert here == []
    assert sorted(v["frames"] for v in result.videos) == [N_FRAMES] * N_WORLDS


@pytest.mark.timeout(300)
def test_a_render_whose_one_worker_dies_sends_the_model_again_and_finishes(
        model: Any, tmp_path: Path) -> None:
    """The one worker holding the scattered model dies (its nanny restarts it empty): the
    segments cancelled for want of it are submitted again with the model sent again."""
    import threading
    import time
    import warnings

    url = str(tmp_path / "long.zarr")
    with TrajectoryRecorder(url, model, output_fps=25, playback_speed=1.0, chunk_frames=8) as rec:
        simulate(model, 1, 20 * 120, rec.record_as_needed)  # 120 frames: 30 segments
    out = tmp_path / "videos"

    def kill_once_rendering(client: Any) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(out.glob(".parts-*/**/*.mp4")):
            time.sleep(0.02)
        try:
            client.run(os._exit, 1, nanny=False)
        except Exception:  # the worker's connection closes as it exits
            pass

    with _cluster(1) as cluster, distributed.Client(cluster) as client:
        killer = threading.Thread(target=kill_once_rendering, args=(client,), daemon=True)
        killer.start()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = render_videos(url, model, "front", str(out), options=OPTIONS, client=client)
        killer.join(timeout=60)

    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert any("rendered again: what they needed (the model sent to the Dask workers, or their "
               "result) was lost with a worker that died" in s for s in said)
    (video,) = result.videos
    assert video["frames"] == 121 and read_video(video["path"]).shape[0] == 121

"""Local paths leave the client absolute: a Dask worker started in another folder reads
the client's archive and writes into the client's output folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("MUJOCO_GL", "egl")

from flyarchive.distribute.api import RenderOptions, render_videos  # noqa: E402
from flyarchive.distribute.frames import render_frames  # noqa: E402
from flyarchive.recorders import TrajectoryRecorder  # noqa: E402
from flyarchive.testing import simulate, tiny_model  # noqa: E402
from flyarchive.video import VideoOptions, read_video  # noqa: E402

distributed = pytest.importorskip("distributed")
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

SIZE = (48, 64)
OPTIONS = RenderOptions(size=SIZE, segment_frames=4, video=VideoOptions(threads=1))
N_FRAMES = 5  # 80 steps of 2 ms at 25 fps, playback 1.0: a frame every 20 steps


@pytest.fixture(scope="module")
def worker_elsewhere(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """A client of a scheduler whose only worker is a `dask worker` process started in
    its own empty folder, as a user would start one by hand."""
    folder = tmp_path_factory.mktemp("worker-cwd")
    cluster = distributed.LocalCluster(n_workers=0, processes=True, silence_logs=40,
                                       dashboard_address="127.0.0.1:0")
    env = {**os.environ, "MUJOCO_GL": "egl", "LP_NUM_THREADS": "1"}
    worker = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_worker", cluster.scheduler_address,
         "--nthreads", "1", "--no-dashboard"],
        cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    client = distributed.Client(cluster, set_as_default=False)
    try:
        client.wait_for_workers(1, timeout=120)
        yield client, folder
    finally:
        client.close()
        worker.terminate()
        worker.wait(timeout=60)
        cluster.close()


@pytest.fixture(scope="module")
def client_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The client's working folder, holding ``run.zarr`` (2 worlds, 5 frames each)."""
    folder = tmp_path_factory.mktemp("client-cwd")
    model = tiny_model()
    with TrajectoryRecorder(str(folder / "run.zarr"), model, output_fps=25, playback_speed=1.0,
                            chunk_frames=8) as recorder:
        simulate(model, 2, 80, recorder.record_as_needed)
    return folder


@pytest.fixture(scope="module")
def relative_render(worker_elsewhere: tuple[Any, Path], client_folder: Path) -> Any:
    """``render_videos(<absolute archive>, ..., "out/vids")`` run from the client's folder."""
    client, _ = worker_elsewhere
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(client_folder)
        return render_videos(str(client_folder / "run.zarr"), tiny_model(), "front", "out/vids",
                             client=client, options=OPTIONS)


def test_relative_output_folder_is_written_in_the_clients_folder(
        relative_render: Any, client_folder: Path) -> None:
    expected = [str(client_folder / "out" / "vids" / f"world{w:05d}" / "front.mp4") for w in (0, 1)]

    paths = [v["path"] for v in relative_render.videos]

    assert paths == expected
    assert [read_video(p).shape[0] for p in paths] == [N_FRAMES, N_FRAMES]


def test_nothing_is_written_in_the_workers_folder(
        relative_render: Any, worker_elsewhere: tuple[Any, Path]) -> None:
    _, worker_folder = worker_elsewhere

    left = sorted(str(p.relative_to(worker_folder)) for p in worker_folder.rglob("*"))

    assert left == []


def test_manifest_of_a_relative_render_points_at_the_videos(
        relative_render: Any, client_folder: Path) -> None:
    manifest = json.loads((client_folder / "out" / "vids" / "manifest.json").read_text())

    paths = [Path(v["path"]) for v in manifest["videos"]]

    assert manifest["archive"] == str(client_folder / "run.zarr")
    assert len(paths) == 2 and all(p.is_absolute() and p.is_file() for p in paths)


def test_relative_archive_path_renders_on_a_worker_started_elsewhere(
        worker_elsewhere: tuple[Any, Path], client_folder: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    client, _ = worker_elsewhere
    monkeypatch.chdir(client_folder)

    result = render_videos("run.zarr", tiny_model(), "top", str(client_folder / "by-archive"),
                           worlds=[1], client=client, options=OPTIONS)

    (video,) = result.videos
    assert read_video(video["path"]).shape == (N_FRAMES, *SIZE, 3)


def test_render_frames_of_a_relative_archive_compute_on_a_worker_started_elsewhere(
        worker_elsewhere: tuple[Any, Path], client_folder: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    client, _ = worker_elsewhere
    monkeypatch.chdir(client_folder)
    lazy = render_frames("run.zarr", tiny_model(), "top", size=SIZE, block_frames=2)
    expected = lazy.isel(world=[1]).compute(scheduler="synchronous").values

    actual = client.compute(lazy.isel(world=[1]).data).result()

    assert actual.shape == (1, N_FRAMES, *SIZE, 3)
    np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize(("given", "expected"), [
    ("out/vids", "{cwd}/out/vids"),
    ("./out/../vids/", "{cwd}/vids"),
    ("file://out/vids", "file://{cwd}/out/vids"),
    ("~/vids", "{home}/vids"),
    ("file://~/vids", "file://{home}/vids"),
    ("/already/absolute", "/already/absolute"),
    ("s3://bucket/out/vids", "s3://bucket/out/vids"),
    ("memory://vids", "memory://vids"),
])
def test_local_paths_become_absolute_and_urls_stay(
        given: str, expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flyarchive.store.location import absolute_url

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))

    actual = absolute_url(given)

    assert actual == expected.format(cwd=tmp_path, home=tmp_path / "home")


def test_an_archive_opened_by_a_relative_path_is_read_by_workers_started_elsewhere(tmp_path,
                                                                                  monkeypatch):
    """Workers started in another folder read 'run.zarr' against theirs: open_archive,
    positions and gait failed with "the archive was replaced"."""
    import distributed

    import flyarchive
    from flyarchive.testing.fixtures import record

    record(tiny_model(), str(tmp_path / "run.zarr"), n_worlds=2)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  silence_logs=40) as cluster, distributed.Client(cluster):
        monkeypatch.chdir(tmp_path)  # the workers started in the folder before

        ds = flyarchive.open_archive("run.zarr")
        qpos = ds.qpos.sum().compute()
        hand = flyarchive.positions("run.zarr", bodies=["hand"]).compute()
        flyarchive.keep_positions(str(tmp_path / "run.zarr"), bodies=["hand"])
        flyarchive.keep_positions(str(tmp_path / "run.zarr"), bodies=["hand"],
                                  to=str(tmp_path / "pos.zarr"))
        kept = flyarchive.positions("run.zarr", bodies=["hand"]).compute()  # read, kept
        own = flyarchive.open_positions("pos.zarr").compute()
        assert np.array_equal(kept.values, hand.values)
        assert np.array_equal(own.values, hand.values)

    expected = flyarchive.open_archive(str(tmp_path / "run.zarr"))
    assert float(qpos) == float(expected.qpos.sum().compute(scheduler="sync"))
    assert hand.sizes["world"] == 2 and bool(np.isfinite(hand.values).all())


def test_a_cluster_without_workers_is_said_in_words(tmp_path):
    """It said only "TimeoutError: No valid workers found" after the scatter's timeout."""
    import dask
    import distributed

    from flyarchive.errors import RenderFailedError
    from flyarchive.models.shipping import scatter_model

    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}), \
            distributed.LocalCluster(n_workers=0, processes=True, silence_logs=40) as cluster, \
            distributed.Client(cluster, timeout=5) as client:
        with pytest.raises(RenderFailedError, match=r"The Dask cluster at tcp://.* has no worker "
                                                    r"to render on.*--workers 0"):
            scatter_model(client, b"model bytes")


def test_a_model_a_worker_cannot_load_names_the_worker_and_its_mujoco(tmp_path):
    """A worker on another MuJoCo said "this is MuJoCo 4.0.1" in the error the render's
    process (on 3.16) printed, naming no worker."""
    import hashlib
    import struct

    import distributed
    import mujoco

    from flyarchive.errors import ModelLoadError
    from flyarchive.models import model_bytes
    from flyarchive.models.shipping import shipped_model

    blob = bytearray(model_bytes(tiny_model()))
    blob[12:16] = struct.pack("<i", 3)  # an MJB of another release's header
    blob = bytes(blob)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  silence_logs=40) as cluster, distributed.Client(cluster) as client:
        future = client.submit(shipped_model, hashlib.sha256(blob).hexdigest(), blob, pure=False)
        with pytest.raises(ModelLoadError, match=r"On the Dask worker tcp://[0-9.:]+ \(MuJoCo "
                                                 rf"{mujoco.__version__}\): .* start them in "
                                                 r"its environment"):
            future.result()
    with pytest.raises(ModelLoadError) as here:  # in this process: as it was
        shipped_model(hashlib.sha256(blob).hexdigest(), blob)
    assert "Dask worker" not in str(here.value)

"""Warp renders on a Dask cluster given by address (``--scheduler``) or by client: its
workers warm Warp before any render, batches run on the workers that hold a GPU, and what
happens when one of its workers is killed mid-render.

Warp's CPU device stands in for the GPUs (``--backend warp-cpu``): the workers are
started as ``dask worker --resources GPU=1`` would be, one process each. One cluster for
the module (each worker imports mujoco-warp once; a killed one is started again by its
nanny); its ffmpeg is wrapped by an :class:`~flyarchive.testing.render_kills.EncoderGate`,
so that a kill comes while a worker's video is held unfinished.
"""

from __future__ import annotations

import glob
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flyarchive.distribute.api import RenderOptions, render_videos
from flyarchive.errors import RenderFailedError
from flyarchive.testing import tiny_model
from flyarchive.testing.fixtures import record, snapshot
from flyarchive.testing.markers import requires_distributed, requires_warp
from flyarchive.testing.render_kills import EncoderGate
from flyarchive.video import read_video

pytestmark = [pytest.mark.cluster, requires_warp, requires_distributed, pytest.mark.timeout(300)]

N_WORLDS = 4
N_FRAMES = 20  # record()'s default: 76 steps
OPTIONS = RenderOptions(size=(48, 64), backend="warp-cpu", batch_worlds=4, progress=False)


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = str(tmp_path_factory.mktemp("scale") / "run.zarr")
    record(tiny_model(), url, n_worlds=N_WORLDS)
    return url


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EncoderGate]:
    """The ffmpeg of the cluster's workers; holds no encoder until a test arms it."""
    with EncoderGate(tmp_path_factory.mktemp("gate"), at=0) as gate:
        yield gate


@pytest.fixture(scope="module")
def gpu_like_cluster(gate: EncoderGate, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Two single-thread worker processes offering ``GPU=1`` each (as hand-started
    ``dask worker --nthreads 1 --resources GPU=1`` are), their temporary files in a
    folder of the module's."""
    from distributed import LocalCluster

    env = {"TMPDIR": str(tmp_path_factory.mktemp("workers-tmp")), **gate.env}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, resources={"GPU": 1},
                      dashboard_address="127.0.0.1:0", silence_logs=50, env=env) as cluster:
        yield cluster


@pytest.fixture
def client(gpu_like_cluster: Any) -> Iterator[Any]:
    """A client of the module's cluster once both workers are there (a killed one is
    started again by its nanny)."""
    from distributed import Client

    with Client(gpu_like_cluster, set_as_default=False) as client:
        client.wait_for_workers(2, timeout=120)
        yield client


def test_workers_of_a_scheduler_given_start_warming_warp_before_any_render(gpu_like_cluster,
                                                                           client):
    """``--scheduler``: the command connects first and its workers start importing the Warp
    renderer (Warp's CPU device here) while it imports and opens the archive; the render
    then uses that client."""
    from flyarchive.distribute import cluster as clusters
    from flyarchive.distribute.warm import wait_for_warm_up

    def has_warp():
        import sys

        return "mujoco_warp" in sys.modules and "flyarchive.replay.warp_frames" in sys.modules

    if any(client.run(has_warp).values()):  # not the first test here: workers of their own
        client.restart(wait_for_workers=True)
    before = client.run(has_warp)

    with clusters.scheduler_client(gpu_like_cluster.scheduler_address, "cpu") as early:
        # each worker warms in a thread of its own; a task on each waits for that thread
        early.gather([early.submit(wait_for_warm_up, workers=[worker], pure=False)
                      for worker in early.scheduler_info()["workers"]])
        seen = early.run(has_warp)
        with clusters.connect(early) as connected:
            taken = connected is early

    assert list(before.values()) == [False, False]
    assert len(seen) == 2 and all(seen.values())
    assert taken


@pytest.fixture(scope="module")
def cli_render(archive, gpu_like_cluster, tmp_path_factory) -> dict[str, Any]:
    """``flyarchive render --backend warp-cpu --scheduler ADDRESS`` in this process; the
    tasks the cluster ran and the videos the manifest journal was given as they came."""
    from distributed import Client, get_task_stream

    from flyarchive.cli import main
    from flyarchive.video import manifest

    out = tmp_path_factory.mktemp("cli") / "v"
    seen, add = [], manifest.ManifestJournal.add
    with pytest.MonkeyPatch.context() as mp, \
            Client(gpu_like_cluster, set_as_default=False) as client:
        mp.setattr(manifest.ManifestJournal, "add",
                   lambda self, video: (seen.append(video["path"]), add(self, video))[1])
        client.wait_for_workers(2, timeout=120)
        with get_task_stream(client) as stream:
            code = main(["render", archive, "--camera", "front", "--size", "48x64", "--backend",
                         "warp-cpu", "--scheduler", gpu_like_cluster.scheduler_address,
                         "--out", str(out), "--quiet"])
    groups = [t for t in stream.data if "render_group" in str(t["key"])]
    return {"code": code, "out": out, "groups": groups, "seen": seen}


def test_cli_scheduler_renders_every_video_on_both_workers_of_the_cluster(cli_render):
    out = cli_render["out"]

    assert cli_render["code"] == 0
    assert [read_video(p).shape[0] for p in sorted(glob.glob(f"{out}/world*/front.mp4"))] \
        == [N_FRAMES] * N_WORLDS
    assert len({t["worker"] for t in cli_render["groups"]}) == 2


def test_batches_run_on_the_workers_that_hold_a_gpu_and_each_video_is_listed_once_published(
        cli_render):
    from flyarchive.video.manifest import read_manifest

    listed = read_manifest(str(cli_render["out"] / "manifest.json"))["videos"]

    assert cli_render["groups"]  # the Warp batches' tasks, on workers offering GPU=1
    assert sorted(cli_render["seen"]) == sorted(v["path"] for v in listed)
    assert len(listed) == N_WORLDS


def kill_the_worker_of_the_held_video(gate: EncoderGate) -> tuple[threading.Thread, list[int]]:
    """In the background: once a worker's first video is held at the gate (it renders),
    SIGKILL that worker process, then let the held ffmpeg go; the thread and the list it
    puts the killed worker's pid in."""
    import psutil

    killed: list[int] = []

    def kill() -> None:
        if gate.wait_held(120):
            killed.append(psutil.Process(gate.pid).ppid())
            os.kill(killed[0], signal.SIGKILL)
        gate.release()

    gate.arm(1)
    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread, killed


def final_videos_are_whole(out: Path) -> bool:
    return all(read_video(p).shape[0] == N_FRAMES for p in glob.glob(f"{out}/world*/*.mp4"))


def test_a_worker_killed_mid_render_has_its_videos_rendered_again(archive, tmp_path, client,
                                                                  gate):
    out = tmp_path / "v"
    before = snapshot(archive)
    try:
        killer, killed = kill_the_worker_of_the_held_video(gate)
        result = render_videos(archive, None, "front", str(out), options=OPTIONS, client=client)
        killer.join()
    finally:
        gate.arm(0)

    assert killed  # while its video was held unfinished
    assert [read_video(v["path"]).shape[0] for v in result.videos] == [N_FRAMES] * N_WORLDS
    assert not glob.glob(f"{out}/.parts-*")
    assert snapshot(archive) == before


def test_a_worker_killed_mid_render_fails_the_render_naming_the_worker(archive, tmp_path,
                                                                       gpu_like_cluster, client,
                                                                       gate):
    out = tmp_path / "v"
    before = snapshot(archive)
    scheduler, allowed = gpu_like_cluster.scheduler, gpu_like_cluster.scheduler.allowed_failures
    scheduler.allowed_failures = 0  # as distributed.scheduler.allowed-failures: 0
    try:
        killer, killed = kill_the_worker_of_the_held_video(gate)
        with pytest.raises(RenderFailedError, match=r"worker tcp://127\.0\.0\.1:\d+") as err:
            render_videos(archive, None, "front", str(out), options=OPTIONS, client=client)
        killer.join()
    finally:
        scheduler.allowed_failures = allowed
        gate.arm(0)

    assert killed  # while its video was held unfinished
    assert "died" in str(err.value)
    assert final_videos_are_whole(out)
    assert not glob.glob(f"{out}/.parts-*")
    assert snapshot(archive) == before

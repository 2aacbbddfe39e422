"""Warp renders on a Dask cluster given by address (``--scheduler``), and what happens when
one of its workers is killed mid-render.

Warp's CPU device stands in for the GPUs (``--backend warp-cpu``): the workers are
started as ``dask worker --resources GPU=1`` would be, one process each.
"""

from __future__ import annotations

import glob
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from flyarchive.distribute.api import RenderOptions, render_videos
from flyarchive.errors import RenderFailedError
from flyarchive.testing import tiny_model
from flyarchive.testing.fixtures import record, snapshot
from flyarchive.testing.markers import requires_distributed, requires_warp
from flyarchive.video import read_video

pytestmark = [pytest.mark.cluster, requires_warp, requires_distributed, pytest.mark.timeout(300)]

N_WORLDS = 4
N_FRAMES = 20  # record()'s default: 76 steps


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = str(tmp_path_factory.mktemp("scale") / "run.zarr")
    record(tiny_model(), url, n_worlds=N_WORLDS)
    return url


def gpu_like_cluster(**config: Any) -> Any:
    """Two single-thread worker processes offering ``GPU=1`` each (as hand-started
    ``dask worker --nthreads 1 --resources GPU=1`` are), under Dask ``config``."""
    import dask
    from distributed import LocalCluster

    with dask.config.set(config):
        return LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                            resources={"GPU": 1}, dashboard_address="127.0.0.1:0",
                            silence_logs=50)


def test_cli_scheduler_renders_every_video_on_both_workers_of_the_cluster(archive, tmp_path, cli):
    from distributed import Client, get_task_stream

    out = tmp_path / "v"
    with gpu_like_cluster() as cluster, Client(cluster) as client:
        with get_task_stream(client) as stream:
            code, stdout, _ = cli("render", archive, "--camera", "front", "--size", "48x64",
                                  "--backend", "warp-cpu", "--scheduler",
                                  cluster.scheduler_address, "--out", out, "--quiet")
        ran_on = {t["worker"] for t in stream.data if "render_group" in str(t["key"])}

    assert code == 0 and f"wrote {N_WORLDS} video(s)" in stdout
    assert [read_video(p).shape[0] for p in sorted(glob.glob(f"{out}/world*/front.mp4"))] \
        == [N_FRAMES] * N_WORLDS
    assert len(ran_on) == 2


def kill_a_worker_once_rendering(client: Any, out: Path) -> threading.Thread:
    """In the background: once a group of videos has started (its marker in the run's
    parts folder), SIGKILL the worker process that holds it."""
    pids = client.run(os.getpid)

    def kill() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not glob.glob(f"{out}/.parts-*/groups/*"):
            time.sleep(0.01)
        os.kill(next(iter(pids.values())), signal.SIGKILL)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def final_videos_are_whole(out: Path) -> bool:
    return all(read_video(p).shape[0] == N_FRAMES for p in glob.glob(f"{out}/world*/*.mp4"))


def test_a_worker_killed_mid_render_fails_the_render_naming_the_worker(archive, tmp_path):
    from distributed import Client

    out = tmp_path / "v"
    before = snapshot(archive)
    options = RenderOptions(size=(48, 64), backend="warp-cpu", batch_worlds=4, progress=False)
    with gpu_like_cluster(**{"distributed.scheduler.allowed-failures": 0}) as cluster, \
            Client(cluster) as client:
        killer = kill_a_worker_once_rendering(client, out)
        with pytest.raises(RenderFailedError, match=r"worker tcp://127\.0\.0\.1:\d+") as err:
            render_videos(archive, None, "front", str(out), options=options, client=client)
        killer.join()

    assert "died" in str(err.value)
    assert final_videos_are_whole(out)
    assert not glob.glob(f"{out}/.parts-*")
    assert snapshot(archive) == before


def test_a_worker_killed_mid_render_has_its_videos_rendered_again(archive, tmp_path):
    from distributed import Client

    out = tmp_path / "v"
    before = snapshot(archive)
    options = RenderOptions(size=(48, 64), backend="warp-cpu", batch_worlds=4, progress=False)
    with gpu_like_cluster() as cluster, Client(cluster) as client:
        killer = kill_a_worker_once_rendering(client, out)
        result = render_videos(archive, None, "front", str(out), options=options, client=client)
        killer.join()

    assert [read_video(v["path"]).shape[0] for v in result.videos] == [N_FRAMES] * N_WORLDS
    assert not glob.glob(f"{out}/.parts-*")
    assert snapshot(archive) == before

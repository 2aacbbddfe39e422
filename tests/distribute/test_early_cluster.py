"""The command line starts its local Dask cluster before its imports and the archive's
opening (``local_cluster``) and passes its client to the render, which runs on it instead
of starting a second one; the cluster is closed when the command ends, used or not. (The
workers of a cluster given by ``--scheduler`` warm Warp early: test_scale_out_cluster.py.)

Real LocalClusters with worker processes; the GPUs are a fake set of two (CI has no
CUDA): their workers are started, never asked to render.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import dask
import distributed  # noqa: F401  (its configuration, before dask.config.set below)
import psutil
import pytest

from flyarchive.cli import main
from flyarchive.distribute import cluster as clusters
from flyarchive.distribute.gpus import Gpu, gpu_workers
from flyarchive.models import save_mjb
from flyarchive.testing.fixtures import record

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

TWO = [Gpu(0, "0"), Gpu(1, "1")]


_OTHERS: set[int] = set()  # children that were there before (the session's S3 server...)


def worker_processes() -> list[psutil.Process]:
    """This process's Dask worker processes (its nannies' children included) started
    during the test."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.pid not in _OTHERS and "resource_tracker" not in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:  # exited meanwhile
            continue
    return found


@pytest.fixture(autouse=True)
def others():
    _OTHERS.clear()
    _OTHERS.update(p.pid for p in psutil.Process().children(recursive=True))


@pytest.fixture
def started(monkeypatch):
    """Counts the LocalClusters started (early or by connect)."""
    calls = []
    real = clusters._start_local

    def counted(*args, **kwargs):
        calls.append(args[1:])
        return real(*args, **kwargs)

    monkeypatch.setattr(clusters, "_start_local", counted)
    return calls


def test_connect_given_the_client_of_a_gpu_cluster_started_early_waits_for_its_workers(started):
    workers = gpu_workers(TWO, cpus=range(2), sys_pci=Path("/nonexistent"))

    with dask.config.set({"distributed.diagnostics.nvml": False}):
        with clusters.local_cluster(gpu_workers=workers) as early:
            assert worker_processes()  # started before connect asks for them
            with clusters.connect(early) as client:
                names = sorted(w["name"] for w in client.scheduler_info()["workers"].values())
                taken = client is early

    assert taken and names == ["gpu0", "gpu1"]
    assert len(started) == 1
    psutil.wait_procs(worker_processes(), timeout=20)
    assert worker_processes() == []


def test_a_cluster_started_early_but_not_used_is_closed(started):
    with clusters.local_cluster(1):
        with clusters.connect(n_workers=1) as client:  # another cluster: not this one
            assert len(client.scheduler_info()["workers"]) == 1

    assert len(started) == 2
    psutil.wait_procs(worker_processes(), timeout=20)
    assert worker_processes() == []


@pytest.mark.parametrize("argv, expected", [
    (["--backend", "gpu"], ("gpus", ["gpu0", "gpu1"])),
    (["--backend", "gpu", "--gpus", "1"], None),  # one GPU: in this process
    (["--backend", "gpu", "--scheduler", "tcp://127.0.0.1:1"], ("scheduler", "cuda")),
    (["--backend", "warp-cpu", "--scheduler", "tcp://127.0.0.1:1"], ("scheduler", "cpu")),
    (["--backend", "opengl", "--scheduler", "tcp://127.0.0.1:1"], ("scheduler", None)),
    (["--backend", "warp-cpu"], None),  # render threads in this process
    (["--backend", "warp-cpu", "--workers", "2"], ("cpus", 2)),
    (["--backend", "opengl"], ("cpus", None)),  # one worker process per core
    (["--backend", "opengl", "--workers", "1"], ("cpus", 1)),
    (["--backend", "opengl", "--workers", "3"], ("cpus", 3)),
    (["--backend", "opengl", "--workers", "0"], None),
    (["--backend", "opengl", "--workers", "-1"], None),  # refused by the render itself
])
def test_the_command_line_starts_early_the_cluster_its_render_will_use(monkeypatch, argv,
                                                                        expected):
    from flyarchive.cli import commands as cli
    from flyarchive.distribute import gpus

    monkeypatch.setattr(gpus, "visible_gpus", lambda **_: list(TWO))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    asked = []

    @contextlib.contextmanager
    def early(n_workers=None, *, gpu_workers=None):
        asked.append(("gpus", [w.name for w in gpu_workers]) if gpu_workers
                     else ("cpus", n_workers))
        yield "cluster's client"

    @contextlib.contextmanager
    def client(scheduler, warm=None):
        asked.append(("scheduler", warm))
        yield "scheduler's client"

    given = []
    monkeypatch.setattr(clusters, "local_cluster", early)
    monkeypatch.setattr(clusters, "scheduler_client", client)
    monkeypatch.setattr(cli, "_render", lambda args, client: given.append(client) or 0)

    assert main(["render", "run.zarr", "--camera", "front", *argv]) == 0
    assert asked == ([expected] if expected else [])
    assert given == [None if expected is None else
                     "scheduler's client" if expected[0] == "scheduler" else "cluster's client"]


def test_a_render_on_the_command_line_runs_on_the_cluster_started_early(tiny, tmp_path,
                                                                        started, capsys):
    archive = record(tiny, str(tmp_path / "early.zarr"), n_steps=24)
    model = str(save_mjb(tiny, tmp_path / "tiny.mjb"))

    code = main(["render", archive, "--model", model, "--camera", "front", "--time",
                 "0:0.02", "--size", "48x64", "--out", str(tmp_path / "v"), "--workers", "1",
                 "--quiet"])

    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "v" / "world00001" / "front.mp4").is_file()
    assert started == [(1, None)]  # once, early; the render ran on it


def test_a_render_failing_before_its_cluster_is_used_closes_it(tiny, tmp_path, started,
                                                               capsys):
    archive = record(tiny, str(tmp_path / "early.zarr"), n_steps=24)
    model = str(save_mjb(tiny, tmp_path / "tiny.mjb"))

    code = main(["render", archive, "--model", model, "--camera", "no-such-camera",
                 "--out", str(tmp_path / "v"), "--workers", "1", "--quiet"])

    assert code == 2 and "no-such-camera" in capsys.readouterr().err
    assert started == [(1, None)]
    psutil.wait_procs(worker_processes(), timeout=20)
    assert worker_processes() == []


def test_a_scheduler_that_cannot_be_reached_is_one_clear_error_waited_for_once(
        tiny, tmp_path, capsys, monkeypatch):
    archive = record(tiny, str(tmp_path / "early.zarr"), n_steps=24)
    tries = []
    real = clusters._client
    monkeypatch.setattr(clusters, "_client", lambda *a: tries.append(a[1]) or real(*a))

    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        code = main(["render", archive, "--camera", "front", "--backend", "warp-cpu",
                     "--scheduler", "tcp://127.0.0.1:1", "--out", str(tmp_path / "v")])

    err = capsys.readouterr().err
    assert code == 2 and "Cannot connect to the Dask scheduler at 'tcp://127.0.0.1:1'" in err
    assert len(err.strip().splitlines()) == 1 and "dask scheduler" in err
    assert tries == ["tcp://127.0.0.1:1"]
    assert not (tmp_path / "v").exists() or not any((tmp_path / "v").rglob("*.mp4"))


def test_a_render_on_its_own_cluster_renders_the_first_segment_here_the_rest_on_workers(
        tiny, tmp_path, started, monkeypatch, capsys):
    from flyarchive.distribute import api

    archive = record(tiny, str(tmp_path / "early.zarr"), n_steps=240)
    model = str(save_mjb(tiny, tmp_path / "tiny.mjb"))
    here = []

    def recorded(plan, blob, parts, segment):
        here.append((segment[0].world_id, segment[1], segment[2]))
        return real(plan, blob, parts, segment)

    real = api._render_here
    monkeypatch.setattr(api, "_render_here", recorded)

    code = main(["render", archive, "--model", model, "--camera", "front", "--size", "48x64",
                 "--out", str(tmp_path / "v"), "--workers", "1", "--quiet"])

    assert code == 0, capsys.readouterr().err
    videos = json.loads((tmp_path / "v" / "manifest.json").read_text())["videos"]
    first = min(videos, key=lambda v: v["world"])
    assert [v["frames"] for v in videos] == [61, 61]  # 240 steps, a frame every 4, and the first
    assert len(here) == 1  # the first segment; the rest on the worker
    world, start, stop = here[0]
    assert (world, start) == (first["world"], 0) and 0 < stop < 61
    assert not list((tmp_path / "v").glob(".parts-*"))


def test_a_cluster_flyarchive_started_is_cold_once():
    with clusters.local_cluster(1) as client:
        first, second = clusters.started_cold(client), clusters.started_cold(client)

    assert (first, second) == (True, False)


def test_a_cluster_the_user_started_is_never_cold(dask_client):
    assert not clusters.started_cold(dask_client)


def test_a_scheduler_that_is_down_is_reported_within_flyarchives_connect_timeout(
        tiny, tmp_path, capsys, monkeypatch):
    """Dask's default connect timeout (30 s) left; flyarchive's own bound applies."""
    import time

    monkeypatch.setattr(clusters, "CONNECT_TIMEOUT_S", 1.0)
    archive = record(tiny, str(tmp_path / "down.zarr"), n_steps=24)
    start = time.monotonic()

    code = main(["render", archive, "--camera", "front", "--backend", "warp-cpu",
                 "--scheduler", "tcp://127.0.0.1:1", "--out", str(tmp_path / "v")])

    assert code == 2 and "Cannot connect to the Dask scheduler" in capsys.readouterr().err
    assert time.monotonic() - start < 20  # not Dask's 30 s


def test_a_render_waits_for_its_local_workers_a_bounded_time_then_goes_on_with_those_that_joined(
        caplog):
    """A worker process that died as it started is never replaced: the render waited for
    it for ever."""
    import logging

    from distributed import Client, LocalCluster

    from flyarchive.errors import RenderFailedError

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      silence_logs=40) as cluster, Client(cluster) as client:
        client.wait_for_workers(1)
        cluster.worker_spec["never"] = cluster.worker_spec[next(iter(cluster.worker_spec))]
        with caplog.at_level(logging.WARNING, logger="flyarchive.distribute.cluster"):
            clusters.wait_for_local_workers(client, timeout_s=1.0)  # 1 of 2: goes on
        del cluster.worker_spec["never"]
        assert "1 of the local cluster's 2 workers joined within 1 s" in caplog.text
    with LocalCluster(n_workers=0, processes=True, silence_logs=40) as cluster, \
            Client(cluster) as client:
        cluster.worker_spec["never"] = {"cls": object, "options": {}}
        with pytest.raises(RenderFailedError, match=r"None of the 1 worker processes of the "
                                                    r"local Dask cluster joined within 1 s"):
            clusters.wait_for_local_workers(client, timeout_s=1.0)
        del cluster.worker_spec["never"]

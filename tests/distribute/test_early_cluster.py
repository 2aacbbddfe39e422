"""The command line starts its local Dask cluster before its imports and the archive's
opening (``early_cluster``), and the render takes that cluster over instead of
starting a second one; a cluster the render does not take is closed.

Real LocalClusters with worker processes; the GPUs are a fake set of two (CI has no
CUDA): their workers are started, never asked to render.
"""

from __future__ import annotations

import contextlib
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

pytestmark = pytest.mark.timeout(180)

TWO = [Gpu(0, "0"), Gpu(1, "1")]


def worker_processes() -> list[psutil.Process]:
    """This process's Dask worker processes (its nannies' children included)."""
    return [p for p in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(p.cmdline())]


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


def test_connect_takes_over_the_gpu_cluster_started_early(started):
    workers = gpu_workers(TWO, cpus=range(2), sys_pci=Path("/nonexistent"))

    with dask.config.set({"distributed.diagnostics.nvml": False}):
        with clusters.early_cluster(gpu_workers=workers):
            early = next(iter(clusters._EARLY.values()))
            assert worker_processes()  # started before connect asks for them
            with clusters.connect(gpu_workers=workers) as client:
                names = sorted(w["name"] for w in client.scheduler_info()["workers"].values())
                taken = client.cluster is early
            left = dict(clusters._EARLY)

    assert taken and names == ["gpu0", "gpu1"]
    assert len(started) == 1 and left == {}
    psutil.wait_procs(worker_processes(), timeout=20)
    assert worker_processes() == []


def test_a_cluster_started_early_but_not_taken_is_closed(started):
    with clusters.early_cluster(2):
        assert len(clusters._EARLY) == 1
        with clusters.connect(n_workers=1) as client:  # another cluster: not this one
            assert len(client.scheduler_info()["workers"]) == 1

    assert clusters._EARLY == {} and len(started) == 2
    psutil.wait_procs(worker_processes(), timeout=20)
    assert worker_processes() == []


@pytest.mark.parametrize("argv, expected", [
    (["--backend", "gpu"], ("gpus", ["gpu0", "gpu1"])),
    (["--backend", "gpu", "--gpus", "1"], None),  # one GPU: in this process
    (["--backend", "gpu", "--scheduler", "tcp://127.0.0.1:1"], None),
    (["--backend", "warp-cpu"], None),  # render threads in this process
    (["--backend", "warp-cpu", "--workers", "2"], ("cpus", 2)),
    (["--backend", "cpu"], ("cpus", None)),
    (["--backend", "cpu", "--workers", "3"], ("cpus", 3)),
    (["--backend", "cpu", "--workers", "0"], None),
    (["--backend", "cpu", "--workers", "-1"], None),  # refused by the render itself
])
def test_the_command_line_starts_early_the_cluster_its_render_will_use(monkeypatch, argv,
                                                                        expected):
    from flyarchive import cli
    from flyarchive.distribute import gpus

    monkeypatch.setattr(gpus, "visible_gpus", lambda **_: list(TWO))
    asked = []

    @contextlib.contextmanager
    def early(n_workers=None, *, gpu_workers=None):
        asked.append(("gpus", [w.name for w in gpu_workers]) if gpu_workers
                     else ("cpus", n_workers))
        yield

    monkeypatch.setattr(clusters, "early_cluster", early)
    monkeypatch.setattr(cli, "_render", lambda args: 0)

    assert main(["render", "run.zarr", "--camera", "front", *argv]) == 0
    assert asked == ([expected] if expected else [])


def test_a_render_on_the_command_line_runs_on_the_cluster_started_early(tiny, tmp_path,
                                                                        started, capsys):
    archive = record(tiny, str(tmp_path / "early.zarr"), n_steps=24)
    model = str(save_mjb(tiny, tmp_path / "tiny.mjb"))

    code = main(["render", archive, "--model", model, "--camera", "front", "--time",
                 "0:0.02", "--size", "48x64", "--out", str(tmp_path / "v"), "--workers", "2",
                 "--quiet"])

    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "v" / "world00001" / "front.mp4").is_file()
    assert started == [(2, None)]  # once, early; the render took it
    assert clusters._EARLY == {}


def test_a_render_failing_before_its_cluster_is_used_closes_it(tiny, tmp_path, started,
                                                               capsys):
    archive = record(tiny, str(tmp_path / "early.zarr"), n_steps=24)
    model = str(save_mjb(tiny, tmp_path / "tiny.mjb"))

    code = main(["render", archive, "--model", model, "--camera", "no-such-camera",
                 "--out", str(tmp_path / "v"), "--workers", "2", "--quiet"])

    assert code == 2 and "no-such-camera" in capsys.readouterr().err
    assert started == [(2, None)] and clusters._EARLY == {}
    psutil.wait_procs(worker_processes(), timeout=20)
    assert worker_processes() == []

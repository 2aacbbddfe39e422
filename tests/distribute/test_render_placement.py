"""What the docstrings of :func:`flyarchive.render_videos` and
:func:`flyarchive.distribute.api.run_plan` promise, pinned: where the videos go
and what they are called, and where the work runs.

- Videos are ``{out}/world{id:05d}/{camera}.mp4``, camera names sanitized as
  :func:`flyarchive.video.safe_video_path` says (characters other than letters, digits,
  ``.``, ``_``, ``-`` become ``_``, and a name that changed gets ``-`` and 8 hex digits
  of its SHA-256); the manifest is ``{out}/manifest.json``.
- ``n_workers=0`` renders in this process; so does a ``memory://`` archive.
- ``"opengl"`` otherwise renders on a local cluster of worker processes (one per core,
  or ``n_workers``), in this process on a one-core machine;
  ``"warp-cpu"`` renders on threads in this process unless ``n_workers`` >= 2 asks for
  worker processes;
  ``"gpu"`` renders in this process on one GPU unless a client or a scheduler is given
  (several GPUs: a local cluster of one worker per GPU, tests/distribute/test_gpu_placement.py).

Where work runs is seen from outside: ``distributed.LocalCluster`` and
``distributed.Client`` are replaced by recorders that stop the render when asked for a
cluster (rendering on real clusters is tested in test_render_dask.py and
tests/render/test_render_warp.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any

import mujoco
import pytest

from flyarchive.distribute.api import RenderOptions, render_videos
from flyarchive.errors import RenderBackendError
from flyarchive.testing import TINY_XML
from flyarchive.testing.fixtures import record, to_memory
from flyarchive.testing.markers import requires_distributed, requires_warp

SMALL = RenderOptions(size=(48, 64), segment_frames=8)


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Worlds 3 and 12 of the tiny model, 6 frames each, recorded once: tests only read it."""
    from flyarchive.testing import tiny_model

    return record(tiny_model(), str(tmp_path_factory.mktemp("placement") / "run.zarr"),
                  n_steps=20, world_ids=[3, 12])


class ClusterAsked(Exception):
    """Raised by the recorders below: render_videos asked for a Dask cluster."""


@pytest.fixture
def clusters(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """Every Dask cluster or client the code asks for: ``("LocalCluster", None)`` or
    ``("Client", address)``; asking stops the render with :class:`ClusterAsked`."""
    distributed = pytest.importorskip("distributed")
    asked: list[tuple[str, Any]] = []

    def local_cluster(*args: Any, **kwargs: Any) -> Any:
        asked.append(("LocalCluster", None))
        raise ClusterAsked

    def client(address: Any = None, *args: Any, **kwargs: Any) -> Any:
        asked.append(("Client", address))
        raise ClusterAsked

    monkeypatch.setattr(distributed, "LocalCluster", local_cluster)
    monkeypatch.setattr(distributed, "Client", client)
    return asked


# ----------------------------------------------------------------------------- names
def test_videos_are_out_world_id_camera_mp4_beside_a_manifest(tiny, archive, tmp_path):
    out = tmp_path / "videos"

    result = render_videos(archive, tiny, ["front", "top"], str(out), options=SMALL, n_workers=0)

    expected = [str(out / f"world{w:05d}" / f"{c}.mp4") for w in (3, 12) for c in ("front", "top")]
    assert sorted(v["path"] for v in result.videos) == sorted(expected)
    assert all(Path(path).is_file() for path in expected)
    assert result.manifest == str(out / "manifest.json") and Path(result.manifest).is_file()


@pytest.mark.parametrize(("camera", "stem"), [
    ("nmf/trackcam", "nmf_trackcam"),
    ("rig top cam", "rig_top_cam"),
    (".hidden", "_hidden"),
])
def test_camera_names_become_safe_file_names_with_a_hash_of_the_original(
        archive, tmp_path, camera, stem):
    model = mujoco.MjModel.from_xml_string(TINY_XML.replace('name="top"', f'name="{camera}"'))
    out = tmp_path / "videos"
    digest = hashlib.sha256(camera.encode()).hexdigest()[:8]

    result = render_videos(archive, model, camera, str(out), worlds=[3], options=SMALL,
                           n_workers=0)

    assert [v["path"] for v in result.videos] == [str(out / "world00003" / f"{stem}-{digest}.mp4")]
    assert [v["camera"] for v in result.videos] == [camera]


# ----------------------------------------------------------------------------- where work runs
@requires_distributed
def test_n_workers_0_renders_in_this_process(tiny, archive, tmp_path, clusters):
    result = render_videos(archive, tiny, "front", str(tmp_path / "v"), options=SMALL,
                           n_workers=0)

    assert clusters == []
    assert len(result.videos) == 2


@requires_distributed
def test_a_memory_archive_renders_in_this_process_whatever_n_workers(tiny, archive, tmp_path,
                                                                     clusters):
    url = to_memory(archive)

    result = render_videos(url, tiny, "front", str(tmp_path / "v"), options=SMALL, n_workers=2)

    assert clusters == []
    assert len(result.videos) == 2


@requires_distributed
@pytest.mark.parametrize("n_workers, gl, asked", [
    (1, "egl", ("LocalCluster", None)),  # worker processes asked for
    (2, "egl", ("LocalCluster", None)),
    (None, "egl", ("LocalCluster", None)),  # the default: one worker per core
    (None, "glfw", ("LocalCluster", None)),
])
def test_opengl_starts_a_local_cluster_of_worker_processes(tiny, archive, tmp_path,
                                                                     clusters, monkeypatch,
                                                                     n_workers, gl, asked):
    monkeypatch.setenv("MUJOCO_GL", gl)

    with pytest.raises(ClusterAsked):
        render_videos(archive, tiny, "front", str(tmp_path / "v"), options=SMALL,
                      n_workers=n_workers)

    assert clusters == [asked]


def test_opengl_placement_follows_the_cores(monkeypatch):
    from flyarchive.distribute.placement import Placement, placement

    monkeypatch.setenv("MUJOCO_GL", "egl")
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    assert placement("opengl", 3) == Placement("local", n_workers=None)
    assert placement("opengl", 3, n_workers=2) == Placement("local", n_workers=2)
    assert placement("opengl", 3, in_process=True) == Placement("here")
    assert placement("opengl", 3, client="a client") == Placement("cluster")
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert placement("opengl", 3) == Placement("here")
    assert placement("opengl", 3, n_workers=2) == Placement("local", n_workers=2)


@requires_warp
@requires_distributed
def test_warp_cpu_renders_in_this_process_by_default(tiny, archive, tmp_path, clusters):
    options = RenderOptions(size=(48, 64), backend="warp-cpu", batch_worlds=4)

    result = render_videos(archive, tiny, "front", str(tmp_path / "v"), options=options)

    assert clusters == []
    assert len(result.videos) == 2


@requires_warp
@requires_distributed
def test_warp_cpu_starts_a_local_cluster_when_asked_for_worker_processes(tiny, archive, tmp_path,
                                                                          clusters):
    options = RenderOptions(size=(48, 64), backend="warp-cpu", batch_worlds=4)

    with pytest.raises(ClusterAsked):
        render_videos(archive, tiny, "front", str(tmp_path / "v"), options=options, n_workers=2)

    assert clusters == [("LocalCluster", None)]


@requires_warp
@requires_distributed
def test_gpu_renders_in_this_process_on_one_gpu(tiny, archive, tmp_path, clusters):
    options = RenderOptions(size=(48, 64), backend="gpu", batch_worlds=4)

    with contextlib.suppress(RenderBackendError):  # without CUDA: refused here, in process
        render_videos(archive, tiny, "front", str(tmp_path / "v"), options=options, n_workers=4,
                      gpus=[0])

    assert clusters == []


@requires_warp
@requires_distributed
def test_gpu_goes_to_the_scheduler_given(tiny, archive, tmp_path, clusters):
    options = RenderOptions(size=(48, 64), backend="gpu", batch_worlds=4)

    with pytest.raises(ClusterAsked):
        render_videos(archive, tiny, "front", str(tmp_path / "v"), options=options,
                      scheduler="tcp://127.0.0.1:8786")

    assert clusters == [("Client", "tcp://127.0.0.1:8786")]


class _Failed:
    """A Dask future whose result raises ``error``."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def result(self) -> None:
        raise self.error


@pytest.mark.parametrize(("reason", "says"), [
    ("scheduler-connection-lost", "The connection to the Dask scheduler was lost while rendering "
                                  "world 2, frames 400..499. No partial video"),
    ("already forgotten", "was cancelled by the Dask cluster: what it needed (the model sent to "
                          "the workers) was lost with a worker that died"),
    ("something else", "failed on the Dask cluster (FutureCancelledError: "),
])
def test_a_cancelled_render_task_says_why_and_to_resume(reason, says):
    from distributed.client import FutureCancelledError

    from flyarchive.distribute.cluster import task_result
    from flyarchive.errors import RenderFailedError

    with pytest.raises(RenderFailedError) as caught:
        task_result(_Failed(FutureCancelledError("render-1", reason=reason)),
                    "world 2, frames 400..499")

    assert says in str(caught.value) and "--resume (resume=True)" in str(caught.value)

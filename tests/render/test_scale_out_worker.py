"""What one render worker pays once: its renderer is kept across calls with the same model
and options; and what it overlaps: archive reads run ahead of rendering, bounded, in order.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from flyarchive.distribute.api import RenderOptions, render_videos
from flyarchive.render.plan import pack_batches
from flyarchive.render.warp_pipeline import _read_ahead
from flyarchive.query.selection import VideoJob
from flyarchive.testing import tiny_model
from flyarchive.testing.fixtures import record
from flyarchive.testing.markers import WARP_BACKEND, requires_warp

JOBS = tuple(VideoJob(w, w, 0, 10) for w in range(4))
BATCHES = pack_batches(JOBS, 4)  # 10 batches of 4 states


class SlowSource:
    """Stands in for a BatchSource: each read blocks until released, and is recorded."""

    def __init__(self) -> None:
        self.started: list[Any] = []
        self.lock = threading.Lock()
        self.release = threading.Event()

    def read(self, batch: Any) -> Any:
        with self.lock:
            self.started.append(batch)
        self.release.wait(10)
        return batch

    def n_started(self) -> int:
        with self.lock:
            return len(self.started)


def wait_until(check: Any, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not check():
        time.sleep(0.01)
    return check()


def test_reads_of_later_batches_start_before_the_first_is_consumed_up_to_the_depth():
    source = SlowSource()

    with _read_ahead(source, BATCHES, depth=3, readers=3) as states:
        in_flight = wait_until(lambda: source.n_started() == 3)
        time.sleep(0.1)  # room for a fourth read, which must not start
        started_before_consuming = source.n_started()
        source.release.set()
        got = list(states)

    assert in_flight and started_before_consuming == 3
    assert got == BATCHES


def test_a_failed_read_raises_when_its_batch_is_reached_after_the_earlier_ones():
    class FailingThird(SlowSource):
        def read(self, batch):
            if batch == BATCHES[2]:
                raise OSError("connection reset")
            return batch

    got = []

    with pytest.raises(OSError, match="connection reset"):
        with _read_ahead(FailingThird(), BATCHES, depth=4, readers=2) as states:
            for item in states:
                got.append(item)

    assert got == BATCHES[:2]


@requires_warp
def test_a_worker_builds_its_renderer_once_for_calls_with_the_same_model_and_options(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from flyarchive.render.renderer_cache import clear_renderers
    from flyarchive.replay import warp_frames as replay_warp

    url = record(tiny_model(), str(tmp_path / "run.zarr"), n_worlds=2)
    clear_renderers()  # not one an earlier test left with the same key
    built = []
    real = replay_warp.WarpBatchRenderer

    def counting(*args: Any, **kwargs: Any) -> Any:
        built.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(replay_warp, "WarpBatchRenderer", counting)
    options = RenderOptions(size=(48, 64), backend=WARP_BACKEND, batch_worlds=4)
    other = RenderOptions(size=(32, 48), backend=WARP_BACKEND, batch_worlds=4)

    for out in ("a", "b", "c"):
        render_videos(url, None, "front", str(tmp_path / out), options=options, n_workers=0)
    render_videos(url, None, "front", str(tmp_path / "d"), options=other, n_workers=0)

    assert built == [(48, 64), (32, 48)]


@requires_warp
def test_rendering_here_starts_loading_warp_while_the_archive_is_opened(monkeypatch):
    from flyarchive.distribute import warm

    monkeypatch.setattr(warm, "_warming", None)

    warm.warm_up_here("warp-cpu", gpus=None, n_workers=0, on_cluster=False)
    warming = warm._warming

    assert warming is not None and warming.name == "flyarchive-warm"
    warming.join()


@pytest.mark.parametrize("where", [
    {"backend": "gpu", "gpus": None, "n_workers": None, "on_cluster": False},  # 2 GPUs
    {"backend": "gpu", "gpus": [0], "n_workers": None, "on_cluster": True},
    {"backend": "cpu", "gpus": None, "n_workers": 0, "on_cluster": False},
])
def test_nothing_is_warmed_here_when_workers_render(where, monkeypatch):
    from flyarchive.distribute import warm

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setattr(warm, "_warming", None)

    warm.warm_up_here(where.pop("backend"), **where)

    assert warm._warming is None


def a_plan(url: str, out: str) -> tuple[Any, bytes]:
    """The render plan of every world of ``url`` to ``out`` (as render_videos makes it)."""
    from flyarchive.distribute.api import replay_model
    from flyarchive.render.plan import RenderPlan
    from flyarchive.query import open_archive, select_frames

    ds = open_archive(url)
    _, blob = replay_model(url, ds, None)
    plan = RenderPlan(url=url, storage_options={}, cameras=("front",), out=out,
                      out_storage_options={}, fps=float(ds.attrs["output_fps"]),
                      options=RenderOptions(size=(48, 64), backend=WARP_BACKEND, batch_worlds=4,
                                            progress=False),
                      jobs=tuple(select_frames(ds)))
    return plan, blob


@requires_warp
def test_a_group_run_again_after_its_worker_died_keeps_the_videos_it_finished(tmp_path: Path):
    from flyarchive.distribute.warp_runs import render_group
    from flyarchive.video.workspace import RunFolder

    url = record(tiny_model(), str(tmp_path / "run.zarr"), n_worlds=3)
    plan, blob = a_plan(url, str(tmp_path / "v"))
    with RunFolder.create(plan.out, {}) as run:
        first, _ = render_group(plan, blob, plan.jobs, run.url, None)
        kept = Path(first[0]["path"])
        stamp = kept.stat().st_mtime_ns
        lost = Path(first[1]["path"])
        lost.unlink()  # the first run died before it published this one

        again, _ = render_group(plan, blob, plan.jobs, run.url, None)

    assert again == first
    assert kept.stat().st_mtime_ns == stamp
    assert lost.is_file()


@pytest.mark.cluster
def test_a_local_cluster_worker_exits_with_its_objects_frozen_out_of_the_collector(tmp_path):
    """The interpreter's final collections would walk every object importing mujoco_warp
    made (a worker took 1.2-1.4 s to exit, and the cluster's close waits for its
    workers); the worker preload freezes them at exit, after every other exit handler."""
    import subprocess
    import sys

    script = tmp_path / "worker_exit.py"
    script.write_text(
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('collected at exit:', len(gc.get_objects()) > 1000))\n"
        "from flyarchive.distribute.worker_setup import dask_setup\n"
        "class Worker:\n"
        "    total_resources = {}\n"
        "dask_setup(Worker())\n"
        "atexit.register(lambda: print('exit handler after the preload ran', flush=True))\n"
    )

    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["exit handler after the preload ran",
                                        "collected at exit: False"]


def test_a_kept_archive_appended_to_since_is_opened_again_for_the_frames_asked(tmp_path):
    """A long-lived cluster's workers kept the archive as they first opened it: after an
    append (the archive's id stays) a render of the new frames failed as damaged bytes."""
    from flyarchive import open_archive
    from flyarchive.render.opengl_pipeline import world_states
    from flyarchive.render.renderer_cache import clear_renderers, state_reader

    model = tiny_model()
    url = record(model, str(tmp_path / "run.zarr"), n_worlds=1, n_steps=76)  # 20 frames
    archive_id = open_archive(url).attrs["archive_id"]
    try:
        first = state_reader(url, None, archive_id)
        record(model, url, n_worlds=1, n_steps=156, mode="a")  # 40 frames, the same id
        grown = open_archive(url)

        qpos, _, _ = world_states(url, None, 0, 0, 40, archive_id)

        assert first.n_time == 20 and grown.attrs["archive_id"] == archive_id
        assert state_reader(url, None, archive_id) is not first
        assert (qpos == grown.qpos.values[0]).all()
    finally:
        clear_renderers()

"""The record stage's recorders write nowhere on their own: the public ones
(:mod:`flyarchive.recorders`) are bound to flyarchive's archives (dependency injection:
record imports only the base modules)."""

from __future__ import annotations

import subprocess
import sys

import mujoco
import pytest

import flyarchive
from flyarchive.record.cpu_recorder import TrajectoryRecorder as Unbound
from flyarchive.recorders import ARCHIVES, TrajectoryRecorder
from flyarchive.testing.markers import requires_warp


def test_the_public_recorder_is_the_record_stages_bound_to_the_store():
    assert flyarchive.TrajectoryRecorder is TrajectoryRecorder
    assert issubclass(TrajectoryRecorder, Unbound) and TrajectoryRecorder.archives is ARCHIVES
    assert TrajectoryRecorder.__doc__ == Unbound.__doc__


def test_a_recorder_bound_to_nothing_is_refused_before_any_storage(tiny, tmp_path):
    with pytest.raises(TypeError, match="flyarchive.TrajectoryRecorder"):
        Unbound(str(tmp_path / "run.zarr"), tiny)

    assert not (tmp_path / "run.zarr").exists()


def test_the_bound_recorder_writes_and_reads_back_through_the_store(tiny, tmp_path):
    data = mujoco.MjData(tiny)
    url = str(tmp_path / "run.zarr")
    with TrajectoryRecorder(url, tiny, output_fps=100) as recorder:
        for _ in range(20):
            mujoco.mj_step(tiny, data)
            recorder.record_as_needed(data)

    ds = flyarchive.open_archive(url)
    assert recorder.n_frames > 0 and int(ds.n_frames.max()) == recorder.n_frames


@pytest.mark.subprocess
@requires_warp
def test_the_warp_recorder_is_a_plain_class_of_its_module_loaded_on_first_use():
    code = (
        "import inspect, sys, flyarchive, flyarchive.recorders as recorders\n"
        "before = 'warp' in sys.modules\n"
        "cls = flyarchive.WarpTrajectoryRecorder\n"
        "from flyarchive.record.warp_recorder import WarpTrajectoryRecorder as Unbound\n"
        "print(before, 'warp' in sys.modules, cls.__module__, cls is recorders.WarpTrajectoryRecorder,\n"
        "      issubclass(cls, Unbound), cls.archives is recorders.ARCHIVES,\n"
        "      inspect.getsource(cls).startswith('class WarpTrajectoryRecorder('))\n"
    )

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)

    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "flyarchive.recorders.warp_trajectory_recorder",
                                  "True", "True", "True", "True"]

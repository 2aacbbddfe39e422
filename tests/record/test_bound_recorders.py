"""The record stage's recorders write nowhere on their own: the public ones
(:mod:`flyarchive.recorders`) are bound to flyarchive's archives (dependency injection:
record imports only the base modules)."""

from __future__ import annotations

import mujoco
import pytest

import flyarchive
from flyarchive.record.cpu_recorder import TrajectoryRecorder as Unbound
from flyarchive.recorders import ARCHIVES, TrajectoryRecorder


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

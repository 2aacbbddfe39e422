"""Query, then render: a ``where`` mask computed from the archive selects worlds, or
windows of frames (padded, nearby ones merged), as per-world frame ranges."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from flyarchive import open_archive, select_frames
from flyarchive.query.conditions import where_from_conditions
from flyarchive.query.selection import VideoJob, where_windows
from flyarchive.testing.fixtures import slider_archive

#: Slider positions of 3 worlds x 30 frames (frame k at t = k * 0.01 s): world 0 is
#: beyond 0.5 at frames 3..5 and 20..22, world 1 never, world 2 at frames 10..29.
QPOS = np.zeros((3, 30, 1))
QPOS[0, 3:6] = QPOS[0, 20:23] = 1.0
QPOS[2, 10:] = 1.0


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory) -> xr.Dataset:
    url = slider_archive(str(tmp_path_factory.mktemp("where") / "slider.zarr"), QPOS)
    return open_archive(url)


def frames(jobs: list[VideoJob]) -> list[tuple[int, int, int, int | None]]:
    return [(j.world_id, j.start, j.stop, j.window) for j in jobs]


def test_a_world_mask_selects_whole_worlds(ds):
    where = xr.DataArray([True, False, True], dims="world", coords={"world": [0, 1, 2]})

    jobs = select_frames(ds, where=where)

    assert frames(jobs) == [(0, 0, 30, None), (2, 0, 30, None)]


def test_a_frame_mask_selects_each_run_of_frames_as_a_window(ds):
    where = ds.qpos.sel(dof="x") > 0.5

    jobs = select_frames(ds, where=where)

    assert frames(jobs) == [(0, 3, 6, 0), (0, 20, 23, 1), (2, 10, 30, 0)]


def test_pad_widens_windows_and_stops_at_the_recording(ds):
    where = ds.qpos.sel(dof="x") > 0.5

    jobs = select_frames(ds, where=where, pad=0.02)

    assert frames(jobs) == [(0, 1, 8, 0), (0, 18, 25, 1), (2, 8, 30, 0)]


def test_windows_closer_than_twice_the_pad_merge(ds):
    where = ds.qpos.sel(dof="x") > 0.5  # world 0: runs 3..5 and 20..22, 14 frames apart

    jobs = select_frames(ds, where=where, worlds=[0], pad=0.08)

    assert frames(jobs) == [(0, 0, 30, 0)]


def test_windows_further_than_twice_the_pad_stay_apart(ds):
    where = ds.qpos.sel(dof="x") > 0.5

    jobs = select_frames(ds, where=where, worlds=[0], pad=0.06)

    assert frames(jobs) == [(0, 0, 12, 0), (0, 14, 29, 1)]


def test_a_mask_combines_with_the_time_window(ds):
    where = ds.qpos.sel(dof="x") > 0.5

    jobs = select_frames(ds, where=where, time=(0.04, 0.21), pad=0.01)

    assert frames(jobs) == [(0, 4, 7, 0), (0, 19, 22, 1), (2, 9, 22, 0)]


def test_a_mask_of_some_worlds_and_times_selects_within_them(ds):
    part = ds.isel(world=[2], time=slice(0, 15))

    jobs = select_frames(ds, where=part.qpos.sel(dof="x") > 0.5)

    assert frames(jobs) == [(2, 10, 15, 0)]


def test_a_window_video_name_carries_its_frames():
    job = VideoJob(3, 0, 120, 240, window=1)

    assert (job.suffix, VideoJob(3, 0, 120, 240).suffix) == (".frames000120-000240", "")


def test_windows_of_a_row_cut_to_the_committed_frames():
    row = np.array([0, 1, 1, 0, 0, 0, 1, 1, 1, 1], dtype=bool)
    times = np.arange(10) * 0.1

    windows = where_windows(row, times, 0.1, 0, 8)

    assert windows == [(0, 4), (5, 8)]


def test_written_conditions_make_the_same_masks(ds):
    expected = (ds.qpos.sel(dof="x") > 0.5).values

    actual = where_from_conditions(ds, [], ["x>0.5"]).values

    np.testing.assert_array_equal(actual, expected)


def test_a_condition_on_n_frames_selects_the_worlds_by_frames_recorded(ds):
    recorded = ds.assign(n_frames=("world", np.array([30, 0, 12])))  # as --overlay shows it

    actual = where_from_conditions(recorded, ["n_frames>0"]).values

    np.testing.assert_array_equal(actual, [True, False, True])

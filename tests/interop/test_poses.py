"""Positions as movement poses datasets and NWB files that movement and pynwb read back."""

from __future__ import annotations

import numpy as np
import pytest

import flyarchive
from flyarchive.interop.poses import export_poses, to_movement
from flyarchive.testing.fixtures import record
from flyarchive.testing.markers import requires_movement, requires_nwb

pytestmark = pytest.mark.slow  # movement, xarray's netCDF and pynwb import for seconds

POINTS = {"arm/tip": ("arm", "tip")}


@pytest.fixture
def archive(tiny, tmp_path):
    return record(tiny, str(tmp_path / "run.zarr"), n_worlds=3)


@requires_movement
def test_a_movement_dataset_that_movement_validates_and_analyses(archive):
    from movement.kinematics import compute_speed
    from movement.validators.datasets import ValidPosesInputs

    positions = flyarchive.positions(archive, ["torso", "hand"], points=POINTS)

    ds = to_movement(positions)

    ValidPosesInputs.validate(ds)
    assert ds.position.dims == ("time", "space", "keypoint", "individual")
    assert ds.individual.values.tolist() == ["world0", "world1", "world2"]
    assert ds.world.values.tolist() == [0, 1, 2] and (ds.confidence == 1).all()
    assert ds.attrs["time_unit"] == "seconds" and ds.attrs["fps"] == 125.0  # not 124.99999999999989
    expected = positions.sel(world=1, keypoint="hand").values
    assert np.array_equal(ds.position.sel(individual="world1", keypoint="hand").values, expected)
    speed = compute_speed(ds.position).sel(individual="world1", keypoint="hand").values
    step = np.linalg.norm(np.diff(expected, axis=0), axis=-1) / 0.008
    assert speed[1] == pytest.approx((step[0] + step[1]) / 2, rel=0.2)


@requires_movement
def test_a_movement_netcdf_file_reads_back_as_written(archive, tmp_path):
    import xarray as xr

    written = export_poses(archive, tmp_path / "poses.nc", format="movement", bodies="hand",
                           worlds=[2], time=(0.04, 0.1))

    back = xr.open_dataset(written[0])
    expected = to_movement(flyarchive.positions(archive, "hand", worlds=[2], time=(0.04, 0.1)),
                           length_unit="mm")
    xr.testing.assert_identical(back.load(), expected)
    assert back.position.attrs["units"] == "mm"  # export-poses' --length-unit, read by gait


@requires_nwb
def test_one_nwb_file_per_world_that_pynwb_reads_back(archive, tmp_path):
    import pynwb

    written = export_poses(archive, tmp_path / "nwb", format="nwb", bodies=["torso", "hand"],
                           points=POINTS)

    expected = flyarchive.positions(archive, ["torso", "hand"], points=POINTS)
    assert [p.rsplit("/", 1)[-1] for p in written] == [f"world0000{w}.nwb" for w in range(3)]
    archive_id = flyarchive.open_archive(archive).attrs["archive_id"]
    with pynwb.NWBHDF5IO(written[1], "r") as io:
        nwb = io.read()
        pose = nwb.processing["behavior"]["PoseEstimation"]
        series = pose.pose_estimation_series["arm.tip"]
        assert nwb.identifier == f"world1-{archive_id}"
        assert nwb.subject.subject_id == f"world1-{archive_id[:8]}"
        assert np.array_equal(series.data[:], expected.sel(world=1, keypoint="arm/tip").values)
        assert series.starting_time == expected.time.values[0]  # evenly spaced frames: a rate
        assert series.rate == 125.0  # the archive's 25 frames/s at 0.2x, not 1/diff's 124.99...
        assert series.unit == "meters" and series.conversion == 1e-3
        assert list(pose.skeleton.nodes[:]) == ["torso", "hand", "arm.tip"]


@requires_nwb
def test_an_nwb_export_to_a_link_to_a_folder_writes_into_that_folder(archive, tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "nwb").symlink_to(tmp_path / "results")

    written = export_poses(archive, tmp_path / "nwb", format="nwb", bodies="hand", worlds=[1])

    assert written == [str(tmp_path / "nwb" / "world00001.nwb")]
    assert [p.name for p in (tmp_path / "results").iterdir()] == ["world00001.nwb"]


@requires_nwb
@requires_movement
def test_movement_loads_the_nwb_files(archive, tmp_path):
    from movement.io import load_poses

    written = export_poses(archive, tmp_path / "nwb", format="nwb", bodies="hand", worlds=[0])

    ds = load_poses.from_nwb_file(written[0])

    expected = flyarchive.positions(archive, "hand", worlds=[0]).values[0, :, 0]
    name = f"world0-{flyarchive.open_archive(archive).attrs['archive_id']}"  # the identifier
    assert np.array_equal(ds.position.sel(keypoint="hand", individual=name).values, expected)


@requires_movement
def test_a_movement_export_of_an_archive_goes_back_through_the_same_gait(archive, tmp_path):
    import xarray as xr

    from flyarchive.analyze.gait import GaitParams

    params = GaitParams(stance_height=0.05)
    written = export_poses(archive, tmp_path / "poses.nc", format="movement",
                           bodies=["torso", "hand"])
    back = xr.load_dataset(written[0])

    again = flyarchive.gait_summary(back, thorax="torso", legs={"lf": "hand"}, params=params)
    direct = flyarchive.gait_summary(archive, thorax="torso", tips=["hand"], params=params)

    assert again.sizes["world"] == direct.sizes["world"] == 3
    np.testing.assert_allclose(again.path_length.values, direct.path_length.values, rtol=1e-9)


@requires_movement
@requires_nwb
def test_exports_give_the_frame_rate_recorded_not_a_float_artefact(tiny, tmp_path):
    import pynwb

    url = record(tiny, str(tmp_path / "fifty.zarr"), n_worlds=1, n_steps=200, output_fps=50,
                 playback_speed=1.0)

    for time in (None, (0.1, 0.3)):  # 1/diff of the times: 49.99999999999996, 50.00000000000003
        ds = to_movement(flyarchive.positions(url, "hand", time=time))
        assert ds.attrs["fps"] == 50.0
        written = export_poses(url, tmp_path / f"nwb{time is None}", format="nwb", bodies="hand",
                               time=time)
        with pynwb.NWBHDF5IO(written[0], "r") as io:
            series = io.read().processing["behavior"]["PoseEstimation"].pose_estimation_series
            assert next(iter(series.values())).rate == 50.0

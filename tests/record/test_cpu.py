"""CPU recording: round trip on every storage backend, commit protocol, modes."""

import numpy as np
import pytest
import xarray as xr

from flyarchive import TrajectoryRecorder, open_archive
from flyarchive.clock import FrameClock, Timing
from flyarchive.errors import ArchiveExistsError, LayoutMismatchError
from flyarchive.testing import simulate, slider_model
from flyarchive.testing.fixtures import Location


def record_tiny(model, location, *, n_worlds=2, n_steps=150, chunk_frames=8, mode="w-"):
    """Simulate and record; return the states at the recorded steps, as the simulation had them."""
    expected = {"time": [], "qpos": [], "mocap_pos": [], "mocap_quat": []}
    clock = FrameClock(Timing(model.opt.timestep, 25, 0.2))
    recorder = TrajectoryRecorder(
        location.url, model, chunk_frames=chunk_frames, mode=mode,
        storage_options=location.storage_options,
    )

    def on_step(datas):
        if clock.is_due_at(datas[0].time):
            expected["time"].append(datas[0].time)
            for key in ("qpos", "mocap_pos", "mocap_quat"):
                expected[key].append(np.stack([getattr(d, key).copy() for d in datas]))
        assert recorder.record_as_needed(datas) == (len(expected["time"]) == recorder.n_frames
                                                    and expected["time"][-1] == datas[0].time)

    with recorder:
        simulate(model, n_worlds, n_steps, on_step)
    return {k: np.array(v) if k == "time" else np.stack(v, axis=1) for k, v in expected.items()}


def test_round_trip_is_bit_exact(tiny, location):
    expected = record_tiny(tiny, location)

    ds = open_archive(location.url, location.storage_options)

    np.testing.assert_array_equal(ds.sim_time.values, expected["time"])
    np.testing.assert_array_equal(ds.qpos.values, expected["qpos"])
    np.testing.assert_array_equal(ds.mocap_pos.values, expected["mocap_pos"])
    np.testing.assert_array_equal(ds.mocap_quat.values, expected["mocap_quat"])
    assert ds.qpos.dtype == np.float64
    assert list(ds.n_frames.values) == [len(expected["time"])] * 2
    assert ds.frame.values.tolist() == list(range(len(expected["time"])))  # on schedule


# The schedule does not depend on the storage: the S3 round trip above checks it there.
@pytest.mark.parametrize("location", ["memory", "local"], indirect=True)
def test_frames_follow_the_schedule(tiny, location):
    record_tiny(tiny, location, n_worlds=1, n_steps=100)

    ds = open_archive(location.url, location.storage_options)

    # timestep 0.002, 25 fps at 0.2x: a frame every 4 steps, steps 0..100 -> 26 frames
    assert ds.sizes["time"] == 26
    assert ds.frame.values.tolist() == list(range(26))
    np.testing.assert_allclose(ds.sim_time.values, np.arange(26) * 0.008, atol=1e-12)


def test_plain_xarray_and_zarr_read_the_archive_without_flyarchive(tiny, tmp_path):
    import zarr

    url = str(tmp_path / "plain.zarr")
    expected = record_tiny(tiny, Location(url))

    plain = xr.open_zarr(url, consolidated=False)
    group = zarr.open_group(url, mode="r")

    np.testing.assert_array_equal(plain.qpos.values, expected["qpos"])
    np.testing.assert_array_equal(group["qpos"][:], expected["qpos"])
    assert list(plain.dof.values)[:3] == ["root/x", "root/y", "root/z"]
    assert plain.attrs["flyarchive_schema_version"] == 1


def test_world_ids_and_user_metadata_are_stored(tiny, tmp_path):
    url = str(tmp_path / "meta.zarr")
    recorder = TrajectoryRecorder(
        url, tiny, world_ids=[10, 42], attrs={"seed": 7, "controller": {"gain": 0.5}},
        world_vars={"stiffness": np.array([1.0, 2.0])},
    )
    with recorder:
        simulate(tiny, 2, 10, recorder.record_as_needed)

    ds = open_archive(url)

    assert list(ds.world.values) == [10, 42]
    assert ds.attrs["seed"] == 7 and ds.attrs["controller"] == {"gain": 0.5}
    np.testing.assert_array_equal(ds.stiffness.values, [1.0, 2.0])
    assert ds.attrs["layout"]["nq"] == tiny.nq
    assert ds.attrs["source"] == "mujoco"


def test_existing_archive_is_not_overwritten(tiny, tmp_path):
    location = Location(str(tmp_path / "keep.zarr"))
    expected = record_tiny(tiny, location)

    with pytest.raises(ArchiveExistsError, match="mode='a' to append"):
        TrajectoryRecorder(location.url, tiny)

    np.testing.assert_array_equal(open_archive(location.url).qpos.values, expected["qpos"])


def test_overwrite_when_asked(tiny, tmp_path):
    location = Location(str(tmp_path / "replace.zarr"))
    record_tiny(tiny, location, n_steps=100)

    expected = record_tiny(tiny, location, n_steps=40, mode="w")

    assert open_archive(location.url).sizes["time"] == len(expected["time"]) == 11


def test_resume_appends_after_last_committed_frame(tiny, tmp_path):
    location = Location(str(tmp_path / "resume.zarr"))
    full = record_tiny(tiny, Location(str(tmp_path / "full.zarr")), n_steps=150)
    first = TrajectoryRecorder(location.url, tiny, chunk_frames=8)
    with first:
        simulate(tiny, 2, 60, first.record_as_needed)

    # A deterministic rerun from the start; frames already committed are skipped.
    second = TrajectoryRecorder(location.url, tiny, chunk_frames=8, mode="a")
    with second:
        simulate(tiny, 2, 150, second.record_as_needed)

    ds = open_archive(location.url)
    np.testing.assert_array_equal(ds.qpos.values, full["qpos"])
    np.testing.assert_array_equal(ds.sim_time.values, full["time"])


def test_appending_with_another_model_names_the_difference(tiny, tmp_path):
    location = Location(str(tmp_path / "other.zarr"))
    record_tiny(tiny, location, n_steps=20)
    recorder = TrajectoryRecorder(location.url, slider_model(), mode="a", playback_speed=1.0)

    with pytest.raises(LayoutMismatchError, match="archive has nq=13"):
        simulate(slider_model(), 2, 5, recorder.record_as_needed)


def test_uncommitted_frames_are_masked(tiny, tmp_path):
    import zarr

    url = str(tmp_path / "partial.zarr")
    expected = record_tiny(tiny, Location(url), n_steps=100, chunk_frames=8)
    group = zarr.open_group(url, mode="r+")
    group["n_frames"][:] = [20, 24]  # as if world 0's last block had not been committed

    ds = open_archive(url)

    assert ds.sizes["time"] == 24
    np.testing.assert_array_equal(ds.qpos.values[0, :20], expected["qpos"][0, :20])
    assert np.isnan(ds.qpos.values[0, 20:]).all()
    np.testing.assert_array_equal(ds.qpos.values[1, :24], expected["qpos"][1, :24])


def test_float32_storage_keeps_float32_values(tiny, tmp_path):
    url = str(tmp_path / "f32.zarr")
    frames = []
    recorder = TrajectoryRecorder(url, tiny, dtype="float32")

    def on_step(datas):
        if recorder.record_as_needed(datas):
            frames.append(datas[0].qpos.astype(np.float32))

    with recorder:
        simulate(tiny, 1, 20, on_step)

    ds = open_archive(url)
    assert ds.qpos.dtype == np.float32
    np.testing.assert_array_equal(ds.qpos.values[0], np.stack(frames))

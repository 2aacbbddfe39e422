"""Frame times (issue 10, item 13): ``time`` is the scheduled time of each frame, exactly;
``sim_time`` is when it was recorded; ``frame`` is its index on the schedule."""

import mujoco
import numpy as np
import pytest
import zarr

from flyarchive import TrajectoryRecorder, open_archive
from flyarchive.distribute.frames import render_frames
from flyarchive.errors import SchemaError
from flyarchive.testing import reference_frames, simulate
from flyarchive.testing.markers import requires_warp


def record(model, url, n_steps, *, every=1, step_first=False, chunk_frames=8, **kwargs):
    """Record ``n_steps`` steps of 2 tiny worlds, calling the recorder every ``every`` steps.

    With ``step_first`` the first call comes after the first step, as in flygym's loop.
    """
    calls = {"n": 0}
    recorder = TrajectoryRecorder(url, model, chunk_frames=chunk_frames, **kwargs)

    def on_step(datas):
        first_call_skipped = step_first and calls["n"] == 0
        if not first_call_skipped and calls["n"] % every == 0:
            recorder.record_as_needed(datas)
        calls["n"] += 1

    with recorder:
        simulate(model, 2, n_steps, on_step)


def as_written_before_frame_coordinates(url):
    """Rewrite a local archive as flyarchive 69c2104 wrote it: ``time`` held the simulation
    time, and there was no ``sim_time``, ``frame`` or ``coordinates`` attribute."""
    group = zarr.open_group(url, mode="r+")
    group["time"][:] = group["sim_time"][:]
    for name in ("sim_time", "frame"):
        del group[name]
    for name in ("qpos", "mocap_pos", "mocap_quat"):
        group[name].attrs.pop("coordinates")


def test_a_frame_is_found_by_its_scheduled_time(tiny, tmp_path):
    url = str(tmp_path / "sel.zarr")
    record(tiny, url, 100)

    frame = open_archive(url).sel(time=0.2)

    assert int(frame.frame) == 25
    assert frame.sim_time.values == pytest.approx(0.2, abs=1e-12)


def test_scheduled_times_are_the_decimals_of_k_times_the_interval(tiny, tmp_path):
    url = str(tmp_path / "decimals.zarr")
    record(tiny, url, 100)

    ds = open_archive(url)

    assert ds.time.values.tolist() == [float(f"{0.008 * k:.3f}") for k in range(26)]
    assert ds.frame.values.tolist() == list(range(26))


def test_sim_time_keeps_when_each_frame_was_recorded(tiny, tmp_path):
    url = str(tmp_path / "step-first.zarr")
    record(tiny, url, 20, step_first=True)  # flygym's loop: the first call is at t = 0.002

    ds = open_archive(url)

    assert ds.time.values.tolist() == [0.0, 0.008, 0.016, 0.024, 0.032, 0.04]
    np.testing.assert_allclose(ds.sim_time.values, [0.002, 0.008, 0.016, 0.024, 0.032, 0.04],
                               rtol=0, atol=1e-12)


def test_frames_missed_by_the_caller_are_gaps_in_the_frame_index(tiny, tmp_path):
    url = str(tmp_path / "sparse.zarr")
    record(tiny, url, 40, every=10)  # a frame is due every 4 steps; calls at steps 0, 10, ..., 40

    ds = open_archive(url)

    assert ds.frame.values.tolist() == [0, 2, 5, 7, 10]  # the latest frame due at each call
    assert ds.time.values.tolist() == [0.0, 0.016, 0.04, 0.056, 0.08]
    np.testing.assert_allclose(ds.sim_time.values, [0.0, 0.02, 0.04, 0.06, 0.08], atol=1e-12)


def test_archives_without_frame_coordinates_open_and_replay(tiny, tmp_path):
    url = str(tmp_path / "old.zarr")
    record(tiny, url, 40)
    as_written_before_frame_coordinates(url)
    expected = reference_frames(tiny, 2, 40)

    ds = open_archive(url)
    frames = render_frames(url, tiny, "front", worlds=[1], time=(0.0, 0.02), size=(36, 52))

    assert "sim_time" not in ds.variables and "frame" not in ds.variables
    np.testing.assert_array_equal(ds.time.values, expected["time"])
    assert frames.shape == (1, 3, 36, 52, 3) and frames.values.any()


def test_appending_to_an_archive_without_frame_coordinates_continues_its_time_axis(tiny, tmp_path):
    url = str(tmp_path / "old-append.zarr")
    record(tiny, url, 40)
    as_written_before_frame_coordinates(url)
    expected = reference_frames(tiny, 2, 80)

    record(tiny, url, 80, mode="a")  # a rerun of the same simulation, continued

    ds = open_archive(url)
    np.testing.assert_array_equal(ds.time.values, expected["time"])
    np.testing.assert_array_equal(ds.qpos.values, expected["qpos"])


def test_a_frame_coordinate_of_another_dtype_is_a_schema_error(tiny, tmp_path):
    url = str(tmp_path / "bad-frame.zarr")
    record(tiny, url, 20)
    group = zarr.open_group(url, mode="r+")
    del group["frame"]
    group.create_array("frame", shape=(6,), dtype="float32", dimension_names=["time"],
                       compressors=[zarr.codecs.Crc32cCodec()])  # the pipeline flyarchive writes

    with pytest.raises(SchemaError, match="'frame' has dims \\('time',\\) and dtype float32"):
        open_archive(url)


@requires_warp
def test_warp_frames_are_found_by_their_scheduled_time(tiny, tmp_path):
    import warnings

    import mujoco_warp as mjw
    import warp as wp

    from flyarchive.recorders import WarpTrajectoryRecorder

    url = str(tmp_path / "warp.zarr")
    wp.config.quiet = True
    with wp.ScopedDevice("cpu"), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # mujoco-warp's notices about the model
        mjw_model, d = mjw.put_model(tiny), mjw.make_data(tiny, nworld=2)
        with WarpTrajectoryRecorder(url, tiny, 2, output_fps=30, chunk_frames=8) as recorder:
            for _ in range(100):  # flygym's loop: step, then record
                mjw.step(mjw_model, d)
                recorder.record_as_needed(d)

    frame = open_archive(url).sel(time=0.2)

    assert int(frame.frame) == 30  # a frame every 1/150 s
    assert float(frame.sim_time) == pytest.approx(0.2, abs=1e-6)


def test_mjdata_time_is_the_simulation_time_recorded(tiny, tmp_path):
    url = str(tmp_path / "one.zarr")
    data = mujoco.MjData(tiny)
    data.time = 0.5
    with TrajectoryRecorder(url, tiny) as recorder:
        recorder.record_as_needed(data)

    ds = open_archive(url)

    assert (int(ds.frame[0]), float(ds.time[0]), float(ds.sim_time[0])) == (62, 0.496, 0.5)

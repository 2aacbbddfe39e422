"""Times through flygym ``.npz`` files: flygym's ``time`` is the simulation time, so
``export_npz`` writes ``sim_time`` there (as ``.trajectory`` gives it), keeps the scheduled
time and frame index beside it, and ``import_npz`` gives all three back."""

import numpy as np
import pytest
import zarr

from flyarchive import TrajectoryRecorder, open_archive
from flyarchive.interop.flygym_npz import export_npz, import_npz
from flyarchive.testing import simulate
from flyarchive.testing.markers import requires_flygym_files


def record_after_first_step(model, url, n_steps=40):
    """2 tiny worlds recorded as in flygym's loop (step, then record): frame 0 is scheduled
    at t = 0 and recorded at t = 0.002, one step later."""
    calls = {"n": 0}
    recorder = TrajectoryRecorder(url, model, chunk_frames=4)

    def on_step(datas):
        if calls["n"] > 0:
            recorder.record_as_needed(datas)
        calls["n"] += 1

    with recorder:
        simulate(model, 2, n_steps, on_step)
    return recorder


@pytest.fixture
def recorded(tiny, tmp_path):
    url = str(tmp_path / "run.zarr")
    recorder = record_after_first_step(tiny, url)
    return url, recorder


@requires_flygym_files
def test_export_writes_the_simulation_time_as_flygyms_time(recorded, tmp_path):
    from flygym.recording import RecordedTrajectory

    url, recorder = recorded
    ds = open_archive(url)

    (path, _) = export_npz(url, tmp_path / "npz").files
    loaded = RecordedTrajectory.from_file(path)

    assert ds.time.values[0] == 0.0 and ds.sim_time.values[0] == pytest.approx(0.002)
    np.testing.assert_array_equal(loaded.time, ds.sim_time.values)
    np.testing.assert_array_equal(loaded.time, recorder.trajectories[0].time)


def test_export_keeps_the_scheduled_time_and_frame_beside_flygyms_fields(recorded, tmp_path):
    url, _ = recorded
    ds = open_archive(url)

    (path, _) = export_npz(url, tmp_path / "npz").files

    with np.load(path) as data:
        np.testing.assert_array_equal(data["scheduled_time"], ds.time.values)
        np.testing.assert_array_equal(data["frame"], ds.frame.values)


def test_an_exported_archive_imported_again_keeps_time_sim_time_and_frame(tiny, recorded, tmp_path):
    url, _ = recorded
    export_npz(url, tmp_path / "npz")

    import_npz(tmp_path / "npz", str(tmp_path / "back.zarr"), tiny)

    before, after = open_archive(url), open_archive(str(tmp_path / "back.zarr"))
    for name in ("time", "sim_time", "frame", "qpos"):
        np.testing.assert_array_equal(after[name].values, before[name].values, err_msg=name)


@requires_flygym_files
def test_a_plain_flygym_file_imports_its_time_as_time_and_sim_time(tiny, recorded, tmp_path):
    from flygym.recording import RecordedTrajectory

    url, recorder = recorded
    recorder.trajectories[0].save(tmp_path / "flygym" / "w0.npz")  # flygym's own fields only

    import_npz(tmp_path / "flygym", str(tmp_path / "plain.zarr"), tiny)

    ds = open_archive(str(tmp_path / "plain.zarr"))
    original = RecordedTrajectory.from_file(tmp_path / "flygym" / "w0.npz")
    np.testing.assert_array_equal(ds.time.values, original.time)
    np.testing.assert_array_equal(ds.sim_time.values, original.time)
    assert (ds.frame.values == -1).all()


def test_an_archive_without_sim_time_exports_its_time(recorded, tmp_path):
    url, _ = recorded
    sim_time = open_archive(url).sim_time.values
    group = zarr.open_group(url, mode="r+")  # as flyarchive wrote archives before sim_time
    group["time"][:] = group["sim_time"][:]
    for name in ("sim_time", "frame"):
        del group[name]
    for name in ("qpos", "mocap_pos", "mocap_quat"):
        group[name].attrs.pop("coordinates")

    (path, _) = export_npz(url, tmp_path / "npz").files

    with np.load(path) as data:
        np.testing.assert_array_equal(data["time"], sim_time)
        assert "scheduled_time" not in data.files and "frame" not in data.files

"""GPU recording (flyarchive.record.warp_recorder) with mujoco-warp on Warp's CPU device."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
import warnings

import numpy as np
import pytest

from flyarchive import open_archive
from flyarchive.clock import FrameClock, Timing
from flyarchive.errors import ArchiveExistsError, SelectionError, StorageError
from flyarchive.layout import ModelLayout, check_compatible
from flyarchive.store import ArchiveWriter
from flyarchive.testing import tiny_model
from flyarchive.testing.markers import WARP_DEVICE, requires_warp

pytestmark = [requires_warp, pytest.mark.timeout(900)]

NWORLD = 4
# Warp's CPU device in CI; FLYARCHIVE_TEST_WARP_DEVICE=cuda runs the same tests on a GPU.
DEVICE = WARP_DEVICE


@pytest.fixture(scope="module")
def sim():
    """The tiny model on the host and on Warp's CPU device (kernels compile once per module)."""
    import mujoco_warp as mjw
    import warp as wp

    wp.config.quiet = True
    model = tiny_model()
    with wp.ScopedDevice(DEVICE), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # mujoco-warp's MULTICCD notice
        mjw_model = mjw.put_model(model)
    return model, mjw_model


def new_data(sim):
    """``NWORLD`` worlds on the CPU device, each with its own velocity, control and mocap pose."""
    import mujoco_warp as mjw
    import warp as wp

    model, _ = sim
    rng = np.random.default_rng(0)
    with wp.ScopedDevice(DEVICE):
        d = mjw.make_data(model, nworld=NWORLD)
        d.qvel.assign(rng.normal(0.0, 1.0, (NWORLD, model.nv)).astype(np.float32))
        d.ctrl.assign(rng.normal(0.0, 0.3, (NWORLD, model.nu)).astype(np.float32))
    return d


def run(sim, d, recorder, n_steps, *, worlds=None, first_step=0, timing=None, on_step=None):
    """Step ``d`` and call the recorder once per step (and once before the first).

    Returns the selected worlds' state at the frame steps, copied to the host here,
    outside the recorder: ``time`` (n,), ``qpos`` (worlds, n, nq), mocap (worlds, n, 1, 3|4).
    """
    import mujoco_warp as mjw
    import warp as wp

    model, mjw_model = sim
    worlds = list(range(NWORLD)) if worlds is None else list(worlds)
    timing = timing or Timing(model.opt.timestep, 25, 0.2)
    clock = FrameClock(timing, next_frame=timing.frames_before_step(first_step))
    frames = {"time": [], "qpos": [], "mocap_pos": [], "mocap_quat": []}

    def observe(step):
        due = clock.is_due(step)
        assert recorder.record_as_needed(d) == due
        if due:
            frames["time"].append(float(d.time.numpy()[worlds[0]]))
            for key in ("qpos", "mocap_pos", "mocap_quat"):
                frames[key].append(getattr(d, key).numpy()[worlds])

    with wp.ScopedDevice(DEVICE):
        observe(first_step)
        for step in range(first_step + 1, first_step + n_steps + 1):
            phase = 0.05 * step + np.arange(NWORLD)
            mocap = np.stack([np.cos(phase), np.sin(phase), 0.3 + 0 * phase], axis=1)
            d.mocap_pos.assign(0.5 * mocap[:, None, :].astype(np.float32))
            mjw.step(mjw_model, d)
            if on_step is not None:
                on_step(step, d)
            observe(step)
    return {k: np.array(v) if k == "time" else np.stack(v, axis=1) for k, v in frames.items()}


def recorder_for(sim, url, **kwargs):
    from flyarchive.recorders import WarpTrajectoryRecorder

    return WarpTrajectoryRecorder(url, sim[0], NWORLD, **kwargs)


def memory_url():
    return f"memory://{uuid.uuid4().hex}.zarr"


def assert_archive_equals(ds, expected):
    np.testing.assert_array_equal(ds.sim_time.values, expected["time"])
    for key in ("qpos", "mocap_pos", "mocap_quat"):
        np.testing.assert_array_equal(ds[key].values, expected[key])


def test_archive_holds_the_simulated_state_bit_exact(sim):
    url = memory_url()
    d = new_data(sim)

    with recorder_for(sim, url, chunk_frames=5) as recorder:
        expected = run(sim, d, recorder, 60)

    ds = open_archive(url)
    assert ds.sizes["time"] == 16  # a frame every 4 steps, steps 0..60
    assert_archive_equals(ds, expected)
    assert list(ds.n_frames.values) == [16] * NWORLD
    assert recorder.committed_frames == recorder.n_frames == 16


def test_archive_replays_with_the_recorded_layout_in_float32(sim, tmp_path):
    url = str(tmp_path / "warp.zarr")
    d = new_data(sim)
    with recorder_for(sim, url, chunk_frames=4) as recorder:
        run(sim, d, recorder, 10)

    ds = open_archive(url)

    check_compatible(ModelLayout.from_attrs(ds.attrs["layout"]), ModelLayout.from_model(sim[0]))
    assert ds.qpos.dtype == ds.mocap_pos.dtype == np.float32
    assert ds.time.dtype == np.float64
    assert ds.attrs["source"] == "mujoco-warp"
    assert ds.attrs["timestep"] == sim[0].opt.timestep


def test_a_subset_of_worlds_is_recorded_under_their_ids(sim):
    url = memory_url()
    d = new_data(sim)

    with recorder_for(sim, url, worlds=[3, 1], chunk_frames=4) as recorder:
        expected = run(sim, d, recorder, 20, worlds=[3, 1])

    ds = open_archive(url)
    assert list(ds.world.values) == [3, 1]
    assert_archive_equals(ds, expected)


def test_frame_count_follows_the_schedule_when_the_interval_is_not_whole_steps(sim):
    url = memory_url()
    d = new_data(sim)
    timing = Timing(sim[0].opt.timestep, 30, 0.2)  # a frame every 3.33 steps

    with recorder_for(sim, url, worlds=[0], output_fps=30, chunk_frames=8) as recorder:
        run(sim, d, recorder, 100, worlds=[0], timing=timing)

    ds = open_archive(url)
    # steps 0..100 span 0.2 s: frames at k / 150 s for k = 0..30, no drift
    assert ds.sizes["time"] == 31
    expected_steps = [timing.frame_step(k) for k in range(31)]
    np.testing.assert_allclose(ds.sim_time.values, np.array(expected_steps) * 0.002, atol=1e-5)
    np.testing.assert_array_equal(ds.time.values, np.arange(31) / 150)


def test_writer_failure_is_raised_and_earlier_frames_stay_committed(sim, tmp_path, monkeypatch):
    url = str(tmp_path / "failing.zarr")
    write = ArchiveWriter.write
    calls = []

    def fail_second_write(self, block, **kwargs):
        calls.append(len(block.time))
        if len(calls) == 2:
            raise StorageError("simulated: the bucket refused the PUT")
        write(self, block, **kwargs)

    monkeypatch.setattr(ArchiveWriter, "write", fail_second_write)
    recorder = recorder_for(sim, url, chunk_frames=4)

    with pytest.raises(StorageError, match="background writer.*bucket refused.*4 committed"):
        run(sim, new_data(sim), recorder, 60)
        recorder.flush()
    with pytest.raises(StorageError):
        recorder.close()

    assert open_archive(url).sizes["time"] == 4


def test_slow_storage_delays_recording_but_drops_no_frame(sim, monkeypatch):
    url = memory_url()
    write = ArchiveWriter.write
    busy = threading.Semaphore(1)

    def slow_write(self, block, **kwargs):
        assert busy.acquire(blocking=False), "two writes at once"
        time.sleep(0.2)
        write(self, block, **kwargs)
        busy.release()

    monkeypatch.setattr(ArchiveWriter, "write", slow_write)

    with recorder_for(sim, url, chunk_frames=2) as recorder:
        expected = run(sim, new_data(sim), recorder, 60)

    ds = open_archive(url)
    assert ds.sizes["time"] == 16
    assert_archive_equals(ds, expected)


def test_resume_from_a_checkpoint_continues_after_the_committed_frames(sim, tmp_path):
    url = str(tmp_path / "resume.zarr")
    d = new_data(sim)
    with recorder_for(sim, url, chunk_frames=4) as first:
        before = run(sim, d, first, 30)  # frames at steps 0..28

    with recorder_for(sim, url, chunk_frames=4, mode="a", start_step=30) as second:
        after = run(sim, d, second, 30, first_step=30)  # the same Data, steps 30..60

    ds = open_archive(url)
    expected = {k: np.concatenate([before[k], after[k]], axis=0 if k == "time" else 1)
                for k in before}
    assert ds.sizes["time"] == 16
    assert_archive_equals(ds, expected)


def test_resume_refuses_a_gap_in_the_frame_schedule(sim, tmp_path):
    url = str(tmp_path / "gap.zarr")
    d = new_data(sim)
    with recorder_for(sim, url, chunk_frames=4) as first:
        run(sim, d, first, 8)  # frames 0..2; frame 3 is due at step 12

    recorder = recorder_for(sim, url, mode="a", start_step=20)
    with pytest.raises(ValueError, match="next frame is due at step 12.*at step 20"):
        recorder.record_as_needed(d)


def test_a_diverged_world_keeps_its_frames_before_the_nan(sim):
    url = memory_url()

    def poison_world_2(step, d):
        if step == 21:
            qpos = d.qpos.numpy()
            qpos[2, 7] = np.nan
            d.qpos.assign(qpos)

    recorder = recorder_for(sim, url, chunk_frames=4)
    with pytest.warns(RuntimeWarning, match=r"world\(s\) \[2\].*frame\(s\) \[6\]"):
        with recorder:
            expected = run(sim, new_data(sim), recorder, 40, on_step=poison_world_2)

    ds = open_archive(url)
    assert list(ds.n_frames.values) == [11, 11, 6, 11]
    assert recorder.diverged_worlds == {2: 6}
    np.testing.assert_array_equal(ds.qpos.values[2, :6], expected["qpos"][2, :6])
    assert np.isnan(ds.qpos.values[2, 6:]).all()
    np.testing.assert_array_equal(ds.qpos.values[3], expected["qpos"][3])


def test_world_ids_outside_the_simulation_are_refused(sim):
    with pytest.raises(SelectionError, match=r"\[0, 4\).*outside: \[4\]"):
        recorder_for(sim, memory_url(), worlds=[0, 4])


def test_existing_archive_is_refused_at_construction(sim, tmp_path):
    url = str(tmp_path / "taken.zarr")
    with recorder_for(sim, url) as recorder:
        run(sim, new_data(sim), recorder, 1)

    with pytest.raises(ArchiveExistsError, match="mode='a'"):
        recorder_for(sim, url)


def test_import_flyarchive_does_not_import_warp():
    code = "import sys, flyarchive; flyarchive.TrajectoryRecorder; print('warp' in sys.modules)"

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)

    assert out.stdout.strip() == "False"


def test_the_recorded_model_is_kept_beside_the_archive(sim):
    from flyarchive.models import model_bytes
    from flyarchive.store import open_for_reading
    from flyarchive.models.kept import read_model

    url = memory_url()
    with recorder_for(sim, url, chunk_frames=4) as recorder:
        run(sim, new_data(sim), recorder, 8)

    blob, _ = read_model(open_for_reading(url, attributes_only=True), url)

    assert blob == model_bytes(sim[0])


def test_the_model_source_is_kept_as_the_portable_form(sim, tmp_path):
    from flyarchive.models import PORTABLE_MODEL_ATTR, compile_spec_zip, model_identity
    from flyarchive.store import open_for_reading
    from flyarchive.models.kept import read_portable
    from flyarchive.testing import TINY_XML

    (tmp_path / "tiny.xml").write_text(TINY_XML)
    url = memory_url()
    with recorder_for(sim, url, chunk_frames=4, model_source=tmp_path / "tiny.xml") as recorder:
        run(sim, new_data(sim), recorder, 8)

    blob, entry = read_portable(open_for_reading(url, attributes_only=True), url)

    assert model_identity(open_archive(url).attrs) == entry["sha256"]
    assert PORTABLE_MODEL_ATTR in open_archive(url).attrs
    assert compile_spec_zip(blob).nq == sim[0].nq


def test_store_model_false_keeps_only_the_layout(sim):
    url = memory_url()
    with recorder_for(sim, url, chunk_frames=4, store_model=False) as recorder:
        run(sim, new_data(sim), recorder, 8)

    assert "model" not in open_archive(url).attrs


def test_a_recorder_not_called_at_every_step_refuses_the_frame_taken_off_schedule(sim):
    """The recorder counts steps (the device's clock is not read per step); called after
    every second step, frame 1 was stored with its scheduled time and twice its
    simulation time. It is refused; frame 0 stays committed."""
    import mujoco_warp as mjw
    import warp as wp

    from flyarchive.errors import RecordingError

    model, mjw_model = sim
    url = memory_url()
    d = new_data(sim)
    recorder = recorder_for(sim, url, output_fps=25, playback_speed=1.0, chunk_frames=1)

    with wp.ScopedDevice(DEVICE), pytest.raises(RecordingError, match=r"frame 1, due at "
                                                r"t=0.04 s of the simulation, was taken at "
                                                r"t=0.0[78]\d* s.*once after every"):
        recorder.record_as_needed(d)
        for step in range(1, 81):
            mjw.step(mjw_model, d)
            if step % 2 == 0:
                recorder.record_as_needed(d)
    with pytest.raises(RecordingError):  # closing says it again; nothing is left open
        recorder.close()

    ds = open_archive(url)
    assert ds.n_frames.values.tolist() == [1] * NWORLD

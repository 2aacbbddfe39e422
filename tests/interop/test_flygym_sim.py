"""flyarchive's recorders inside real flygym 2.1.1 loops (issue 10, item 12).

flygym's ``Simulation`` / ``GPUSimulation`` call ``recorder.reset()`` and
``recorder.record_as_needed(state)``; users read ``.trajectory`` (CPU) or
``.trajectories`` and ``.world_ids`` (GPU). The GPU tests run ``GPUSimulation`` on
Warp's CPU device.
"""

import gc
import warnings

import numpy as np
import pytest

import flyarchive
from flyarchive import open_archive
from flyarchive.errors import RecordingError
from flyarchive.testing.markers import requires_flygym, requires_warp

pytestmark = [requires_flygym, pytest.mark.timeout(600)]


def nmf_world():
    """NeuroMechFly on flat ground, composed with flygym 2.1.1 as flyarchive.interop.nmf does."""
    from flygym.anatomy import ActuatedDOFPreset, AxisOrder, JointPreset, Skeleton
    from flygym.compose import ActuatorType, FlatGroundWorld, KinematicPosePreset, NeuroMechFly
    from flygym.utils.math import Rotation3D

    fly = NeuroMechFly(name="nmf")
    skeleton = Skeleton(axis_order=AxisOrder.YAW_PITCH_ROLL, joint_preset=JointPreset.LEGS_ONLY)
    fly.add_joints(skeleton, neutral_pose=KinematicPosePreset.NEUTRAL)
    dofs = fly.skeleton.get_actuated_dofs_from_preset(ActuatedDOFPreset.LEGS_ACTIVE_ONLY)
    fly.add_actuators(dofs, actuator_type=ActuatorType.POSITION, kp=50.0,
                      neutral_input=KinematicPosePreset.NEUTRAL)
    fly.add_tracking_camera()
    world = FlatGroundWorld()
    world.add_fly(fly, (0.0, 0.0, 0.8), Rotation3D("quat", (1, 0, 0, 0)))
    return world


def run_cpu(sim, n_steps):
    """flygym's loop: step, then record; returns the (time, qpos) of the frames recorded."""
    frames = []
    for _ in range(n_steps):
        sim.step()
        if sim.record_as_needed():
            frames.append((sim.time, sim.mj_data.qpos.copy()))
    return frames


@pytest.fixture(scope="module")
def cpu_sim():
    from flygym import Simulation

    return Simulation(nmf_world())


def test_the_recorder_drops_into_a_flygym_simulation(cpu_sim, tmp_path):
    from flygym.recording import RecordedTrajectory

    sim = cpu_sim
    sim.recorder = flyarchive.TrajectoryRecorder(str(tmp_path / "sim.zarr"), sim.mj_model,
                                                 chunk_frames=3)
    sim.reset()

    frames = run_cpu(sim, 400)  # steps 1..400 of 0.1 ms: frames 0..5 at steps 1, 80, ..., 400

    trajectory = sim.recorder.trajectory
    assert isinstance(trajectory, RecordedTrajectory)
    assert (trajectory.output_fps, trajectory.playback_speed, trajectory.world_id) == (25, 0.2, 0)
    np.testing.assert_array_equal(trajectory.time, [t for t, _ in frames])
    np.testing.assert_array_equal(trajectory.qpos, np.stack([q for _, q in frames]))
    assert len(frames) == 6


def test_flygym_renders_the_trajectory_read_from_the_archive(cpu_sim, tmp_path):
    from flygym.recording import render_trajectories

    sim = cpu_sim
    sim.recorder = flyarchive.TrajectoryRecorder(str(tmp_path / "render.zarr"), sim.mj_model)
    sim.reset()
    run_cpu(sim, 100)

    frames = render_trajectories(sim.mj_model, sim.recorder.trajectory, "nmf/trackcam",
                                 camera_res=(48, 64))

    assert frames[0]["nmf/trackcam"].shape == (2, 48, 64, 3)
    assert frames[0]["nmf/trackcam"].any()


def test_reset_after_recording_ends_the_recording_and_keeps_its_frames(cpu_sim, tmp_path):
    sim = cpu_sim
    url = str(tmp_path / "episode.zarr")
    sim.recorder = flyarchive.TrajectoryRecorder(url, sim.mj_model)
    sim.reset()
    run_cpu(sim, 200)

    sim.reset()

    with pytest.raises(RecordingError, match=r"reset after 3 frames.*sim.recorder = "):
        run_cpu(sim, 1)
    assert open_archive(url).n_frames.values.tolist() == [3]
    assert sim.recorder.trajectory.n_frames == 3


def test_a_simulation_dropped_without_closing_its_recorder_keeps_the_frames(tmp_path):
    from flygym import Simulation

    url = str(tmp_path / "dropped.zarr")
    sim = Simulation(nmf_world())
    sim.recorder = flyarchive.TrajectoryRecorder(url, sim.mj_model)
    sim.reset()
    frames = run_cpu(sim, 200)

    with pytest.warns(ResourceWarning, match="was not closed"):
        del sim
        gc.collect()

    np.testing.assert_array_equal(open_archive(url).qpos.values[0], np.stack([q for _, q in frames]))


def test_set_trajectory_recorder_attaches_a_flyarchive_recorder(cpu_sim, tmp_path):
    from flyarchive.interop.flygym_sim import set_trajectory_recorder

    recorder = set_trajectory_recorder(cpu_sim, str(tmp_path / "set.zarr"), output_fps=50,
                                       playback_speed=0.1)

    assert cpu_sim.recorder is recorder
    assert isinstance(recorder, flyarchive.TrajectoryRecorder)
    assert (recorder.timing.output_fps, recorder.timing.playback_speed) == (50, 0.1)


def test_set_trajectory_recorder_keeps_the_worlds_spec_which_another_release_replays(
        cpu_sim, tmp_path):
    import json
    from pathlib import Path

    from flyarchive.interop.flygym_sim import set_trajectory_recorder
    from flyarchive.models import PORTABLE_MODEL_ATTR, model_identity
    from flyarchive.testing.spec_zips import as_another_release

    url = str(tmp_path / "portable.zarr")
    recorder = set_trajectory_recorder(cpu_sim, url, chunk_frames=3)
    cpu_sim.reset()
    run_cpu(cpu_sim, 240)
    recorder.close()
    expected = flyarchive.positions(url, bodies="*").values
    attrs = json.loads((Path(url) / "zarr.json").read_text())["attributes"]
    as_another_release(url)

    actual = flyarchive.positions(url, bodies="*").values  # the spec, compiled here again

    assert model_identity(attrs) == attrs[PORTABLE_MODEL_ATTR]["sha256"]
    assert attrs[PORTABLE_MODEL_ATTR]["exact"] is False  # MuJoCo's XML of the world's spec
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-9)  # mm


# ----------------------------------------------------------------------------- GPU
#: Frames per second of the GPU recordings: at flygym's 0.1 ms steps and the recorders'
#: 0.2x playback, a frame every 20 steps (Warp's CPU device steps NeuroMechFly slowly).
GPU_FPS = 100
@pytest.fixture(scope="module")
def gpu_sim():
    import warp as wp
    from flygym.warp import GPUSimulation

    wp.config.quiet = True
    with wp.ScopedDevice("cpu"), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # mujoco-warp's notices about the model
        yield GPUSimulation(nmf_world(), n_worlds=3)


def run_gpu(sim, n_steps, worlds):
    """flygym's GPU loop; returns (time, qpos of ``worlds``) of the frames recorded."""
    import warp as wp

    frames = []
    with wp.ScopedDevice("cpu"):
        for _ in range(n_steps):
            sim.step()
            if sim.record_as_needed():
                frames.append((float(sim.mjw_data.time.numpy()[0]),
                               sim.mjw_data.qpos.numpy()[worlds]))
    return frames


@requires_warp
def test_the_warp_recorder_drops_into_a_flygym_gpu_simulation(gpu_sim, tmp_path):
    from flyarchive.recorders import WarpTrajectoryRecorder

    sim = gpu_sim
    sim.recorder = WarpTrajectoryRecorder(str(tmp_path / "gpu.zarr"), sim.mj_model, sim.n_worlds,
                                          worlds=[2, 0], chunk_frames=2, output_fps=GPU_FPS)
    sim.reset()

    frames = run_gpu(sim, 45, [2, 0])  # steps 1..45: frames 0, 1, 2 (one every 20 steps)

    trajectories = sim.recorder.trajectories
    assert [t.world_id for t in trajectories] == list(sim.recorder.world_ids) == [2, 0]
    assert len(frames) == 3
    for i, trajectory in enumerate(trajectories):
        np.testing.assert_array_equal(trajectory.time, np.float32([t for t, _ in frames]))
        np.testing.assert_array_equal(trajectory.qpos, np.stack([q[i] for _, q in frames]))


@requires_warp
def test_gpu_reset_after_recording_ends_the_recording(gpu_sim, tmp_path):
    from flyarchive.recorders import WarpTrajectoryRecorder

    sim = gpu_sim
    url = str(tmp_path / "gpu-episode.zarr")
    sim.recorder = WarpTrajectoryRecorder(url, sim.mj_model, sim.n_worlds, output_fps=GPU_FPS)
    sim.reset()
    run_gpu(sim, 25, [0])

    sim.reset()

    with pytest.raises(RecordingError, match="reset after 2 frames"):
        run_gpu(sim, 1, [0])
    assert open_archive(url).n_frames.values.tolist() == [2, 2, 2]

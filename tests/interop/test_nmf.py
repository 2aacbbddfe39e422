"""NeuroMechFly world and walking controller (flyarchive.interop.nmf)."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from flyarchive.testing.markers import requires_flygym

pytestmark = requires_flygym


@pytest.fixture(scope="module")
def world():
    from flyarchive.interop import nmf

    return nmf.build_world()


def test_world_has_neuromechfly_layout(world):
    expected = (73, 0, 1e-4)

    actual = (world.model.nq, world.model.nmocap, world.model.opt.timestep)

    assert actual == expected


def test_world_has_tracking_camera(world):
    cameras = [world.model.camera(i).name for i in range(world.model.ncam)]

    assert world.cameras == ("nmf/trackcam",)
    assert "nmf/trackcam" in cameras


def test_unknown_camera_preset_names_the_presets():
    from flyarchive.interop import nmf

    with pytest.raises(ValueError, match="'tracking'"):
        nmf.build_world(camera="overhead")


def test_walk_pattern_loops_without_a_jump(world):
    p = world.pattern
    before_seam = p.at((p.loop_end - 1e-3) / p.fps)
    after_seam = p.at(p.loop_start / p.fps)

    assert np.abs(before_seam - after_seam).max() < 0.01


def test_short_walk_moves_every_fly_forward_with_finite_state(world):
    from flyarchive.interop import nmf

    start_x = []
    calls = []
    datas = nmf.simulate_walk(
        world, 2, 0.3, lambda ds: start_x.append(ds[0].qpos[0]) or calls.append(1), seed=3
    )

    for data in datas:
        assert np.isfinite(data.qpos).all()
        assert data.qpos[0] > start_x[0] + 0.5  # mm along +x
    assert len(calls) == 3000 + 1
    assert not np.array_equal(datas[0].qpos, datas[1].qpos)


def test_simulate_walk_is_deterministic(world):
    from flyarchive.interop import nmf

    first = nmf.simulate_walk(world, 1, 0.01, lambda ds: None, seed=5)[0].qpos.copy()
    second = nmf.simulate_walk(world, 1, 0.01, lambda ds: None, seed=5)[0].qpos.copy()

    np.testing.assert_array_equal(first, second)


def test_walk_qpos_samples_frames_at_the_video_cadence(world):
    from flyarchive.interop import nmf

    qpos = nmf.walk_qpos(3, output_fps=25, playback_speed=0.2, dtype=np.float32, world=world)

    assert qpos.shape == (3, 73)
    assert qpos.dtype == np.float32
    data = mujoco.MjData(world.model)
    mujoco.mj_resetDataKeyframe(world.model, data, world.neutral_key)
    np.testing.assert_array_equal(qpos[0], data.qpos.astype(np.float32))


def test_replay_of_neuromechfly_equals_live_rendering_with_its_own_framebuffer(world):
    # Replay renders with a framebuffer fitted to the frames, not the model's 2048 x 2048.
    from flyarchive.interop import nmf
    from flyarchive.replay.kinematics import update_render_geometry
    from flyarchive.replay.opengl_frames import OpenGLRenderer, headless_renderer

    size, camera = (96, 128), world.cameras[0]
    qpos = nmf.walk_qpos(3, world=world)
    assert world.model.vis.global_.offwidth == 2048
    live = headless_renderer(world.model, size)
    data = mujoco.MjData(world.model)
    expected = []
    for q in qpos:
        data.qpos[:] = q
        update_render_geometry(world.model, data)
        live.update_scene(data, camera)
        expected.append(live.render())
    live.close()

    with OpenGLRenderer(world.model, camera, size) as renderer:
        actual = renderer.render(qpos)[:, 0]

    assert np.array_equal(actual, np.array(expected))
    assert not np.array_equal(actual[0], actual[-1])

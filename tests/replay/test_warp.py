"""Batch replay with mujoco-warp's renderer, on Warp's CPU device (flyarchive.replay.warp)."""

from __future__ import annotations

import copy
import math
import subprocess
import sys

import mujoco
import numpy as np
import pytest

from flyarchive.errors import (
    CameraNotFoundError,
    FrameSizeError,
    LayoutMismatchError,
    NonFiniteStateError,
    SelectionError,
)
from flyarchive.layout import ModelLayout
from flyarchive.testing import slider_model, tiny_model
from flyarchive.testing.markers import requires_cuda, requires_warp

pytestmark = [requires_warp, pytest.mark.timeout(900)]

SIZE = (48, 64)  # (height, width)
BATCH = 4

MESH_XML = """
<mujoco>
  <asset>
    <texture name="checker" type="2d" builtin="checker" rgb1="1 0 0" rgb2="0 0 1"
             width="8" height="8"/>
    <material name="skin" texture="checker" rgba="1 1 1 1"/>
    <material name="ground" texture="checker"/>
    <mesh name="tet" vertex="0 0 0  1 0 0  0 1 0  0 0 1"/>
  </asset>
  <option noslip_iterations="5"/>
  <worldbody>
    <geom type="plane" size="1 1 0.1" material="ground"/>
    <body pos="0 0 0.5">
      <freejoint/>
      <geom type="mesh" mesh="tet" material="skin"/>
    </body>
  </worldbody>
</mujoco>
"""


@pytest.fixture(scope="module")
def tiny():
    from flyarchive.replay.warp import WarpBatchRenderer

    model = tiny_model()
    renderer = WarpBatchRenderer(model, ["front", "top"], SIZE, batch_worlds=BATCH, device="cpu")
    return model, renderer


@pytest.fixture(scope="module")
def slider():
    from flyarchive.replay.warp import WarpBatchRenderer

    model = slider_model()
    return model, WarpBatchRenderer(model, "front", SIZE, batch_worlds=BATCH, device="cpu")


def random_states(model: mujoco.MjModel, n: int, seed: int) -> tuple[np.ndarray, ...]:
    """Random qpos (unit quaternions) and mocap poses, float64, host."""
    rng = np.random.default_rng(seed)
    qpos = np.tile(model.qpos0, (n, 1))
    qpos[:, :3] += rng.normal(0.0, 0.1, (n, 3))
    qpos[:, 3:7] = _unit(rng.normal(size=(n, 4)) + [4.0, 0, 0, 0])
    qpos[:, 7] = rng.uniform(-1.0, 1.0, n)  # shoulder
    qpos[:, 8:12] = _unit(rng.normal(size=(n, 4)) + [2.0, 0, 0, 0])  # wrist
    qpos[:, 12] = rng.uniform(-0.1, 0.1, n)  # slider
    mocap_pos = np.array([0.5, 0.5, 0.3]) + rng.normal(0.0, 0.2, (n, 1, 3))
    mocap_quat = _unit(rng.normal(size=(n, 1, 4)))
    return qpos, mocap_pos, mocap_quat


def _unit(q: np.ndarray) -> np.ndarray:
    return q / np.linalg.norm(q, axis=-1, keepdims=True)


def opengl_frames(model, qpos, mocap_pos, mocap_quat, camera):
    """Frames of mujoco.Renderer (EGL) for the same states, (n, H, W, 3) uint8.

    Multisampling is off, so that OpenGL, like the ray tracer, samples pixel centres:
    with the default 4 samples, antialiased edges against the black background cost
    about 2% agreement at 48x64 (0.2% at 120x160).
    """
    model = copy.deepcopy(model)
    model.vis.quality.offsamples = 0
    renderer = mujoco.Renderer(model, *SIZE)
    data = mujoco.MjData(model)
    frames = []
    try:
        for i in range(len(qpos)):
            data.qpos[:] = qpos[i]
            if model.nmocap:
                data.mocap_pos[:] = mocap_pos[i]
                data.mocap_quat[:] = mocap_quat[i]
            mujoco.mj_kinematics(model, data)
            mujoco.mj_comPos(model, data)
            mujoco.mj_camlight(model, data)
            renderer.update_scene(data, camera)
            frames.append(renderer.render().copy())
    finally:
        renderer.close()
    return np.stack(frames)


def silhouette(frames: np.ndarray, background: np.ndarray) -> np.ndarray:
    """True where a pixel differs from the background colour."""
    return np.any(frames != background, axis=-1)


# -- model preparation ------------------------------------------------------------


def test_prepare_leaves_the_callers_model_unchanged():
    from flyarchive.replay.warp_model import prepare_for_batch_rendering

    model = mujoco.MjModel.from_xml_string(MESH_XML)

    prepared = prepare_for_batch_rendering(model)

    assert prepared is not model
    assert (model.opt.noslip_iterations, prepared.opt.noslip_iterations) == (5, 0)
    assert model.mat_texid[0, mujoco.mjtTextureRole.mjTEXROLE_RGB] >= 0


def test_prepare_keeps_the_qpos_and_mocap_layout():
    from flyarchive.replay.warp_model import prepare_for_batch_rendering

    model = tiny_model()

    prepared = prepare_for_batch_rendering(model)

    assert ModelLayout.from_model(prepared) == ModelLayout.from_model(model)
    np.testing.assert_array_equal(prepared.qpos0, model.qpos0)


def test_prepared_noslip_model_is_accepted_by_mujoco_warp():
    import mujoco_warp as mjw

    from flyarchive.replay.warp_model import prepare_for_batch_rendering

    model = mujoco.MjModel.from_xml_string(MESH_XML)
    with pytest.raises(NotImplementedError, match="noslip"):
        mjw.put_model(model)

    mjw.put_model(prepare_for_batch_rendering(model))


def test_prepare_flattens_textures_of_mesh_materials_only():
    from flyarchive.replay.warp_model import prepare_for_batch_rendering

    model = mujoco.MjModel.from_xml_string(MESH_XML)
    rgb = mujoco.mjtTextureRole.mjTEXROLE_RGB
    skin = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_MATERIAL, "skin")
    ground = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_MATERIAL, "ground")

    prepared = prepare_for_batch_rendering(model)

    assert prepared.mat_texid[skin, rgb] == -1
    np.testing.assert_allclose(prepared.mat_rgba[skin, :3], [0.5, 0.0, 0.5], atol=0.01)
    assert prepared.mat_texid[ground, rgb] == model.mat_texid[ground, rgb]


# -- kinematics and rendering -----------------------------------------------------


def test_device_kinematics_match_mj_kinematics(tiny):
    model, renderer = tiny
    qpos, mocap_pos, mocap_quat = random_states(model, BATCH, seed=1)
    data = mujoco.MjData(model)
    expected = []
    for i in range(BATCH):
        data.qpos[:], data.mocap_pos[:], data.mocap_quat[:] = qpos[i], mocap_pos[i], mocap_quat[i]
        mujoco.mj_kinematics(model, data)
        expected.append(data.geom_xpos.copy())

    actual, _ = renderer.geom_poses(qpos, mocap_pos, mocap_quat)

    np.testing.assert_allclose(actual, np.stack(expected), atol=1e-5)


def test_render_batch_returns_uint8_frames_per_state_and_camera(tiny):
    model, renderer = tiny
    qpos, _, _ = random_states(model, 3, seed=2)

    frames = renderer.render_batch(qpos)

    assert (frames.shape, frames.dtype) == ((3, 2, *SIZE, 3), np.dtype(np.uint8))
    assert frames.any()


def test_yuv420p_frames_are_the_bt601_conversion_of_the_rgb_frames(tiny):
    from flyarchive.replay.warp import WarpBatchRenderer
    from flyarchive.testing import rgb_to_i420

    model, rgb_renderer = tiny
    qpos, _, _ = random_states(model, 3, seed=5)
    yuv_renderer = WarpBatchRenderer(model, ["front", "top"], SIZE, batch_worlds=BATCH,
                                     device="cpu", pixel_format="yuv420p")

    rgb = rgb_renderer.render_batch(qpos)
    yuv = yuv_renderer.render_batch(qpos)

    assert (yuv.shape, yuv.dtype) == ((3, 2, SIZE[0] * 3 // 2, SIZE[1]), np.dtype(np.uint8))
    np.testing.assert_array_equal(yuv, rgb_to_i420(rgb))
    assert len(np.unique(yuv[:, :, SIZE[0]:])) > 2  # chroma varies: coloured bodies


def test_yuv420p_needs_even_sizes(tiny):
    from flyarchive.replay.warp import WarpBatchRenderer

    model, _ = tiny
    with pytest.raises(FrameSizeError, match="even"):
        WarpBatchRenderer(model, "front", (47, 64), batch_worlds=1, device="cpu",
                          pixel_format="yuv420p")
    with pytest.raises(ValueError, match="pixel_format"):
        WarpBatchRenderer(model, "front", SIZE, batch_worlds=1, device="cpu", pixel_format="rgb")


@pytest.mark.parametrize("which", ["tiny", "slider"])
def test_silhouettes_match_the_opengl_renderer(which, tiny, slider, capsys):
    model, renderer = tiny if which == "tiny" else slider
    if which == "tiny":
        qpos, mocap_pos, mocap_quat = random_states(model, BATCH, seed=3)
    else:
        qpos = np.linspace(-0.8, 0.8, BATCH)[:, None]
        mocap_pos = mocap_quat = None
    background = np.zeros(3, np.uint8)  # both renderers clear to black here
    expected = silhouette(opengl_frames(model, qpos, mocap_pos, mocap_quat, "front"), background)

    frames = renderer.render_batch(qpos, mocap_pos, mocap_quat)
    actual = silhouette(frames[:, 0], background)

    agreement = float(np.mean(actual == expected))
    with capsys.disabled():
        print(f"\n{which}: silhouette agreement with mujoco.Renderer = {agreement:.4%}")
    assert agreement >= 0.99
    assert expected.any() and not expected.all()  # a silhouette, not a blank frame


def test_slider_block_column_follows_qpos(slider):
    _, renderer = slider
    xs = np.array([-0.6, -0.2, 0.2, 0.6])
    height, width = SIZE
    focal = (height / 2) / math.tan(math.radians(60) / 2)  # fovy=60, camera 3 m away
    expected = width / 2 + focal * xs / 3.0

    frames = renderer.render_batch(xs[:, None])
    bright = frames[:, 0].min(axis=-1) > 128
    columns = np.arange(width)
    actual = np.array([columns[np.any(b, axis=0)].mean() + 0.5 for b in bright])

    np.testing.assert_allclose(actual, expected, atol=1.0)


def test_packed_batch_equals_one_state_per_batch(tiny):
    model, renderer = tiny
    qpos, mocap_pos, mocap_quat = random_states(model, 3, seed=4)
    one_by_one = [
        renderer.render_batch(qpos[i : i + 1], mocap_pos[i : i + 1], mocap_quat[i : i + 1])
        for i in range(3)
    ]
    expected = np.concatenate(one_by_one)

    actual = renderer.render_batch(qpos, mocap_pos, mocap_quat)

    np.testing.assert_array_equal(actual, expected)


def test_float32_and_float64_qpos_render_alike(tiny):
    model, renderer = tiny
    qpos, _, _ = random_states(model, 2, seed=5)

    expected = renderer.render_batch(qpos)
    actual = renderer.render_batch(qpos.astype(np.float32))

    np.testing.assert_array_equal(actual, expected)


def test_mocap_pose_moves_the_mocap_body(tiny):
    model, renderer = tiny
    qpos, mocap_pos, _ = random_states(model, 1, seed=6)
    body = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "target")
    geom = int(np.nonzero(model.geom_bodyid == body)[0][0])

    xpos, _ = renderer.geom_poses(qpos, mocap_pos)

    np.testing.assert_allclose(xpos[0, geom], mocap_pos[0, 0], atol=1e-6)


def test_missing_mocap_poses_default_to_the_models(tiny):
    model, renderer = tiny
    qpos, _, _ = random_states(model, 2, seed=7)
    data = mujoco.MjData(model)
    expected = renderer.render_batch(
        qpos, np.repeat(data.mocap_pos[None], 2, 0), np.repeat(data.mocap_quat[None], 2, 0)
    )

    actual = renderer.render_batch(qpos)

    np.testing.assert_array_equal(actual, expected)


# -- errors -----------------------------------------------------------------------


def test_unknown_camera_error_lists_the_cameras():
    from flyarchive.replay.warp import WarpBatchRenderer

    with pytest.raises(CameraNotFoundError) as info:
        WarpBatchRenderer(tiny_model(), ["front", "side"], SIZE, batch_worlds=1, device="cpu")

    message = str(info.value)
    assert "'side'" in message and "'front'" in message and "'top'" in message


def test_batch_larger_than_batch_worlds_is_refused(tiny):
    model, renderer = tiny
    qpos = np.tile(model.qpos0, (BATCH + 1, 1))

    with pytest.raises(SelectionError, match=f"1 to {BATCH}"):
        renderer.render_batch(qpos)


def test_qpos_of_another_model_is_refused(tiny):
    _, renderer = tiny

    with pytest.raises(LayoutMismatchError, match="nq=13"):
        renderer.render_batch(np.zeros((1, 12)))


def test_non_finite_state_is_refused(tiny):
    model, renderer = tiny
    qpos = np.tile(model.qpos0, (2, 1))
    qpos[1, 7] = np.nan

    with pytest.raises(NonFiniteStateError, match="State 1"):
        renderer.render_batch(qpos)


def test_importing_flyarchive_and_warp_model_does_not_import_warp():
    code = (
        "import sys, flyarchive, flyarchive.replay.warp_model; "
        "assert 'warp' not in sys.modules, 'warp imported'"
    )

    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)

    assert result.returncode == 0, result.stderr



def test_host_buffer_ring_keeps_each_batch_until_it_is_reused(slider):
    from flyarchive.replay.warp import WarpBatchRenderer

    model, copying = slider
    qpos = np.linspace(-0.5, 0.5, 3 * BATCH).reshape(3, BATCH, 1)
    expected = [copying.render_batch(q) for q in qpos]
    ring = WarpBatchRenderer(model, "front", SIZE, batch_worlds=BATCH, device="cpu", host_buffers=3)

    actual = [ring.render_batch(q) for q in qpos]

    for a, e in zip(actual, expected):
        np.testing.assert_array_equal(a, e)
    assert not np.array_equal(actual[0], actual[2])


def test_submitted_batches_land_in_the_buffers_named(slider):
    from flyarchive.replay.warp import WarpBatchRenderer

    model, copying = slider
    qpos = np.linspace(-0.5, 0.5, 2 * BATCH).reshape(2, BATCH, 1)
    expected = [copying.render_batch(q) for q in qpos]
    renderer = WarpBatchRenderer(model, "front", SIZE, batch_worlds=BATCH, device="cpu",
                                 host_buffers=2)

    first = renderer.submit(qpos[0], buffer=1)
    second = renderer.submit(qpos[1], buffer=0)

    np.testing.assert_array_equal(second.wait(), expected[1])
    np.testing.assert_array_equal(first.wait(), expected[0])
    assert first.n == second.n == BATCH
    with pytest.raises(ValueError, match="not one of the 2 host buffers"):
        renderer.submit(qpos[0], buffer=2)


@requires_cuda
def test_cuda_graph_batches_equal_kernel_by_kernel_batches(monkeypatch):
    from flyarchive.replay.warp import WarpBatchRenderer

    model = tiny_model()
    qpos, mocap_pos, mocap_quat = random_states(model, 4 * BATCH + 1, seed=9)
    graph = WarpBatchRenderer(model, ["front", "top"], SIZE, batch_worlds=BATCH, device="cuda",
                              pixel_format="yuv420p")
    monkeypatch.setenv("FLYARCHIVE_CUDA_GRAPH", "0")
    eager = WarpBatchRenderer(model, ["front", "top"], SIZE, batch_worlds=BATCH, device="cuda",
                              pixel_format="yuv420p")

    starts = range(0, 4 * BATCH + 1, BATCH)  # 4 full batches, then a partial one
    expected = [eager.render_batch(qpos[k:k + BATCH], mocap_pos[k:k + BATCH],
                                   mocap_quat[k:k + BATCH]) for k in starts]
    monkeypatch.delenv("FLYARCHIVE_CUDA_GRAPH")
    pipelined = WarpBatchRenderer(model, ["front", "top"], SIZE, batch_worlds=BATCH,
                                  device="cuda", pixel_format="yuv420p", host_buffers=2)

    for k, want in zip(starts, expected):  # kernel by kernel vs graphs, one batch at a time
        rows = slice(k, k + BATCH)
        np.testing.assert_array_equal(
            graph.render_batch(qpos[rows], mocap_pos[rows], mocap_quat[rows]), want)
    pending = None  # graphs again, batch k + 1 queued before batch k is waited for
    for i, k in enumerate(starts):
        rows = slice(k, k + BATCH)
        submitted = pipelined.submit(qpos[rows], mocap_pos[rows], mocap_quat[rows], buffer=i % 2)
        if pending is not None:
            np.testing.assert_array_equal(pending.wait(), expected[i - 1])
        pending = submitted
    np.testing.assert_array_equal(pending.wait(), expected[-1])
    assert graph.graph_captured and pipelined.graph_captured and not eager.graph_captured

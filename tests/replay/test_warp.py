"""Batch replay with mujoco-warp's renderer (flyarchive.replay.warp_frames), on Warp's CPU device.

``FLYARCHIVE_TEST_WARP_DEVICE=cuda`` runs these tests on a GPU. The behaviours every
renderer shares are the conformance suite (:class:`flyarchive.testing.replay_suite.ReplayTests`),
which :class:`TestWarpReplay` runs with the ray tracer's tolerance; the tests below are
the Warp renderer's own (model preparation, device kinematics, I420 frames, host
buffers, batches, CUDA graphs).
"""

from __future__ import annotations

import subprocess
import sys

import mujoco
import numpy as np
import pytest

from flyarchive.errors import FrameSizeError, NonFiniteStateError, SelectionError
from flyarchive.layout import ModelLayout
from flyarchive.testing import slider_model, tiny_model
from flyarchive.testing.markers import WARP_BACKEND, WARP_DEVICE, requires_cuda, requires_warp
from flyarchive.testing.replay_suite import ReplayTests

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


class TestWarpReplay(ReplayTests):
    """The ray tracer: silhouettes within 1% of the live renderer's (it shades differently)."""

    backend = WARP_BACKEND
    render_options = {"batch_worlds": BATCH}
    exact = False
    min_silhouette_agreement = 0.99

    min_segmentation_agreement = 0.99
    min_depth_agreement = 0.999

    def open_renderer(self, model, cameras, size, outputs=("rgb",)):
        from flyarchive.replay.warp_frames import WarpBatchRenderer

        return WarpBatchRenderer(model, cameras, size, batch_worlds=BATCH, device=WARP_DEVICE,
                                 outputs=outputs)

    def render(self, renderer, qpos, mocap_pos=None, mocap_quat=None):
        return np.concatenate(_in_batches(renderer.render_batch, renderer.batch_worlds, qpos,
                                          mocap_pos, mocap_quat))

    def render_outputs(self, renderer, qpos, mocap_pos=None, mocap_quat=None):
        blocks = _in_batches(renderer.render_outputs, renderer.batch_worlds, qpos, mocap_pos,
                             mocap_quat)
        return {name: np.concatenate([b[name] for b in blocks]) for name in blocks[0]}

    def depth_scale(self, renderer):
        return renderer.depth_scale


def _in_batches(render, batch, qpos, mocap_pos, mocap_quat):
    """``render`` of consecutive batches of at most ``batch`` states; its results, in order."""
    rows = lambda a, k: None if a is None else a[k:k + batch]  # noqa: E731
    return [render(rows(qpos, k), rows(mocap_pos, k), rows(mocap_quat, k))
            for k in range(0, len(qpos), batch)]


@pytest.fixture(scope="module")
def tiny():
    from flyarchive.replay.warp_frames import WarpBatchRenderer

    model = tiny_model()
    renderer = WarpBatchRenderer(model, ["front", "top"], SIZE, batch_worlds=BATCH,
                                 device=WARP_DEVICE)
    return model, renderer


@pytest.fixture(scope="module")
def slider():
    from flyarchive.replay.warp_frames import WarpBatchRenderer

    model = slider_model()
    return model, WarpBatchRenderer(model, "front", SIZE, batch_worlds=BATCH, device=WARP_DEVICE)


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
    """mujoco-warp 3.16 refuses a model with noslip iterations ("noslip solver not
    implemented"; mujoco-warp 4.0 has that solver): the prepared model is accepted by both."""
    import mujoco_warp as mjw

    from flyarchive.replay.warp_model import prepare_for_batch_rendering

    model = mujoco.MjModel.from_xml_string(MESH_XML)

    mjw.put_model(prepare_for_batch_rendering(model))

    assert model.opt.noslip_iterations > 0


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


def test_yuv420p_frames_are_the_bt601_conversion_of_the_rgb_frames(tiny):
    from flyarchive.replay.warp_frames import WarpBatchRenderer
    from flyarchive.testing import rgb_to_i420

    model, rgb_renderer = tiny
    qpos, _, _ = random_states(model, 3, seed=5)
    yuv_renderer = WarpBatchRenderer(model, ["front", "top"], SIZE, batch_worlds=BATCH,
                                     device=WARP_DEVICE, pixel_format="yuv420p")

    rgb = rgb_renderer.render_batch(qpos)
    yuv = yuv_renderer.render_batch(qpos)

    assert (yuv.shape, yuv.dtype) == ((3, 2, SIZE[0] * 3 // 2, SIZE[1]), np.dtype(np.uint8))
    np.testing.assert_array_equal(yuv, rgb_to_i420(rgb))
    assert len(np.unique(yuv[:, :, SIZE[0]:])) > 2  # chroma varies: coloured bodies


def test_yuv420p_needs_even_sizes(tiny):
    from flyarchive.replay.warp_frames import WarpBatchRenderer

    model, _ = tiny
    with pytest.raises(FrameSizeError, match="even"):
        WarpBatchRenderer(model, "front", (47, 64), batch_worlds=1, device=WARP_DEVICE,
                          pixel_format="yuv420p")
    with pytest.raises(ValueError, match="pixel_format"):
        WarpBatchRenderer(model, "front", SIZE, batch_worlds=1, device=WARP_DEVICE,
                          pixel_format="rgb")


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


# -- errors -----------------------------------------------------------------------


def test_batch_larger_than_batch_worlds_is_refused(tiny):
    model, renderer = tiny
    qpos = np.tile(model.qpos0, (BATCH + 1, 1))

    with pytest.raises(SelectionError, match=f"1 to {BATCH}"):
        renderer.render_batch(qpos)


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
    from flyarchive.replay.warp_frames import WarpBatchRenderer

    model, copying = slider
    qpos = np.linspace(-0.5, 0.5, 3 * BATCH).reshape(3, BATCH, 1)
    expected = [copying.render_batch(q) for q in qpos]
    ring = WarpBatchRenderer(model, "front", SIZE, batch_worlds=BATCH, device=WARP_DEVICE,
                             host_buffers=3)

    actual = [ring.render_batch(q) for q in qpos]

    for a, e in zip(actual, expected):
        np.testing.assert_array_equal(a, e)
    assert not np.array_equal(actual[0], actual[2])


def test_submitted_batches_land_in_the_buffers_named(slider):
    from flyarchive.replay.warp_frames import WarpBatchRenderer

    model, copying = slider
    qpos = np.linspace(-0.5, 0.5, 2 * BATCH).reshape(2, BATCH, 1)
    expected = [copying.render_batch(q) for q in qpos]
    renderer = WarpBatchRenderer(model, "front", SIZE, batch_worlds=BATCH, device=WARP_DEVICE,
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
    from flyarchive.replay.warp_frames import WarpBatchRenderer

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

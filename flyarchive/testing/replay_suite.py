"""One conformance suite that every replay renderer passes (needs pytest).

As ``zarr.testing.store.StoreTests`` is for storage backends: a backend's test module
subclasses :class:`ReplayTests`, says how to open its renderer and render a block of
states with it (:meth:`~ReplayTests.open_renderer`, :meth:`~ReplayTests.render`), which
``render_videos`` backend it is, and how close its frames must be to MuJoCo's own
renderer. The OpenGL renderer is bit-exact; the Warp ray tracer adds only its tolerance.

    class TestOpenGLReplay(ReplayTests):
        backend = "cpu"

        def open_renderer(self, model, cameras, size, outputs=("rgb",)):
            return OpenGLRenderer(model, cameras, size, outputs=outputs)

        def render(self, renderer, qpos, mocap_pos=None, mocap_quat=None):
            return renderer.render(qpos, mocap_pos, mocap_quat)

        def render_outputs(self, renderer, qpos, mocap_pos=None, mocap_quat=None):
            ...  # {"rgb", "depth", "segmentation"}: (n, n_cameras, H, W[, 3]) each

The reference is a live ``mujoco.Renderer`` fed the recorded state the way flygym's
live rendering does (:func:`live_frames`), with multisampling off, so that rasterizer
and ray tracer both sample pixel centres. Frames are small (48 x 64): the suite runs
in seconds on Warp's CPU device.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import mujoco
import numpy as np
import pytest

from flyarchive.errors import CameraNotFoundError, FrameSizeError, LayoutMismatchError
from flyarchive.testing import block_columns, reference_frames, slider_columns, slider_model, tiny_model

__all__ = ["ReplayTests", "live_frames", "live_maps", "silhouette_agreement", "SIZE", "CAMERAS",
           "OUTPUTS"]

#: ``(height, width)`` of the suite's frames.
SIZE = (48, 64)
#: The tiny model's cameras, in the order the suite asks for them.
CAMERAS = ("front", "top")
#: Every output a renderer makes.
OUTPUTS = ("rgb", "depth", "segmentation")


def without_multisampling(model: mujoco.MjModel) -> mujoco.MjModel:
    """A copy of ``model`` whose offscreen rendering samples pixel centres only."""
    model = copy.deepcopy(model)
    model.vis.quality.offsamples = 0
    return model


def live_frames(model: mujoco.MjModel, cameras: Sequence[str], size: tuple[int, int],
                qpos: np.ndarray, mocap_pos: np.ndarray | None = None,
                mocap_quat: np.ndarray | None = None) -> np.ndarray:
    """Frames of a live ``mujoco.Renderer`` for recorded states, as flygym renders them.

    Each state is copied into an ``MjData``; positions, the centre of mass frame and
    the cameras and lights are recomputed (``mj_kinematics``, ``mj_comPos``,
    ``mj_camlight``), then each camera is rendered.

    Returns:
        ``(n, n_cameras, H, W, 3)`` uint8 RGB.
    """
    data = mujoco.MjData(model)
    renderer = mujoco.Renderer(model, *size)
    frames = np.empty((len(qpos), len(cameras), *size, 3), np.uint8)
    try:
        for k in range(len(qpos)):
            data.qpos[:] = qpos[k]
            if mocap_pos is not None:
                data.mocap_pos[:] = mocap_pos[k]
            if mocap_quat is not None:
                data.mocap_quat[:] = mocap_quat[k]
            mujoco.mj_kinematics(model, data)
            mujoco.mj_comPos(model, data)
            mujoco.mj_camlight(model, data)
            for c, camera in enumerate(cameras):
                renderer.update_scene(data, camera)
                frames[k, c] = renderer.render()
    finally:
        renderer.close()
    return frames


def live_maps(model: mujoco.MjModel, cameras: Sequence[str], size: tuple[int, int],
              qpos: np.ndarray, mocap_pos: np.ndarray, mocap_quat: np.ndarray
              ) -> dict[str, np.ndarray]:
    """Depth and geom ids of a live ``mujoco.Renderer`` in its depth and segmentation modes.

    Returns:
        ``{"depth": (n, n_cameras, H, W) float32, NaN where segmentation shows nothing,
        "segmentation": (n, n_cameras, H, W) int32 geom id, -1 where no geom is seen}``.
    """
    data = mujoco.MjData(model)
    renderer = mujoco.Renderer(model, *size)
    depth = np.empty((len(qpos), len(cameras), *size), np.float32)
    ids = np.empty((len(qpos), len(cameras), *size), np.int32)
    try:
        for k in range(len(qpos)):
            data.qpos[:], data.mocap_pos[:], data.mocap_quat[:] = qpos[k], mocap_pos[k], mocap_quat[k]
            mujoco.mj_kinematics(model, data)
            mujoco.mj_comPos(model, data)
            mujoco.mj_camlight(model, data)
            for c, camera in enumerate(cameras):
                renderer.update_scene(data, camera)
                renderer.enable_segmentation_rendering()
                objects = renderer.render()
                renderer.enable_depth_rendering()
                depth[k, c] = renderer.render()
                renderer.disable_depth_rendering()
                geom = objects[..., 1] == mujoco.mjtObj.mjOBJ_GEOM
                ids[k, c] = np.where(geom, objects[..., 0], -1)
                depth[k, c][objects[..., 0] == -1] = np.nan
    finally:
        renderer.close()
    return {"depth": depth, "segmentation": ids}


def silhouette_agreement(actual: np.ndarray, expected: np.ndarray) -> float:
    """The fraction of pixels that are background (black) in both frames or in neither."""
    return float(np.mean(actual.any(axis=-1) == expected.any(axis=-1)))


class ReplayTests:
    """Behaviours every replay backend has. Subclass it in a test module (``Test...``).

    Subclasses set :attr:`backend` and implement :meth:`open_renderer` and
    :meth:`render`; a backend that is not bit-exact sets :attr:`exact` to False and
    :attr:`min_silhouette_agreement` to its tolerance.
    """

    #: The ``RenderOptions.backend`` that renders with this renderer.
    backend: ClassVar[str]
    #: Extra ``RenderOptions`` fields for this backend (e.g. ``batch_worlds``).
    render_options: ClassVar[dict[str, Any]] = {}
    #: Frames equal a live ``mujoco.Renderer``'s byte for byte.
    exact: ClassVar[bool] = True
    #: When not exact: the least fraction of pixels whose silhouette (object or
    #: background) agrees with a live ``mujoco.Renderer``'s.
    min_silhouette_agreement: ClassVar[float] = 1.0
    #: Decoded video: how far (pixels) the slider block may be from its projection
    #: (H.264 at crf 18 moves edges a little).
    column_tolerance: ClassVar[float] = 1.5
    #: When not exact: the least fraction of pixels whose segmentation (geom id, or
    #: nothing) equals a live ``mujoco.Renderer``'s (edges may differ).
    min_segmentation_agreement: ClassVar[float] = 1.0
    #: When not exact: the least fraction of pixels, of those where both see the same
    #: geom, whose depth is within one count (the renderer's depth scale) of the live one.
    min_depth_agreement: ClassVar[float] = 1.0

    # -- what a backend provides -----------------------------------------------------

    def open_renderer(self, model: mujoco.MjModel, cameras: str | Sequence[str],
                      size: tuple[int, int], outputs: Sequence[str] = ("rgb",)) -> Any:
        """A renderer of ``model`` for ``cameras`` at ``size`` making ``outputs``; raises
        what the backend raises."""
        raise NotImplementedError

    def render_outputs(self, renderer: Any, qpos: np.ndarray, mocap_pos: np.ndarray | None = None,
                       mocap_quat: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Every output of ``n`` states: ``"rgb"`` as :meth:`render`, ``"depth"`` ``(n,
        n_cameras, H, W)`` float32 model units (NaN: no hit), ``"segmentation"`` int32
        geom ids (-1: none)."""
        raise NotImplementedError

    def depth_scale(self, renderer: Any) -> float:
        """Model units per count of the depth maps the renderer's backend stores."""
        from flyarchive.replay.output_kinds import default_depth_scale

        return default_depth_scale(renderer.model)

    def render(self, renderer: Any, qpos: np.ndarray, mocap_pos: np.ndarray | None = None,
               mocap_quat: np.ndarray | None = None) -> np.ndarray:
        """``(n, n_cameras, H, W, 3)`` uint8 frames of ``n`` states, on the host."""
        raise NotImplementedError

    def close_renderer(self, renderer: Any) -> None:
        """Free what the renderer holds (a GL context, device memory)."""
        close = getattr(renderer, "close", None)
        if close is not None:
            close()

    # -- comparisons -----------------------------------------------------------------

    def assert_like_live(self, actual: np.ndarray, expected: np.ndarray) -> None:
        """``actual`` frames are what a live ``mujoco.Renderer`` shows, within tolerance."""
        assert actual.shape == expected.shape and actual.dtype == np.uint8
        if self.exact:
            np.testing.assert_array_equal(actual, expected)
        else:
            agreement = silhouette_agreement(actual, expected)
            assert agreement >= self.min_silhouette_agreement, (
                f"silhouettes agree on {agreement:.2%} of pixels; "
                f"{self.backend} needs {self.min_silhouette_agreement:.2%}")

    # -- fixtures --------------------------------------------------------------------

    # Class-scoped fixtures are classmethods (pytest 9); a renderer is built once per class.
    @pytest.fixture(scope="class")
    @classmethod
    def model(cls) -> mujoco.MjModel:
        """The tiny model (free, hinge, ball and slide joints, a mocap body, two cameras)."""
        return without_multisampling(tiny_model())

    @pytest.fixture(scope="class")
    @classmethod
    def tiny_renderer(cls, model: mujoco.MjModel) -> Iterator[Any]:
        """A renderer of the tiny model's two cameras."""
        suite = cls()
        renderer = suite.open_renderer(model, CAMERAS, SIZE)
        yield renderer
        suite.close_renderer(renderer)

    @pytest.fixture(scope="class")
    @classmethod
    def outputs_renderer(cls, model: mujoco.MjModel) -> Iterator[Any]:
        """A renderer of the tiny model's two cameras making every output."""
        suite = cls()
        renderer = suite.open_renderer(model, CAMERAS, SIZE, OUTPUTS)
        yield renderer
        suite.close_renderer(renderer)

    @pytest.fixture(scope="class")
    @classmethod
    def slider_renderer(cls) -> Iterator[Any]:
        """A renderer of the slider model's camera ``front``."""
        suite = cls()
        renderer = suite.open_renderer(without_multisampling(slider_model()), "front", SIZE)
        yield renderer
        suite.close_renderer(renderer)

    @pytest.fixture(scope="class")
    @classmethod
    def recorded(cls, model: mujoco.MjModel) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The 11 states a recording of one tiny world holds: qpos, mocap_pos, mocap_quat."""
        frames = reference_frames(model, 1, 40)
        return frames["qpos"][0], frames["mocap_pos"][0], frames["mocap_quat"][0]

    # -- frames ----------------------------------------------------------------------

    def test_frames_hold_one_rgb_image_per_state_and_camera(self, tiny_renderer, recorded):
        expected = (len(recorded[0]), len(CAMERAS), *SIZE, 3)

        frames = self.render(tiny_renderer, *recorded)

        assert (frames.shape, frames.dtype) == (expected, np.dtype(np.uint8))
        assert not np.array_equal(frames[0], frames[-1])  # the scene moves: a real recording

    def test_frames_of_a_recorded_state_match_a_live_mujoco_renderer(self, model, tiny_renderer,
                                                                      recorded):
        expected = live_frames(model, CAMERAS, SIZE, *recorded)

        actual = self.render(tiny_renderer, *recorded)

        self.assert_like_live(actual, expected)

    def test_the_block_is_where_the_camera_projects_its_qpos(self, slider_renderer):
        xs = np.linspace(-0.6, 0.6, 4)
        expected = slider_columns(xs, SIZE)

        frames = self.render(slider_renderer, xs[:, None])

        np.testing.assert_allclose(block_columns(frames[:, 0]), expected, atol=1.0)

    def test_a_mocap_body_is_drawn_where_its_pose_puts_it(self, model, tiny_renderer, recorded):
        qpos, mocap_pos, mocap_quat = (a[:2] for a in recorded)
        moved = mocap_pos + np.array([-0.5, -0.5, 0.4])  # in front of the camera 'front'
        expected = live_frames(model, CAMERAS, SIZE, qpos, moved, mocap_quat)
        assert not np.array_equal(expected, live_frames(model, CAMERAS, SIZE, qpos, mocap_pos,
                                                        mocap_quat))  # the move shows

        actual = self.render(tiny_renderer, qpos, moved, mocap_quat)

        self.assert_like_live(actual, expected)

    def test_missing_mocap_poses_render_the_models_default_poses(self, model, tiny_renderer,
                                                                 recorded):
        qpos = recorded[0][:2]
        data = mujoco.MjData(model)
        expected = self.render(tiny_renderer, qpos, np.repeat(data.mocap_pos[None], 2, 0),
                               np.repeat(data.mocap_quat[None], 2, 0))

        actual = self.render(tiny_renderer, qpos)

        np.testing.assert_array_equal(actual, expected)

    def test_a_block_of_states_renders_as_each_state_alone(self, tiny_renderer, recorded):
        qpos, mocap_pos, mocap_quat = (a[:3] for a in recorded)
        expected = np.concatenate([
            self.render(tiny_renderer, qpos[k:k + 1], mocap_pos[k:k + 1], mocap_quat[k:k + 1])
            for k in range(3)
        ])

        actual = self.render(tiny_renderer, qpos, mocap_pos, mocap_quat)

        np.testing.assert_array_equal(actual, expected)

    def test_the_same_states_render_the_same_frames_after_others(self, tiny_renderer, recorded):
        qpos, mocap_pos, mocap_quat = recorded
        expected = self.render(tiny_renderer, qpos[:2], mocap_pos[:2], mocap_quat[:2])
        self.render(tiny_renderer, qpos[-2:], mocap_pos[-2:], mocap_quat[-2:])

        actual = self.render(tiny_renderer, qpos[:2], mocap_pos[:2], mocap_quat[:2])

        np.testing.assert_array_equal(actual, expected)

    # -- depth and segmentation ------------------------------------------------------

    def test_outputs_hold_rgb_depth_and_segmentation_of_each_state(self, outputs_renderer,
                                                                    recorded):
        n = len(recorded[0])

        outputs = self.render_outputs(outputs_renderer, *recorded)

        assert sorted(outputs) == sorted(OUTPUTS)
        assert outputs["depth"].shape == outputs["segmentation"].shape == (n, len(CAMERAS), *SIZE)
        assert (outputs["depth"].dtype, outputs["segmentation"].dtype) == (np.float32, np.int32)

    def test_rgb_among_other_outputs_is_the_rgb_frame_alone(self, tiny_renderer,
                                                            outputs_renderer, recorded):
        expected = self.render(tiny_renderer, *recorded)

        actual = self.render_outputs(outputs_renderer, *recorded)["rgb"]

        np.testing.assert_array_equal(actual, expected)

    def test_segmentation_names_the_geoms_a_live_renderer_shows(self, model, outputs_renderer,
                                                                recorded):
        expected = live_maps(model, CAMERAS, SIZE, *recorded)["segmentation"]
        assert len(np.unique(expected)) >= 4  # background and several geoms: a real test

        actual = self.render_outputs(outputs_renderer, *recorded)["segmentation"]

        agreement = float(np.mean(actual == expected))
        assert agreement >= (1.0 if self.exact else self.min_segmentation_agreement), agreement

    def test_depth_is_a_live_renderers_where_both_see_the_same_geom(self, model,
                                                                   outputs_renderer, recorded):
        expected = live_maps(model, CAMERAS, SIZE, *recorded)
        scale = self.depth_scale(outputs_renderer)

        actual = self.render_outputs(outputs_renderer, *recorded)

        same = (actual["segmentation"] == expected["segmentation"]) & (expected["segmentation"] >= 0)
        error = np.abs(actual["depth"] - expected["depth"])[same]
        if self.exact:
            np.testing.assert_array_equal(actual["depth"], expected["depth"])
        else:
            assert float(np.mean(error <= scale)) >= self.min_depth_agreement

    def test_depth_is_nan_where_no_object_is_hit(self, model, outputs_renderer, recorded):
        expected = np.isnan(live_maps(model, CAMERAS, SIZE, *recorded)["depth"])
        assert 0.01 < expected.mean() < 0.99  # some background, some objects

        actual = np.isnan(self.render_outputs(outputs_renderer, *recorded)["depth"])

        assert float(np.mean(actual == expected)) >= (
            1.0 if self.exact else self.min_segmentation_agreement)

    @pytest.mark.parametrize("outputs", [("depth",), ("segmentation",), ("rgb", "depth")])
    def test_any_outputs_render_as_they_do_among_all(self, model, outputs_renderer, recorded,
                                                     outputs):
        qpos, mocap_pos, mocap_quat = (a[:2] for a in recorded)
        everything = self.render_outputs(outputs_renderer, qpos, mocap_pos, mocap_quat)
        renderer = self.open_renderer(model, CAMERAS, SIZE, outputs)

        try:
            actual = self.render_outputs(renderer, qpos, mocap_pos, mocap_quat)
        finally:
            self.close_renderer(renderer)

        assert sorted(actual) == sorted(outputs)
        for name in outputs:
            np.testing.assert_array_equal(actual[name], everything[name])

    def test_an_unknown_output_is_refused(self, model):
        from flyarchive.errors import RenderOptionsError

        with pytest.raises(RenderOptionsError, match="Unknown output 'normals'"):
            self.open_renderer(model, CAMERAS, SIZE, ("rgb", "normals"))

    # -- refusals --------------------------------------------------------------------

    @pytest.mark.parametrize(("cameras", "fragment"), [
        (["front", "side"], "No camera 'side' in the model. Cameras: 'front', 'top'"),
        ([], "No camera was asked for. Cameras: 'front', 'top'"),
        (["top", "top"], "name one camera twice"),
    ])
    def test_camera_names_the_model_lacks_are_refused(self, model, cameras, fragment):
        with pytest.raises(CameraNotFoundError, match=fragment):
            self.open_renderer(model, cameras, SIZE)

    @pytest.mark.parametrize("size", [(0, 10), (10,), (10.5, 10), (-2, 4), "48x64"])
    def test_sizes_that_are_not_two_positive_integers_are_refused(self, model, size):
        with pytest.raises(FrameSizeError, match=r"size must be \(height, width\)"):
            self.open_renderer(model, "front", size)

    def test_qpos_of_another_model_is_refused(self, tiny_renderer):
        with pytest.raises(LayoutMismatchError, match="nq=13"):
            self.render(tiny_renderer, np.zeros((3, 12)))

    @pytest.mark.parametrize("shape", [(2, 1, 3), (3, 2, 3)])
    def test_mocap_poses_of_another_shape_are_refused(self, model, tiny_renderer, shape):
        qpos = np.tile(model.qpos0, (3, 1))

        with pytest.raises(LayoutMismatchError, match=r"mocap_pos has shape \(%d, %d, 3\)" % shape[:2]):
            self.render(tiny_renderer, qpos, np.zeros(shape))

    # -- through render_videos --------------------------------------------------------

    def render_videos_here(self, url: str, out: str, **options: Any) -> Any:
        """``render_videos`` of the slider archive ``url`` on this backend, in this process."""
        from flyarchive.distribute.api import RenderOptions, render_videos

        options = {"size": SIZE, **self.render_options, **options}
        return render_videos(url, slider_model(), "front", out, n_workers=0,
                             options=RenderOptions(backend=self.backend, **options))

    def test_decoded_frame_k_shows_the_state_of_archive_frame_k(self, tmp_path):
        from flyarchive.testing.fixtures import slider_archive
        from flyarchive.video import read_video

        qpos = np.random.default_rng(7).permutation(np.linspace(-0.8, 0.8, 11))[None, :, None]
        url = slider_archive(str(tmp_path / "slider.zarr"), qpos)

        result = self.render_videos_here(url, str(tmp_path / "v"))

        actual = block_columns(read_video(result.videos[0]["path"]))
        np.testing.assert_allclose(actual, slider_columns(qpos[0, :, 0], SIZE),
                                   atol=self.column_tolerance)

    def test_frames_whose_state_holds_nan_render_black(self, tmp_path):
        from flyarchive.testing.fixtures import slider_archive
        from flyarchive.video import read_video

        qpos = np.linspace(-0.8, 0.8, 11)[None, :, None]
        qpos[0, 5] = np.nan
        url = slider_archive(str(tmp_path / "nan.zarr"), qpos)

        result = self.render_videos_here(url, str(tmp_path / "v"))

        frames = read_video(result.videos[0]["path"]).astype(int)
        assert frames.shape[0] == 11
        assert frames[5].max() <= 20  # black, give or take the codec
        others = np.delete(frames, 5, axis=0)
        assert (others.reshape(len(others), -1).max(axis=1) > 128).all()  # the block shows

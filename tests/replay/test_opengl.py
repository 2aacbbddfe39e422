"""CPU replay: recorded qpos/mocap re-rendered with OpenGL equals what was rendered live.

The behaviours every renderer shares are the conformance suite
(:class:`flyarchive.testing.replay_suite.ReplayTests`), which :class:`TestOpenGLReplay`
runs bit-exact; the tests below are the OpenGL renderer's own (framebuffer, EGL, lazy
frames, closing).
"""

from __future__ import annotations

import os
import subprocess
import sys

import mujoco
import numpy as np
import pytest

from flyarchive.errors import FrameSizeError, LayoutMismatchError, RenderBackendError
from flyarchive.replay.kinematics import set_state, update_render_geometry
from flyarchive.replay.opengl_frames import OpenGLRenderer, headless_renderer, pin_rasterizer_threads
from flyarchive.testing import simulate, slider_model, tiny_model
from flyarchive.testing.replay_suite import ReplayTests

SIZE = (96, 128)
CAMERAS = ("front", "top")


class TestOpenGLReplay(ReplayTests):
    """mujoco.Renderer under EGL: every frame equals the live renderer's, byte for byte."""

    backend = "cpu"

    def open_renderer(self, model, cameras, size, outputs=("rgb",)):
        return OpenGLRenderer(model, cameras, size, outputs=outputs)

    def render(self, renderer, qpos, mocap_pos=None, mocap_quat=None):
        return renderer.render(qpos, mocap_pos, mocap_quat)

    def render_outputs(self, renderer, qpos, mocap_pos=None, mocap_quat=None):
        frames = [renderer.render_outputs(qpos[k], None if mocap_pos is None else mocap_pos[k],
                                          None if mocap_quat is None else mocap_quat[k])
                  for k in range(len(qpos))]
        return {name: np.stack([f[name] for f in frames]) for name in frames[0]}


@pytest.fixture(scope="module")
def live_recording() -> dict[str, np.ndarray]:
    """Simulate the tiny model, render every 10th step live the way flygym 2.1.1 does.

    Live rendering copies qpos and mocap poses into a private MjData, recomputes the
    geometry and renders; the same step stores the state that replay reads back.
    """
    model = tiny_model()
    private = mujoco.MjData(model)
    renderer = headless_renderer(model, SIZE)
    frames, qpos, mocap_pos, mocap_quat = [], [], [], []

    def on_step(datas: list[mujoco.MjData]) -> None:
        data = datas[0]
        if round(data.time / model.opt.timestep) % 10:
            return
        private.qpos[:] = data.qpos
        private.mocap_pos[:] = data.mocap_pos
        private.mocap_quat[:] = data.mocap_quat
        update_render_geometry(model, private)
        views = []
        for camera in CAMERAS:
            renderer.update_scene(private, camera)
            views.append(renderer.render())
        frames.append(views)
        qpos.append(data.qpos.copy())
        mocap_pos.append(data.mocap_pos.copy())
        mocap_quat.append(data.mocap_quat.copy())

    simulate(model, 1, 60, on_step)
    renderer.close()
    return {
        "frames": np.array(frames),
        "qpos": np.array(qpos),
        "mocap_pos": np.array(mocap_pos),
        "mocap_quat": np.array(mocap_quat),
    }


def test_iter_frames_yields_the_same_frames_as_render(
    live_recording: dict[str, np.ndarray],
) -> None:
    expected = live_recording["frames"]
    state = (live_recording["qpos"], live_recording["mocap_pos"], live_recording["mocap_quat"])

    with OpenGLRenderer(tiny_model(), list(CAMERAS), SIZE) as renderer:
        actual = np.stack(list(renderer.iter_frames(*state)))

    assert np.array_equal(actual, expected)


def test_set_state_copies_the_frame_and_updates_geometry() -> None:
    model = slider_model()
    data = mujoco.MjData(model)

    set_state(model, data, np.array([0.25], dtype=np.float32))

    assert data.qpos[0] == np.float32(0.25)
    assert data.xpos[1, 0] == pytest.approx(0.25)


def test_set_state_refuses_a_qpos_of_another_model() -> None:
    model = slider_model()

    with pytest.raises(LayoutMismatchError, match=r"shape \(13,\).*needs \(1,\)"):
        set_state(model, mujoco.MjData(model), np.zeros(13))


def test_size_beyond_the_framebuffer_renders_with_an_enlarged_copy() -> None:
    model = tiny_model()  # offscreen buffer 640 x 480
    qpos = model.qpos0[None]

    with OpenGLRenderer(model, "front", (500, 700)) as renderer:
        frames = renderer.render(qpos)

    assert frames.shape == (1, 1, 500, 700, 3)
    assert frames[0, 0, 480:, 640:].mean() > 10  # floor drawn beyond the model's own buffer
    assert (model.vis.global_.offheight, model.vis.global_.offwidth) == (480, 640)


def test_a_framebuffer_fitted_to_the_frames_renders_the_same_pixels(
    live_recording: dict[str, np.ndarray],
) -> None:
    # flygym's NeuroMechFly has a 2048 x 2048 buffer; replay renders with one the size
    # of its frames. Live rendering (the model's own buffer) must give the same bytes.
    model = tiny_model()
    model.vis.global_.offwidth = model.vis.global_.offheight = 2048
    qpos = live_recording["qpos"]
    live = headless_renderer(model, SIZE)
    data = mujoco.MjData(model)
    expected = []
    for q, p, r in zip(qpos, live_recording["mocap_pos"], live_recording["mocap_quat"]):
        data.qpos[:], data.mocap_pos[:], data.mocap_quat[:] = q, p, r
        update_render_geometry(model, data)
        live.update_scene(data, "front")
        expected.append(live.render())
    live.close()

    with OpenGLRenderer(model, "front", SIZE) as renderer:
        actual = renderer.render(qpos, live_recording["mocap_pos"],
                                 live_recording["mocap_quat"])[:, 0]
        fitted = renderer._render_model.vis.global_

    assert (fitted.offheight, fitted.offwidth) == SIZE
    assert (model.vis.global_.offheight, model.vis.global_.offwidth) == (2048, 2048)
    assert np.array_equal(actual, np.array(expected))


def test_size_beyond_the_framebuffer_without_enlarging_says_how_to_fix() -> None:
    with pytest.raises(FrameSizeError, match=r'offwidth="700" offheight="500"'):
        OpenGLRenderer(tiny_model(), "front", (500, 700), enlarge_buffer=False)


def test_closed_renderer_refuses_to_render() -> None:
    renderer = OpenGLRenderer(tiny_model(), "front", SIZE)
    renderer.close()
    renderer.close()

    with pytest.raises(RuntimeError, match="closed"):
        renderer.render(tiny_model().qpos0[None])


@pytest.mark.parametrize("call", ["render_frame", "render", "render_outputs"])
def test_a_renderer_that_rendered_in_another_thread_is_closed_here(call) -> None:
    """MuJoCo 4's Renderer.close() makes the context current in the closing thread: EGL
    refuses while the thread that rendered holds it (a pool's thread, closed at exit)."""
    from concurrent.futures import ThreadPoolExecutor

    model = tiny_model()
    renderer = OpenGLRenderer(model, "front", SIZE, outputs=("rgb", "depth"))
    qpos = model.qpos0 if call != "render" else model.qpos0[None]

    with ThreadPoolExecutor(1) as pool:  # the thread that rendered stays alive
        pool.submit(getattr(renderer, call), qpos).result()
        renderer.close()

    with pytest.raises(RuntimeError, match="closed"):
        renderer.render_frame(model.qpos0)


@pytest.mark.subprocess
def test_unusable_egl_raises_render_backend_error_with_instructions() -> None:
    script = (
        "from flyarchive.replay.opengl_frames import OpenGLRenderer\n"
        "from flyarchive.testing import tiny_model\n"
        "try:\n"
        "    OpenGLRenderer(tiny_model(), 'front')\n"
        "except Exception as err:\n"
        "    print(type(err).__name__, err)\n"
    )
    env = {**os.environ, "MUJOCO_GL": "egl", "MUJOCO_EGL_DEVICE_ID": "999"}

    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )

    assert result.stdout.startswith(RenderBackendError.__name__)
    assert "MUJOCO_GL=egl" in result.stdout and "libegl1" in result.stdout


def test_pin_rasterizer_threads_sets_lp_num_threads_only_when_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LP_NUM_THREADS", raising=False)

    first = pin_rasterizer_threads(1)
    second = pin_rasterizer_threads(4)

    assert (first, second, os.environ["LP_NUM_THREADS"]) == ("1", "1", "1")


@pytest.mark.subprocess
def test_egl_is_used_even_when_mujoco_was_imported_before_flyarchive() -> None:
    script = (
        "import mujoco\n"  # MUJOCO_GL unset here: MuJoCo binds GLFW, which needs a display
        "from mujoco.rendering.classic import gl_context\n"
        "before = gl_context.GLContext\n"
        "from flyarchive.replay.opengl_frames import OpenGLRenderer\n"
        "from flyarchive.testing import tiny_model\n"
        "model = tiny_model()\n"
        "with OpenGLRenderer(model, 'front', (32, 32)) as renderer:\n"
        "    frame = renderer.render(model.qpos0[None])\n"
        "print(frame.shape, frame.mean() > 0, gl_context.GLContext is before)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM")}
    env.pop("DISPLAY", None)

    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )

    assert result.stdout.strip() == "(1, 1, 32, 32, 3) True True", result.stderr


class _LazyFrames:
    """An array-like that records which frames were read, like a lazy zarr/dask array."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = values
        self.shape = values.shape
        self.read: list[int] = []

    def __getitem__(self, k: int) -> np.ndarray:
        self.read.append(k)
        return self.values[k]


def test_iter_frames_reads_the_state_one_frame_at_a_time() -> None:
    model = slider_model()
    qpos = _LazyFrames(np.linspace(-0.5, 0.5, 50)[:, None])

    with OpenGLRenderer(model, "front", SIZE) as renderer:
        frames = renderer.iter_frames(qpos)
        next(frames)
        next(frames)

    assert qpos.read == [0, 1]

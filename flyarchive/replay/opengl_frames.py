"""Replay on CPU: OpenGL rasterization with ``mujoco.Renderer`` (EGL, Mesa without a GPU).

The OpenGL backend: MuJoCo binds its GL context class from ``MUJOCO_GL`` *when
``mujoco`` is first imported* (unset: GLFW, which needs a display). This module sets
no environment variable: each renderer it makes (:func:`headless_renderer`) creates
its context with :func:`flyarchive.config.gl_backend` (``MUJOCO_GL`` when set, else
``egl`` on Linux), whatever was imported first; MuJoCo's global choice is left as it
was for other code.

Mesa's software rasterizer (llvmpipe) uses every core by default; several renderers in
parallel processes should call :func:`pin_rasterizer_threads` before their first frame.

An :class:`OpenGLRenderer` leaves its EGL context current in no thread after each call:
MuJoCo 4's ``Renderer.close()`` makes the context current in the closing thread, which EGL
refuses (``EGL_BAD_ACCESS``) while the thread that rendered still holds it, so a renderer
that rendered in a pool's thread (``render_frames`` computing on dask's threads) could not
be closed by another (at exit: a traceback per renderer). MuJoCo 3.16 closed without
making it current. Releasing it costs about 0.1 ms a call (measured on the 2-core VM).
"""

from __future__ import annotations

import copy
import importlib
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import Any

import mujoco
import numpy as np
from numpy.typing import ArrayLike

from flyarchive.config import gl_backend
from flyarchive.errors import (
    FrameSizeError,
    LayoutMismatchError,
    OptionsError,
    RenderBackendError,
)
from flyarchive.models import camera_ids, camera_names
from flyarchive.replay.sizes import MAX_GL_SIDE, parse_frame_size
from flyarchive.replay.kinematics import set_state
from flyarchive.replay.output_kinds import check_segmentable, parse_outputs

_HEADLESS_BACKENDS = ("egl", "osmesa")
_context_lock = threading.Lock()


def pin_rasterizer_threads(n: int = 1) -> str:
    """Limit Mesa's software rasterizer to ``n`` threads, unless ``LP_NUM_THREADS`` is set.

    Call it in each worker process before its first frame (Mesa reads the variable when
    it creates its first context). With several rendering processes on one machine,
    one thread each avoids oversubscribing the cores.

    Args:
        n: Rasterizer threads per process, ``>= 0`` (0: rasterize on the calling thread).

    Returns:
        The value of ``LP_NUM_THREADS`` now in effect (the caller's, if already set).
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise OptionsError(f"n must be a non-negative integer, got {n!r}.")
    return os.environ.setdefault("LP_NUM_THREADS", str(n))


class OpenGLRenderer:
    """Renders recorded frames of one model from several cameras with OpenGL.

    Holds a private ``MjData`` and one ``mujoco.Renderer`` (one GL context). Not
    thread-safe: use one per thread or process. Use it as a context manager, or call
    :meth:`close`, to free the GL context.

    Args:
        model: The compiled model the state was recorded with.
        cameras: One camera name or a sequence of names; frames hold them in this order.
        size: ``(height, width)`` of each frame in pixels.
        enlarge_buffer: If the model's offscreen framebuffer (``<visual><global
            offwidth offheight>``) is smaller than ``size``, render anyway (True, the
            default) or raise (False). Replay renders with a copy of the model whose
            buffer is exactly ``size`` (same pixels, less work per frame); the
            caller's model is never modified.
        scene_option: MuJoCo visualization options; ``None`` means MuJoCo's defaults
            (what flygym's live renderer uses).
        max_geom: Capacity of the scene (geoms drawn per frame).
        outputs: What :meth:`render_outputs` makes, names from
            :data:`flyarchive.replay.output_kinds.OUTPUTS` (default RGB only).

    Raises:
        CameraNotFoundError: if a camera is not in the model (the message lists them).
        FrameSizeError: if ``size`` is not two positive integers, is larger than
            16384, or exceeds the model's framebuffer and ``enlarge_buffer`` is False.
        RenderBackendError: if no OpenGL context can be created (no usable EGL).
        RenderOptionsError: an unknown output name.
        OptionsError: segmentation of a model with more than 65534 geoms.
    """

    def __init__(
        self,
        model: mujoco.MjModel,
        cameras: str | Sequence[str],
        size: tuple[int, int] = (240, 320),
        *,
        enlarge_buffer: bool = True,
        scene_option: mujoco.MjvOption | None = None,
        max_geom: int = 10000,
        outputs: Sequence[str] = ("rgb",),
    ) -> None:
        self._renderer: Any = None
        self.outputs: tuple[str, ...] = parse_outputs(outputs)
        if "segmentation" in self.outputs:
            check_segmentable(model)
        names = (cameras,) if isinstance(cameras, str) else tuple(cameras)
        self._camera_ids = camera_ids(model, names)
        self.cameras: tuple[str, ...] = names
        self.size: tuple[int, int] = parse_frame_size(size, max_side=MAX_GL_SIDE)
        self.model = model
        self._render_model = _fit_buffer(model, self.size, enlarge_buffer)
        self._data = mujoco.MjData(model)
        self._scene_option = scene_option if scene_option is not None else mujoco.MjvOption()
        self._backend = gl_backend()
        self._renderer = headless_renderer(self._render_model, self.size, max_geom=max_geom)
        _release_context(self._backend)

    def __enter__(self) -> OpenGLRenderer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Free the GL context; the renderer cannot render afterwards. Idempotent."""
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    def render_frame(
        self,
        qpos: ArrayLike,
        mocap_pos: ArrayLike | None = None,
        mocap_quat: ArrayLike | None = None,
        *,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """Render one recorded frame from every camera.

        Args:
            qpos: ``(nq,)`` generalized coordinates.
            mocap_pos: ``(nmocap, 3)`` in the model's length unit (NeuroMechFly:
                millimetres), or ``None`` for the model's default poses.
            mocap_quat: ``(nmocap, 4)`` w, x, y, z, or ``None`` for the default poses.
            out: Optional ``(n_cameras, H, W, 3)`` uint8 array to fill.

        Returns:
            ``(n_cameras, H, W, 3)`` uint8 RGB on the host; row 0 is the top of the image.
        """
        try:
            return self._draw(qpos, mocap_pos, mocap_quat, out)
        finally:
            _release_context(self._backend)

    def _draw(self, qpos: ArrayLike, mocap_pos: ArrayLike | None,
              mocap_quat: ArrayLike | None, out: np.ndarray | None) -> np.ndarray:
        """:meth:`render_frame`, leaving the GL context current in this thread."""
        if self._renderer is None:
            raise RuntimeError("This OpenGLRenderer is closed; create a new one to render.")
        height, width = self.size
        if out is None:
            out = np.empty((len(self._camera_ids), height, width, 3), dtype=np.uint8)
        set_state(self.model, self._data, qpos, mocap_pos, mocap_quat)
        for i, camera_id in enumerate(self._camera_ids):
            self._renderer.update_scene(self._data, camera_id, self._scene_option)
            self._renderer.render(out=out[i])
        return out

    def render_outputs(
        self,
        qpos: ArrayLike,
        mocap_pos: ArrayLike | None = None,
        mocap_quat: ArrayLike | None = None,
    ) -> dict[str, np.ndarray]:
        """Render one recorded frame's :attr:`outputs` from every camera (one kinematics pass).

        Each camera's scene is updated once and drawn once per output kind, with
        ``mujoco.Renderer``'s public depth and segmentation modes: RGB, then segmentation,
        then depth (depth alone still draws the segmentation pass, which tells where
        nothing is hit). Each output equals what ``mujoco.Renderer`` returns in that mode.

        Args: as :meth:`render_frame`.

        Returns:
            ``{"rgb": (n_cameras, H, W, 3) uint8, "depth": (n_cameras, H, W) float32
            planar depth in the model's length unit (NaN: nothing hit),
            "segmentation": (n_cameras, H, W) int32 geom id (-1: no geom)}``, the keys
            of :attr:`outputs` only; host arrays, row 0 at the top of the image.
        """
        try:
            return self._draw_outputs(qpos, mocap_pos, mocap_quat)
        finally:
            _release_context(self._backend)

    def _draw_outputs(self, qpos: ArrayLike, mocap_pos: ArrayLike | None,
                      mocap_quat: ArrayLike | None) -> dict[str, np.ndarray]:
        """:meth:`render_outputs`, leaving the GL context current in this thread."""
        if self._renderer is None:
            raise RuntimeError("This OpenGLRenderer is closed; create a new one to render.")
        n, (height, width) = len(self._camera_ids), self.size
        out: dict[str, np.ndarray] = {}
        if "rgb" in self.outputs:
            out["rgb"] = np.empty((n, height, width, 3), np.uint8)
        if "depth" in self.outputs:
            out["depth"] = np.empty((n, height, width), np.float32)
        if "segmentation" in self.outputs:
            out["segmentation"] = np.empty((n, height, width), np.int32)
        set_state(self.model, self._data, qpos, mocap_pos, mocap_quat)
        renderer = self._renderer
        for i, camera_id in enumerate(self._camera_ids):
            renderer.update_scene(self._data, camera_id, self._scene_option)
            if "rgb" in out:
                renderer.render(out=out["rgb"][i])
            if len(out) == 1 and "rgb" in out:
                continue
            objects = _segmentation_pass(renderer)  # (H, W, 2) object id and type
            if "segmentation" in out:
                geom = objects[..., 1] == int(mujoco.mjtObj.mjOBJ_GEOM)
                np.copyto(out["segmentation"][i], np.where(geom, objects[..., 0], -1))
            if "depth" in out:
                renderer.enable_depth_rendering()
                try:
                    depth = renderer.render(out=out["depth"][i])
                finally:
                    renderer.disable_depth_rendering()
                depth[objects[..., 0] == -1] = np.nan  # the same pixels as the raw depth's 0
        return out

    def iter_frames(
        self,
        qpos: ArrayLike,
        mocap_pos: ArrayLike | None = None,
        mocap_quat: ArrayLike | None = None,
    ) -> Iterator[np.ndarray]:
        """Render frame by frame; memory holds one frame whatever the number of frames.

        The inputs are indexed one frame at a time (``np.asarray(qpos[k])``), so lazy
        arrays (zarr, dask, xarray) are read frame by frame too.

        Args:
            qpos: ``(n_frames, nq)`` generalized coordinates.
            mocap_pos: ``(n_frames, nmocap, 3)`` in the model's length unit
                (NeuroMechFly: millimetres), or ``None`` (default poses).
            mocap_quat: ``(n_frames, nmocap, 4)`` w, x, y, z, or ``None`` (default poses).

        Yields:
            ``(n_cameras, H, W, 3)`` uint8 RGB, a new array per frame.

        Raises:
            LayoutMismatchError: if the shapes do not fit the model or each other.
        """
        n_frames = _check_block(self.model, qpos, mocap_pos, mocap_quat)
        for k in range(n_frames):
            yield self.render_frame(
                np.asarray(qpos[k]),  # type: ignore[index]
                None if mocap_pos is None else np.asarray(mocap_pos[k]),  # type: ignore[index]
                None if mocap_quat is None else np.asarray(mocap_quat[k]),  # type: ignore[index]
            )

    def render(
        self,
        qpos: ArrayLike,
        mocap_pos: ArrayLike | None = None,
        mocap_quat: ArrayLike | None = None,
    ) -> np.ndarray:
        """Render a block of frames into one array.

        Args: as :meth:`iter_frames`.

        Returns:
            ``(n_frames, n_cameras, H, W, 3)`` uint8 RGB on the host.

        Raises:
            LayoutMismatchError: if the shapes do not fit the model or each other.
        """
        n_frames = _check_block(self.model, qpos, mocap_pos, mocap_quat)
        height, width = self.size
        frames = np.empty((n_frames, len(self._camera_ids), height, width, 3), np.uint8)
        try:
            for k in range(n_frames):
                self._draw(
                    np.asarray(qpos[k]),  # type: ignore[index]
                    None if mocap_pos is None else np.asarray(mocap_pos[k]),  # type: ignore[index]
                    None if mocap_quat is None else np.asarray(mocap_quat[k]),  # type: ignore[index]
                    frames[k],
                )
        finally:
            _release_context(self._backend)
        return frames


def _release_context(backend: str) -> None:
    """Make no OpenGL context current in this thread, where contexts are EGL's (see the
    module's docstring); other backends are left as they are."""
    if backend != "egl":
        return
    from OpenGL import EGL  # the renderer's context made MuJoCo pick PyOpenGL's EGL platform

    if EGL.eglGetCurrentContext():
        EGL.eglMakeCurrent(EGL.eglGetCurrentDisplay(), EGL.EGL_NO_SURFACE, EGL.EGL_NO_SURFACE,
                           EGL.EGL_NO_CONTEXT)


def _segmentation_pass(renderer: mujoco.Renderer) -> np.ndarray:
    """One ``render()`` in segmentation mode: ``(H, W, 2)`` int32 (object id, object type),
    ``(-1, -1)`` where nothing is drawn."""
    renderer.enable_segmentation_rendering()
    try:
        return renderer.render()
    finally:
        renderer.disable_segmentation_rendering()


def _fit_buffer(
    model: mujoco.MjModel, size: tuple[int, int], enlarge: bool
) -> mujoco.MjModel:
    """A copy of ``model`` whose offscreen framebuffer is exactly ``size``.

    MuJoCo clears, and resolves the multisampled, whole offscreen buffer for every
    frame, however small the viewport: with flygym's 2048 x 2048 buffer and 4x
    multisampling that is 16 million samples per frame. The pixels inside the viewport
    do not depend on the buffer's size (tested bit for bit, NeuroMechFly included), so
    replay renders with a buffer the size of its frames: measured on 2 cores with
    Mesa, NeuroMechFly 240x320, one rasterizer thread, 7.3 -> 8.6 frames/s.
    """
    height, width = size
    buffer = (model.vis.global_.offheight, model.vis.global_.offwidth)
    if buffer == (height, width):
        return model
    if (height > buffer[0] or width > buffer[1]) and not enlarge:
        raise FrameSizeError(
            f"Frames of (height, width)={size!r} do not fit the model's offscreen "
            f"framebuffer {buffer!r}. Raise it in the MJCF with "
            f'<visual><global offwidth="{max(width, buffer[1])}" '
            f'offheight="{max(height, buffer[0])}"/></visual>, pass a smaller size, '
            "or pass enlarge_buffer=True."
        )
    fitted = copy.copy(model)
    fitted.vis.global_.offheight = height
    fitted.vis.global_.offwidth = width
    return fitted


def _check_block(
    model: mujoco.MjModel,
    qpos: ArrayLike,
    mocap_pos: ArrayLike | None,
    mocap_quat: ArrayLike | None,
) -> int:
    shape = tuple(np.shape(qpos))
    if len(shape) != 2 or shape[1] != model.nq:
        raise LayoutMismatchError(
            f"qpos has shape {shape!r}; expected (n_frames, nq={model.nq}). "
            "Pass the frames of one world with the model they were recorded with."
        )
    for name, values, tail in (("mocap_pos", mocap_pos, 3), ("mocap_quat", mocap_quat, 4)):
        if values is None:
            continue
        expected = (shape[0], model.nmocap, tail)
        if tuple(np.shape(values)) != expected:
            raise LayoutMismatchError(
                f"{name} has shape {tuple(np.shape(values))!r}; expected {expected!r} "
                f"(n_frames of qpos, nmocap={model.nmocap}, {tail})."
            )
    return shape[0]


def headless_renderer(
    model: mujoco.MjModel, size: tuple[int, int], *, max_geom: int = 10000
) -> mujoco.Renderer:
    """A ``mujoco.Renderer`` on :func:`flyarchive.config.gl_backend` now, whatever the import order.

    That is ``MUJOCO_GL`` when set, else ``egl`` on Linux: a machine without a display
    renders with EGL (Mesa without a GPU) although nobody set ``MUJOCO_GL``.

    Use it for live rendering that must match replay bit for bit (same GL backend).

    Args:
        model: The compiled model; its offscreen framebuffer must hold ``size``.
        size: ``(height, width)`` in pixels.
        max_geom: Capacity of the scene.

    Raises:
        RenderBackendError: if no OpenGL context can be created; the message says how to
            set ``MUJOCO_GL`` and what to install.
    """
    backend = gl_backend()
    try:
        with _context_lock, _gl_backend(backend):
            return mujoco.Renderer(model, size[0], size[1], max_geom=max_geom)
    except (RenderBackendError, FrameSizeError):
        raise
    except Exception as err:  # EGL/OSMesa/GLFW failures come as many types
        raise RenderBackendError(_backend_hint(backend, err)) from err


@contextmanager
def _gl_backend(backend: str) -> Iterator[None]:
    """Make ``mujoco.Renderer`` create its context with ``backend`` if MuJoCo chose another.

    MuJoCo binds its GL context class when ``mujoco`` is imported; when that happened
    before ``MUJOCO_GL`` was set, swap the class for the duration of one construction.
    """
    from mujoco.rendering.classic import gl_context

    chosen = getattr(gl_context, "GLContext", None)
    wanted_module = f"mujoco.{backend}"
    if backend not in _HEADLESS_BACKENDS or getattr(chosen, "__module__", "") == wanted_module:
        yield
        return
    module = importlib.import_module(wanted_module)
    gl_context.GLContext = module.GLContext
    try:
        yield
    finally:
        gl_context.GLContext = chosen


def _backend_hint(backend: str, err: BaseException) -> str:
    return (
        f"Cannot create an OpenGL context for rendering with MUJOCO_GL={backend!r}: "
        f"{type(err).__name__}: {str(err).rstrip('.')}. "
        "On a machine without a display set MUJOCO_GL=egl (needs libEGL: "
        "apt-get install libegl1 libgl1-mesa-dri, or the NVIDIA driver on a GPU machine) "
        "or MUJOCO_GL=osmesa with PYOPENGL_PLATFORM=osmesa (apt-get install libosmesa6), "
        "in the environment before Python starts. With several GPUs, MUJOCO_EGL_DEVICE_ID "
        "picks one."
    )

"""Batch replay with mujoco-warp's ray-traced renderer (GPU, or Warp's CPU device).

States from any (world, frame) pairs are packed into one batch of ``B`` render
worlds. Per batch: one host-to-device copy of the packed states, position-only
kinematics on the device, a BVH refit, one render, RGB packed to ``uint8`` on the
device, and one device-to-host copy (into pinned host memory on CUDA).

On CUDA, :meth:`WarpBatchRenderer.submit` queues all of that and returns at once:
the next batch is queued while the previous one renders, and the frames of a batch
are copied to the host on a second stream while the next one renders, so the GPU
never waits for the host between batches.

This module imports ``warp`` and ``mujoco_warp`` at import time; ``import
flyarchive`` does not import it.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import mujoco
import numpy as np

from flyarchive import config
from flyarchive.errors import (
    LayoutMismatchError,
    NonFiniteStateError,
    OptionsError,
    SelectionError,
)
from flyarchive.models import camera_ids
from flyarchive.replay.frames import PIXEL_FORMATS, frame_shape, parse_frame_size
from flyarchive.replay.warp_model import prepare_for_batch_rendering
from flyarchive.schema import finite_frames
from flyarchive.warp_log import import_mujoco_warp, import_warp

_WHAT = "Rendering with mujoco-warp (flyarchive.replay.warp)"
wp = import_warp(_WHAT)
mjw = import_mujoco_warp(_WHAT)

from flyarchive.replay.warp_kernels import (  # noqa: E402  (after the check that warp is there)
    packed_rgb_to_i420,
    packed_rgb_to_uint8,
    scatter_mocap,
    scatter_qpos,
)

__all__ = ["PendingBatch", "WarpBatchRenderer", "prepare_for_batch_rendering"]


class PendingBatch:
    """The frames of a submitted batch, on their way to a host buffer.

    Returned by :meth:`WarpBatchRenderer.submit`; :meth:`wait` returns them.
    """

    def __init__(self, frames: np.ndarray, event: Any = None) -> None:
        self._frames = frames
        self._event = event

    @property
    def n(self) -> int:
        """States in the batch."""
        return len(self._frames)

    def wait(self) -> np.ndarray:
        """Block until the frames are on the host; ``(n, n_cameras, *frame)`` uint8.

        The array is a view of the host buffer the batch was submitted to: valid until
        that buffer is submitted to again.
        """
        if self._event is not None:
            wp.synchronize_event(self._event)
            self._event = None
        return self._frames


class WarpBatchRenderer:
    """Render batches of recorded states with mujoco-warp's batch renderer.

    Holds a mujoco-warp ``Model``, a ``Data`` with ``nworld=batch_worlds`` and a
    render context on one Warp device, plus host staging buffers. Not thread-safe:
    one renderer per thread.

    Args:
        model: The compiled model the archive was recorded with (host). It is not
            modified; a copy is prepared with :func:`prepare_for_batch_rendering`.
        cameras: Camera name, or names, to render, in output order.
        size: Frame size ``(height, width)`` in pixels, the same for every camera.
        batch_worlds: ``B``, how many states one :meth:`render_batch` call renders.
            Device memory grows linearly with it.
        device: Warp device (``"cuda:0"``, ``"cpu"``...). ``None`` uses Warp's
            default device (the first GPU when there is one, else the CPU).
        host_buffers: Pinned host buffers for frames. 1 (default): each
            :meth:`render_batch` returns a new array. ``k > 1``: it returns a view of
            buffer ``i % k``, valid until ``k`` more batches are rendered (no host copy;
            for pipelines that keep at most ``k - 1`` batches in flight).
            :meth:`submit` names the buffer of each batch itself.
        pixel_format: ``"rgb24"`` (default): frames ``(H, W, 3)`` RGB. ``"yuv420p"``:
            frames ``(H * 3 // 2, W)`` planar I420 (BT.601 limited range), converted
            on the device: half the bytes to copy, and what x264 encodes (see
            :class:`flyarchive.video.VideoWriter`); needs even sizes.

    Raises:
        CameraNotFoundError: A camera is not in the model.
        FrameSizeError: ``size`` is not two positive integers (even for yuv420p).
        OptionsError: ``batch_worlds`` is not positive, or an unknown ``pixel_format``.
    """

    def __init__(
        self,
        model: mujoco.MjModel,
        cameras: str | Sequence[str],
        size: tuple[int, int] = (240, 320),
        *,
        batch_worlds: int = 64,
        device: str | None = None,
        host_buffers: int = 1,
        pixel_format: str = "rgb24",
    ) -> None:
        self._camera_names = _parse_cameras(model, cameras)
        if pixel_format not in PIXEL_FORMATS:
            raise OptionsError(f"pixel_format={pixel_format!r} is not one of {PIXEL_FORMATS}.")
        self._pixel_format = pixel_format
        if int(host_buffers) < 1:
            raise OptionsError(f"host_buffers={host_buffers!r} must be at least 1.")
        self._n_host = int(host_buffers)
        self._next_host = 0
        # I420 needs even sides: a FrameSizeError naming the nearest even sizes.
        self._size = parse_frame_size(size, even=pixel_format == "yuv420p")
        if int(batch_worlds) < 1:
            raise OptionsError(
                f"batch_worlds={batch_worlds!r} cannot hold a state. Pass a positive integer."
            )
        self._batch_worlds = int(batch_worlds)
        self._model = prepare_for_batch_rendering(model)
        self._nq = model.nq
        self._nmocap = model.nmocap
        self._nstate = model.nq + 7 * model.nmocap
        self._device = wp.get_device(device)
        with wp.ScopedDevice(self._device):
            self._build_device_state()
        # FLYARCHIVE_CUDA_GRAPH=0 launches kernel by kernel on CUDA too (for comparison).
        self._use_graph = self._device.is_cuda and config.cuda_graph()
        self._graphs: dict[int, Any] = {}  # per device output slot
        self._saw_full_batch = False  # the first full batch runs kernel by kernel
        self._turn = 0  # the staging / output slot of the next batch
        self._default_state = _default_state(self._model)

    # -- public API --------------------------------------------------------------

    @property
    def default_state(self) -> np.ndarray:
        """``qpos0`` then the model's mocap positions and orientations, float32 ``(nstate,)``."""
        return self._default_state

    @property
    def camera_names(self) -> tuple[str, ...]:
        """Names of the rendered cameras, in the order of the output's camera axis."""
        return self._camera_names

    @property
    def size(self) -> tuple[int, int]:
        """Frame size ``(height, width)`` in pixels."""
        return self._size

    @property
    def pixel_format(self) -> str:
        """``"rgb24"`` or ``"yuv420p"``: the layout of the frames :meth:`render_batch` returns."""
        return self._pixel_format

    @property
    def batch_worlds(self) -> int:
        """``B``: the most states one :meth:`render_batch` call takes."""
        return self._batch_worlds

    @property
    def device(self) -> str:
        """The Warp device the renderer lives on, e.g. ``"cuda:0"`` or ``"cpu"``."""
        return str(self._device)

    def render_batch(
        self,
        qpos: np.ndarray,
        mocap_pos: np.ndarray | None = None,
        mocap_quat: np.ndarray | None = None,
    ) -> np.ndarray:
        """Render up to ``B`` states, from any (world, frame) pairs, in one batch.

        Args:
            qpos: Host array ``(n, nq)``, float32 or float64, ``1 <= n <= B``.
            mocap_pos: Host array ``(n, nmocap, 3)`` in the model's length unit
                (NeuroMechFly: millimetres), or ``None`` for the
                model's mocap body positions.
            mocap_quat: Host array ``(n, nmocap, 4)``, MuJoCo order ``w, x, y, z``, or
                ``None`` for the model's mocap body orientations.

        Returns:
            A new host array ``(n, n_cameras, H, W, 3)`` of ``uint8`` RGB (for
            ``"yuv420p"``: ``(n, n_cameras, H * 3 // 2, W)`` I420), row 0 at the top
            of the image; frame ``i`` shows state ``i``. A partial batch
            (``n < B``) costs a full one: the other ``B - n`` render worlds keep
            their previous (valid) states and their frames are not copied back.

        Raises:
            LayoutMismatchError: An array's trailing shape does not fit the model.
            SelectionError: ``n`` is 0 or larger than ``B``.
            NonFiniteStateError: A state holds NaN or infinity.
        """
        buffer = self._next_host
        frames = self.submit(qpos, mocap_pos, mocap_quat, buffer=buffer).wait()
        if self._n_host == 1:
            return frames.copy()
        self._next_host = (buffer + 1) % self._n_host
        return frames  # a view of a pinned buffer, reused host_buffers batches later

    def submit(
        self,
        qpos: np.ndarray,
        mocap_pos: np.ndarray | None = None,
        mocap_quat: np.ndarray | None = None,
        *,
        buffer: int = 0,
    ) -> PendingBatch:
        """Queue the rendering of up to ``B`` states; their frames go to host buffer ``buffer``.

        On CUDA this returns once the work is queued: the states are copied, so the
        arrays passed may change at once; the frames are copied to the host on a second
        stream while the next batch renders. Submit the next batch before waiting for
        this one to keep the GPU busy. On Warp's CPU device the work is done on return.

        Args: as :meth:`render_batch`, and
            buffer: Which of the ``host_buffers`` pinned buffers receives the frames.
                The caller owns the buffers: do not submit to a buffer whose frames
                are still in use.

        Returns:
            A :class:`PendingBatch`; its ``wait()`` returns the frames as
            :meth:`render_batch` does (a view of the buffer).

        Raises:
            As :meth:`render_batch`; ``OptionsError`` for a buffer index out of range.
        """
        if not 0 <= buffer < self._n_host:
            raise OptionsError(f"buffer={buffer!r} is not one of the {self._n_host} host buffers.")
        slot = self._turn
        self._turn = (slot + 1) % len(self._states_hosts)
        n = self._upload(qpos, mocap_pos, mocap_quat, slot)
        host = self._rgb_hosts[buffer]
        if host is None:  # filled by copies: no need to zero it
            host = self._rgb_hosts[buffer] = wp.empty(
                self._host_shape, dtype=wp.uint8, device="cpu", pinned=self._device.is_cuda)
        count = n * self._rgb_devices[slot].size // self._batch_worlds
        frames = host.numpy()[:n].reshape(n, len(self._camera_names),
                                          *frame_shape(self._size, self._pixel_format))
        with wp.ScopedDevice(self._device):
            if not self._device.is_cuda:
                self._launch(n, slot)
                wp.copy(host, self._rgb_devices[slot], count=count)
                return PendingBatch(frames)
            stream = self._device.stream
            if self._copied[slot] is not None:  # the last copy out of this slot's pixels
                stream.wait_event(self._copied[slot])
            self._launch(n, slot)
            rendered = stream.record_event()
            self._copy_stream.wait_event(rendered)
            wp.copy(host, self._rgb_devices[slot], count=count, stream=self._copy_stream)
            self._copied[slot] = self._copy_stream.record_event()
            return PendingBatch(frames, self._copied[slot])

    def geom_poses(
        self,
        qpos: np.ndarray,
        mocap_pos: np.ndarray | None = None,
        mocap_quat: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Run the device kinematics of :meth:`render_batch` and return geom poses.

        Args: as :meth:`render_batch`.

        Returns:
            ``geom_xpos`` float32 ``(n, ngeom, 3)`` in the model's length unit
            (NeuroMechFly: millimetres) and ``geom_xmat``
            float32 ``(n, ngeom, 3, 3)``, host arrays, as ``mujoco.mj_kinematics``
            computes them.
        """
        self.synchronize()  # nothing queued may still read the staging buffer
        n = self._upload(qpos, mocap_pos, mocap_quat, 0)
        with wp.ScopedDevice(self._device):
            self._unpack_states(n)
            self._kinematics()
            xpos = self._data.geom_xpos.numpy()[:n]
            xmat = self._data.geom_xmat.numpy()[:n]
        return xpos.copy(), xmat.reshape(n, -1, 3, 3).copy()

    def render_resident(self) -> None:
        """Kinematics, BVH refit and render of the ``B`` states already on the device.

        No host transfer and no ``uint8`` conversion: the raw rendering cost, for
        benchmarks. The packed result stays in the render context.
        """
        with wp.ScopedDevice(self._device):
            self._kinematics()
            mjw.refit_bvh(self._warp_model, self._data, self._render_context)
            mjw.render(self._warp_model, self._data, self._render_context)

    def synchronize(self) -> None:
        """Wait until the device has finished all work queued by this renderer."""
        wp.synchronize_device(self._device)

    @property
    def graph_captured(self) -> bool:
        """Whether full batches replay a captured CUDA graph (from the second one on)."""
        return bool(self._graphs)

    # -- internals ---------------------------------------------------------------

    def _build_device_state(self) -> None:
        m = self._model
        b = self._batch_worlds
        height, width = self._size
        ncam = len(self._camera_names)
        pinned = self._device.is_cuda
        with warnings.catch_warnings():
            # Collision warnings are irrelevant: replay never collides.
            warnings.filterwarnings("ignore", message=".*MULTICCD.*", category=UserWarning)
            self._warp_model = mjw.put_model(m)
        self._data = mjw.put_data(m, mujoco.MjData(m), nworld=b, nconmax=0, njmax=0)
        camera = mujoco.mjtObj.mjOBJ_CAMERA
        cam_ids = [mujoco.mj_name2id(m, camera, name) for name in self._camera_names]
        self._render_context = mjw.create_render_context(
            m,
            nworld=b,
            cam_res=(width, height),  # mujoco-warp takes (width, height)
            render_rgb=True,
            render_depth=False,
            render_seg=False,
            cam_active=cam_ids,
        )
        # Two of each on CUDA: batch k + 1 is staged and rendered while batch k's
        # states may still be on their way up and its pixels on their way down.
        slots = 2 if self._device.is_cuda else 1
        self._states_hosts = [
            wp.zeros((b, self._nstate), dtype=wp.float32, device="cpu", pinned=pinned)
            for _ in range(slots)
        ]
        self._staged: list[Any] = [None] * slots  # event: a slot's states are on the device
        self._states_device = wp.zeros((b, self._nstate), dtype=wp.float32)
        shape = ((b, ncam, height * width, 3) if self._pixel_format == "rgb24"
                 else (b, ncam, height * width * 3 // 2))
        self._rgb_devices = [wp.zeros(shape, dtype=wp.uint8) for _ in range(slots)]
        self._copied: list[Any] = [None] * slots  # event: a slot's pixels reached the host
        self._copy_stream = wp.Stream(self._device) if self._device.is_cuda else None
        # Pinned on first use: pinning costs ~0.7 s/GB, and a buffer first used by
        # batch k is pinned while the GPU renders batch k - 1.
        self._rgb_hosts: list[Any] = [None] * self._n_host
        self._host_shape = shape

    def _upload(
        self,
        qpos: np.ndarray,
        mocap_pos: np.ndarray | None,
        mocap_quat: np.ndarray | None,
        slot: int,
    ) -> int:
        """Pack states into staging buffer ``slot`` and queue one copy to the device."""
        qpos = np.asarray(qpos)
        n = _parse_batch(qpos, self._nq, self._batch_worlds)
        if self._staged[slot] is not None:  # the slot's last upload must have left
            wp.synchronize_event(self._staged[slot])
            self._staged[slot] = None
        staging = self._states_hosts[slot].numpy()
        nq, nmocap = self._nq, self._nmocap
        staging[:n] = self._default_state
        staging[:n, :nq] = qpos
        if mocap_pos is not None:
            _check_trailing_shape("mocap_pos", mocap_pos, (n, nmocap, 3))
            staging[:n, nq : nq + 3 * nmocap] = np.asarray(mocap_pos).reshape(n, -1)
        if mocap_quat is not None:
            _check_trailing_shape("mocap_quat", mocap_quat, (n, nmocap, 4))
            staging[:n, nq + 3 * nmocap :] = np.asarray(mocap_quat).reshape(n, -1)
        finite = finite_frames(staging[:n])
        if not finite.all():
            bad = int(np.flatnonzero(~finite)[0])
            raise NonFiniteStateError(
                f"State {bad} of the batch holds NaN or infinity (in float32). "
                "Replay cannot place the model; drop or repair that frame."
            )
        wp.copy(self._states_device, self._states_hosts[slot], count=n * self._nstate)
        if self._device.is_cuda:
            self._staged[slot] = self._device.stream.record_event()
        return n

    def _launch(self, n: int, slot: int) -> None:
        """Queue unpacking, kinematics, refit, render and pixel conversion of ``n`` states.

        On CUDA, full batches replay a CUDA graph (one per output slot) captured from
        the second full batch on: one launch instead of hundreds, so a busy host
        (encoders on every core) cannot stall the GPU between kernel launches.
        Partial batches, and Warp's CPU device, launch kernel by kernel.
        """
        if not (self._use_graph and n == self._batch_worlds):
            self._queue_work(n, slot)
            return
        if slot not in self._graphs and self._saw_full_batch:
            with wp.ScopedCapture(device=self._device) as capture:
                self._queue_work(n, slot)
            self._graphs[slot] = capture.graph
        self._saw_full_batch = True
        if slot in self._graphs:
            wp.capture_launch(self._graphs[slot])
        else:
            self._queue_work(n, slot)  # the first full batch: allocations and module loads

    def _queue_work(self, n: int, slot: int) -> None:
        self._unpack_states(n)
        self.render_resident()
        self._convert_pixels(n, self._rgb_devices[slot])

    def _unpack_states(self, n: int) -> None:
        wp.launch(scatter_qpos, dim=(n, self._nq), inputs=[self._states_device, self._data.qpos])
        if self._nmocap:
            wp.launch(
                scatter_mocap,
                dim=(n, self._nmocap),
                inputs=[self._states_device, self._nq, self._nmocap],
                outputs=[self._data.mocap_pos, self._data.mocap_quat],
            )

    def _kinematics(self) -> None:
        m, d = self._warp_model, self._data
        mjw.kinematics(m, d)
        mjw.com_pos(m, d)  # subtree_com, needed by cameras that track a centre of mass
        mjw.camlight(m, d)
        if self._model.nflex:
            mjw.flex(m, d)

    def _convert_pixels(self, n: int, out: Any) -> None:
        height, width = self._size
        ncam = len(self._camera_names)
        rc = self._render_context
        if self._pixel_format == "rgb24":
            wp.launch(packed_rgb_to_uint8, dim=(n, ncam, height * width),
                      inputs=[rc.rgb_data, rc.rgb_adr], outputs=[out])
        else:
            wp.launch(packed_rgb_to_i420, dim=(n, ncam, height * width // 4),
                      inputs=[rc.rgb_data, rc.rgb_adr, width, height],
                      outputs=[out])


def _parse_cameras(model: mujoco.MjModel, cameras: str | Sequence[str]) -> tuple[str, ...]:
    camera_ids(model, cameras)  # raises CameraNotFoundError with the model's cameras
    return (cameras,) if isinstance(cameras, str) else tuple(cameras)


def _parse_batch(qpos: np.ndarray, nq: int, batch_worlds: int) -> int:
    if qpos.ndim != 2 or qpos.shape[1] != nq:
        raise LayoutMismatchError(
            f"qpos has shape {qpos.shape!r}; the model needs (n, nq) with nq={nq}. "
            "Pass one row per state, recorded with this model."
        )
    n = qpos.shape[0]
    if not 1 <= n <= batch_worlds:
        raise SelectionError(
            f"A batch of {n} states was asked for; this renderer takes 1 to {batch_worlds}. "
            "Split the states into batches of at most batch_worlds, or build a larger renderer."
        )
    return n


def _check_trailing_shape(name: str, array: np.ndarray, expected: tuple[int, ...]) -> None:
    shape = np.shape(array)
    if tuple(shape) != expected:
        raise LayoutMismatchError(
            f"{name} has shape {tuple(shape)!r}; expected {expected!r} (n, nmocap, xyz/wxyz). "
            f"Pass one row per qpos row, or None for the model's mocap poses."
        )


def _default_state(model: mujoco.MjModel) -> np.ndarray:
    """``qpos0`` and the model's mocap poses, packed as a float32 row ``(nstate,)``."""
    data = mujoco.MjData(model)
    return np.concatenate(
        [data.qpos, data.mocap_pos.ravel(), data.mocap_quat.ravel()]
    ).astype(np.float32)

"""Batch replay with mujoco-warp's ray-traced renderer (GPU, or Warp's CPU device).

States from any (world, frame) pairs are packed into one batch of ``B`` render
worlds. Per batch: one host-to-device copy of the packed states, position-only
kinematics on the device, a BVH refit, one render, then on the device text burnt in,
RGB packed to ``uint8`` or I420 (or tiled into mosaic frames), depth and segmentation
packed to 16-bit maps (:mod:`flyarchive.replay.warp_compose`), and one device-to-host
copy per output (into pinned host memory on CUDA).

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
from flyarchive.errors import OptionsError
from flyarchive.replay.sizes import frame_shape
from flyarchive.replay.output_kinds import (
    check_segmentable,
    counts_to_depth,
    counts_to_ids,
    default_depth_scale,
    map_outputs,
    parse_depth_scale,
    parse_outputs,
)
from flyarchive.replay.warp_rows import (
    PendingBatch,
    StateRows,
    parse_batch,
    parse_cameras,
    parse_mosaic,
    parse_sizes,
)
from flyarchive.replay.warp_model import prepare_for_batch_rendering
from flyarchive.warp_log import import_mujoco_warp, import_warp

_WHAT = "Rendering with mujoco-warp (flyarchive.replay.warp_frames)"
wp = import_warp(_WHAT)
mjw = import_mujoco_warp(_WHAT)

from flyarchive.replay.warp_compose import Composer  # noqa: E402  (after the check that warp is there)
from flyarchive.replay.warp_kernels import unpack_states  # noqa: E402


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
        outputs: Names from :data:`flyarchive.replay.output_kinds.OUTPUTS`: RGB frames, and
            depth and segmentation maps packed to 16-bit counts on the device
            (:attr:`PendingBatch.maps`, :meth:`render_outputs`).
        depth_scale: Model length units per depth count; None: the model's far plane
            / 65534 (:func:`flyarchive.replay.output_kinds.default_depth_scale`).
        mosaic: ``(rows, cols)``: each batch's states are tiles of mosaic frames (slot
            ``s`` is tile ``s % (rows * cols)`` of frame ``s // (rows * cols)``), converted
            to I420 straight into one ``(rows * H * 3 // 2, cols * W)`` frame per mosaic
            frame on the device. Needs ``pixel_format="yuv420p"``, RGB only, and
            ``batch_worlds`` a multiple of ``rows * cols``.
        text_chars: Characters of text burnt into each frame (:meth:`submit`'s
            ``texts``), on the device before any conversion; 0: no text.

    Attributes:
        outputs: What the renderer makes, in :data:`~flyarchive.replay.output_kinds.OUTPUTS` order.
        depth_scale: Model length units per depth count.
        mosaic: ``(rows, cols)`` of a mosaic renderer, else None.

    Raises:
        CameraNotFoundError: A camera is not in the model.
        FrameSizeError: ``size`` is not two positive integers (even for yuv420p).
        OptionsError: ``batch_worlds`` is not positive, an unknown ``pixel_format``, a
            mosaic that does not fit the other options, or text without RGB.
        RenderOptionsError: an unknown output or a depth scale that is not positive.
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
        outputs: Sequence[str] = ("rgb",),
        depth_scale: float | None = None,
        mosaic: tuple[int, int] | None = None,
        text_chars: int = 0,
    ) -> None:
        self._camera_names = parse_cameras(model, cameras)
        self.outputs: tuple[str, ...] = parse_outputs(outputs)
        self._maps = map_outputs(self.outputs)
        if "segmentation" in self.outputs:
            check_segmentable(model)
        self.depth_scale: float = parse_depth_scale(depth_scale) or default_depth_scale(model)
        self._pixel_format = pixel_format
        self._size, self._batch_worlds, self._n_host = parse_sizes(
            size, batch_worlds, host_buffers, pixel_format)
        self._next_host = 0
        self.mosaic: tuple[int, int] | None = parse_mosaic(
            mosaic, self._batch_worlds, pixel_format, self.outputs)
        self._tiles = 1 if self.mosaic is None else self.mosaic[0] * self.mosaic[1]
        self._model = prepare_for_batch_rendering(model)
        self._nq = model.nq
        self._nmocap = model.nmocap
        self._rows = StateRows(model, mosaic=self.mosaic is not None, text_chars=text_chars,
                               rgb="rgb" in self.outputs)
        self._device = wp.get_device(device)
        with wp.ScopedDevice(self._device):
            self._build_device_state()
        # FLYARCHIVE_CUDA_GRAPH=0 launches kernel by kernel on CUDA too (for comparison).
        self._use_graph = self._device.is_cuda and config.cuda_graph()
        self._graphs: dict[int, Any] = {}  # per device output slot
        self._saw_full_batch = False  # the first full batch runs kernel by kernel
        self._turn = 0  # the staging / output slot of the next batch

    @property
    def default_state(self) -> np.ndarray:
        """``qpos0`` then the model's mocap positions and orientations, float32 ``(nstate,)``."""
        return self._rows.default

    @property
    def camera_names(self) -> tuple[str, ...]:
        """Names of the rendered cameras, in the order of the output's camera axis."""
        return self._camera_names

    @property
    def size(self) -> tuple[int, int]:
        """Frame size ``(height, width)`` in pixels."""
        return self._size

    @property
    def model(self) -> mujoco.MjModel:
        """The host model it renders: the caller's, prepared for batch rendering (its
        ``vis`` and ``stat``, hence the far plane, unchanged)."""
        return self._model

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
        if "rgb" not in self.outputs:
            raise OptionsError("This renderer makes no RGB frames (outputs="
                               f"{self.outputs!r}); use render_outputs for its maps.")
        buffer = self._next_host
        frames = self.submit(qpos, mocap_pos, mocap_quat, buffer=buffer).wait()
        assert frames is not None
        if self._n_host == 1:
            return frames.copy()
        self._next_host = (buffer + 1) % self._n_host
        return frames  # a view of a pinned buffer, reused host_buffers batches later

    def render_outputs(
        self,
        qpos: np.ndarray,
        mocap_pos: np.ndarray | None = None,
        mocap_quat: np.ndarray | None = None,
        *,
        texts: Sequence[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Render up to ``B`` states and return every output, as new host arrays.

        Args: as :meth:`render_batch`, and ``texts`` as :meth:`submit`.

        Returns:
            ``{"rgb": frames as render_batch returns them, "depth": (n, n_cameras, H, W)
            float32 planar depth in model units (NaN: no hit), "segmentation": (n,
            n_cameras, H, W) int32 geom id (-1: no geom)}``, the keys of :attr:`outputs`
            only. Depth comes from the device's 16-bit counts, so it is a multiple of
            :attr:`depth_scale` (the stored values).
        """
        pending = self.submit(qpos, mocap_pos, mocap_quat, buffer=self._next_host, texts=texts)
        frames = pending.wait()
        out: dict[str, np.ndarray] = {} if frames is None else {"rgb": frames.copy()}
        for i, name in enumerate(self._maps):
            counts = pending.maps[:, :, i]  # type: ignore[index]
            out[name] = (counts_to_depth(counts, self.depth_scale) if name == "depth"
                         else counts_to_ids(counts))
        return out

    def submit(
        self,
        qpos: np.ndarray,
        mocap_pos: np.ndarray | None = None,
        mocap_quat: np.ndarray | None = None,
        *,
        buffer: int = 0,
        texts: Sequence[str] | None = None,
        valid: np.ndarray | None = None,
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
            texts: One text per state, burnt into its frames (every camera) at the top
                left (:mod:`flyarchive.replay.overlay_text`); needs ``text_chars > 0``;
                longer texts are cut. None: no text.
            valid: Mosaic renderers: bool ``(n,)``, False for a blank tile (black,
                whatever its state). None: every state shows.

        Returns:
            A :class:`PendingBatch`; its ``wait()`` returns the frames as
            :meth:`render_batch` does (a view of the buffer), then its ``maps`` hold the
            maps. In mosaic mode there are ``n // (rows * cols)`` frames.

        Raises:
            As :meth:`render_batch`; ``OptionsError`` for a buffer index out of range.
        """
        if not 0 <= buffer < self._n_host:
            raise OptionsError(f"buffer={buffer!r} is not one of the {self._n_host} host buffers.")
        slot = self._turn
        self._turn = (slot + 1) % len(self._states_hosts)
        n = self._upload(qpos, mocap_pos, mocap_quat, slot, texts, valid)
        frames, maps, copies = self._host_views(n, slot, buffer)
        with wp.ScopedDevice(self._device):
            if not self._device.is_cuda:
                self._launch(n, slot)
                for host, device, count in copies:
                    wp.copy(host, device, count=count)
                return PendingBatch(frames, maps=maps)
            stream = self._device.stream
            if self._copied[slot] is not None:  # the last copy out of this slot's pixels
                stream.wait_event(self._copied[slot])
            self._launch(n, slot)
            rendered = stream.record_event()
            self._copy_stream.wait_event(rendered)
            for host, device, count in copies:
                wp.copy(host, device, count=count, stream=self._copy_stream)
            self._copied[slot] = self._copy_stream.record_event()
            return PendingBatch(frames, self._copied[slot], maps, wp.synchronize_event)

    def _host_views(self, n: int, slot: int, buffer: int
                    ) -> tuple[np.ndarray | None, np.ndarray | None, list[tuple[Any, Any, int]]]:
        """Host buffer ``buffer``'s frames and maps views for ``n`` states, and the copies
        (host, device, count) that fill them from device slot ``slot``."""
        height, width = self._size
        ncam = len(self._camera_names)
        rows = n // self._tiles
        copies: list[tuple[Any, Any, int]] = []
        frames = maps = None
        if self._rgb_devices:
            host = self._host(self._rgb_hosts, buffer, self._host_shape, wp.uint8)
            device = self._rgb_devices[slot]
            copies.append((host, device, rows * device.size // device.shape[0]))
            frames = host.numpy()[:rows].reshape(rows, ncam, *self._frame_shape)
        if self._map_devices:
            device = self._map_devices[slot]
            host = self._host(self._map_hosts, buffer, device.shape, wp.uint16)
            copies.append((host, device, n * device.size // device.shape[0]))
            maps = host.numpy()[:n].reshape(n, ncam, len(self._maps), height, width)
        return frames, maps, copies

    def _host(self, hosts: list[Any], buffer: int, shape: tuple[int, ...], dtype: Any) -> Any:
        """Host buffer ``buffer`` of a kind, pinned on CUDA, made on first use (no need to
        zero it: it is filled by copies)."""
        if hosts[buffer] is None:
            hosts[buffer] = wp.empty(shape, dtype=dtype, device="cpu", pinned=self._device.is_cuda)
        return hosts[buffer]

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
            render_rgb="rgb" in self.outputs,
            render_depth="depth" in self.outputs,
            render_seg="segmentation" in self.outputs,
            cam_active=cam_ids,
        )
        # Two of each on CUDA: batch k + 1 is staged and rendered while batch k's
        # states may still be on their way up and its pixels on their way down.
        slots = 2 if self._device.is_cuda else 1
        width_rows = self._rows.width
        self._states_hosts = [
            wp.zeros((b, width_rows), dtype=wp.float32, device="cpu", pinned=pinned)
            for _ in range(slots)
        ]
        self._staged: list[Any] = [None] * slots  # event: a slot's states are on the device
        self._states_device = wp.zeros((b, width_rows), dtype=wp.float32)
        self._composer = Composer(self._size, ncam, self._rows, self._pixel_format,
                                  self.mosaic, self._maps, self.depth_scale)
        self._frame_shape = frame_shape(self._size, self._pixel_format)
        if self.mosaic is not None:
            rows, cols = self.mosaic
            self._frame_shape = frame_shape((rows * height, cols * width), self._pixel_format)
        shape = (b // self._tiles, ncam, int(np.prod(self._frame_shape)))
        if self._pixel_format == "rgb24":
            shape = (b, ncam, height * width, 3)
        has_rgb = "rgb" in self.outputs
        self._rgb_devices = [wp.zeros(shape, dtype=wp.uint8) for _ in range(slots)] if has_rgb else []
        map_shape = (b, ncam, len(self._maps), height * width)
        self._map_devices = ([wp.zeros(map_shape, dtype=wp.uint16) for _ in range(slots)]
                             if self._maps else [])
        self._copied: list[Any] = [None] * slots  # event: a slot's pixels reached the host
        self._copy_stream = wp.Stream(self._device) if self._device.is_cuda else None
        # Pinned on first use: pinning costs ~0.7 s/GB, and a buffer first used by
        # batch k is pinned while the GPU renders batch k - 1.
        self._rgb_hosts: list[Any] = [None] * self._n_host
        self._map_hosts: list[Any] = [None] * self._n_host
        self._host_shape = shape

    def _upload(
        self,
        qpos: np.ndarray,
        mocap_pos: np.ndarray | None,
        mocap_quat: np.ndarray | None,
        slot: int,
        texts: Sequence[str] | None = None,
        valid: np.ndarray | None = None,
    ) -> int:
        """Pack states into staging buffer ``slot`` and queue one copy to the device."""
        qpos = np.asarray(qpos)
        n = parse_batch(qpos, self._nq, self._batch_worlds, self._tiles)
        if self._staged[slot] is not None:  # the slot's last upload must have left
            wp.synchronize_event(self._staged[slot])
            self._staged[slot] = None
        staging = self._states_hosts[slot].numpy()
        self._rows.fill(staging, qpos, mocap_pos, mocap_quat, texts, valid)
        wp.copy(self._states_device, self._states_hosts[slot], count=n * self._rows.width)
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
        self._composer.launch(n, self._render_context, self._states_device,
                              self._rgb_devices[slot] if self._rgb_devices else None,
                              self._map_devices[slot] if self._map_devices else None)

    def _unpack_states(self, n: int) -> None:
        unpack_states(self._states_device, self._data, n, self._nq, self._nmocap)

    def _kinematics(self) -> None:
        m, d = self._warp_model, self._data
        mjw.kinematics(m, d)
        mjw.com_pos(m, d)  # subtree_com, needed by cameras that track a centre of mass
        mjw.camlight(m, d)
        if self._model.nflex:
            mjw.flex(m, d)

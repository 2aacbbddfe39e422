"""What one batch of the Warp batch renderer holds on the host: the packed state rows it
uploads (:class:`StateRows`), the frames and maps it returns (:class:`PendingBatch`), and
the checks of what a caller hands it. Host-only code (numpy); no ``warp`` import.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mujoco
import numpy as np

from flyarchive.errors import LayoutMismatchError, NonFiniteStateError, OptionsError, SelectionError
from flyarchive.models import camera_ids
from flyarchive.replay.overlay_text import text_codes
from flyarchive.replay.sizes import PIXEL_FORMATS, is_int, parse_frame_size
from flyarchive.schema import finite_frames


class PendingBatch:
    """The frames (and maps) of a submitted batch, on their way to host buffers.

    Returned by :meth:`flyarchive.replay.warp_frames.WarpBatchRenderer.submit`; :meth:`wait`
    returns the frames; :attr:`maps` holds the maps once :meth:`wait` has returned.
    """

    def __init__(self, frames: np.ndarray | None, event: Any = None,
                 maps: np.ndarray | None = None, synchronize: Any = None) -> None:
        self._frames = frames
        self._event = event
        self._maps = maps
        self._synchronize = synchronize

    @property
    def n(self) -> int:
        """Rows of frames in the batch (states; mosaic frames in mosaic mode)."""
        rows = self._frames if self._frames is not None else self._maps
        return 0 if rows is None else len(rows)

    def wait(self) -> np.ndarray | None:
        """Block until the frames and maps are on the host; the frames,
        ``(n, n_cameras, *frame)`` uint8 (None when RGB is not an output).

        The arrays are views of the host buffer the batch was submitted to: valid until
        that buffer is submitted to again.
        """
        if self._event is not None:
            self._synchronize(self._event)
            self._event = None
        return self._frames

    @property
    def maps(self) -> np.ndarray | None:
        """``(n, n_cameras, n_maps, H, W)`` uint16 counts (depth, then segmentation, of
        those asked for; :mod:`flyarchive.replay.output_kinds`), after :meth:`wait`; None when
        no map is an output."""
        return self._maps


class StateRows:
    """The columns of one render world's row in a batch's upload buffer.

    ``qpos`` (``nq``), mocap positions (``3 nmocap``) and orientations (``4 nmocap``),
    float32; then, in mosaic mode, 1.0 where the slot holds a state (0.0: a blank tile);
    then ``text_chars`` ASCII codes of the slot's text (0 after its end).
    """

    def __init__(self, model: mujoco.MjModel, *, mosaic: bool, text_chars: int,
                 rgb: bool = True) -> None:
        if not is_int(text_chars) or text_chars < 0 or (text_chars and not rgb):
            raise OptionsError(f"text_chars={text_chars!r} must be a whole number >= 0, and 0 "
                               "unless RGB is an output.")
        text_chars = int(text_chars)
        self.nq, self.nmocap = model.nq, model.nmocap
        self.nstate = model.nq + 7 * model.nmocap
        self.valid_col = self.nstate if mosaic else -1
        self.text_col = self.nstate + int(mosaic)
        self.text_chars = text_chars
        self.width = self.text_col + text_chars
        self.default = default_state(model)

    def fill(self, rows: np.ndarray, qpos: np.ndarray, mocap_pos: np.ndarray | None,
             mocap_quat: np.ndarray | None, texts: Sequence[str] | None,
             valid: np.ndarray | None) -> None:
        """Write ``n`` states and their extras into ``rows[:n]`` (host, float32)."""
        n, nq, nmocap = len(qpos), self.nq, self.nmocap
        rows[:n, :self.nstate] = self.default
        rows[:n, :nq] = qpos
        if mocap_pos is not None:
            check_trailing_shape("mocap_pos", mocap_pos, (n, nmocap, 3))
            rows[:n, nq:nq + 3 * nmocap] = np.asarray(mocap_pos).reshape(n, -1)
        if mocap_quat is not None:
            check_trailing_shape("mocap_quat", mocap_quat, (n, nmocap, 4))
            rows[:n, nq + 3 * nmocap:self.nstate] = np.asarray(mocap_quat).reshape(n, -1)
        finite = finite_frames(rows[:n, :self.nstate])
        if not finite.all():
            bad = int(np.flatnonzero(~finite)[0])
            raise NonFiniteStateError(
                f"State {bad} of the batch holds NaN or infinity (in float32). "
                "Replay cannot place the model; drop or repair that frame."
            )
        if self.valid_col >= 0:
            rows[:n, self.valid_col] = 1.0 if valid is None else np.asarray(valid, np.float32)
        if self.text_chars:
            if texts is not None and len(texts) != n:
                raise SelectionError(f"{len(texts)} texts were given for {n} states; give one per state.")
            rows[:n, self.text_col:] = 0.0 if texts is None else text_codes(texts, self.text_chars)
        elif texts is not None:
            raise OptionsError("Texts were given to a renderer made with text_chars=0; "
                               "make it with text_chars > 0 to burn text into frames.")


def parse_cameras(model: mujoco.MjModel, cameras: str | Sequence[str]) -> tuple[str, ...]:
    camera_ids(model, cameras)  # raises CameraNotFoundError with the model's cameras
    return (cameras,) if isinstance(cameras, str) else tuple(cameras)


def parse_mosaic(mosaic: Any, batch_worlds: int, pixel_format: str,
                 outputs: Sequence[str]) -> tuple[int, int] | None:
    """``(rows, cols)`` of a mosaic renderer, or None; checked against the other options.

    Raises:
        OptionsError: not two positive integers, frames that are not I420, outputs other
            than RGB, or a batch that does not hold whole mosaic frames.
    """
    if mosaic is None:
        return None
    if not (isinstance(mosaic, (tuple, list)) and len(mosaic) == 2 and all(
            is_int(v) and v >= 1 for v in mosaic)):
        raise OptionsError(f"mosaic must be (rows, cols), two positive integers, got {mosaic!r}.")
    rows, cols = int(mosaic[0]), int(mosaic[1])
    if pixel_format != "yuv420p" or tuple(outputs) != ("rgb",):
        raise OptionsError("A mosaic renderer makes I420 RGB frames only: pass "
                           "pixel_format='yuv420p' and outputs=('rgb',).")
    if batch_worlds % (rows * cols):
        raise OptionsError(
            f"batch_worlds={batch_worlds} does not hold whole {rows}x{cols} mosaic frames; pass "
            f"a multiple of {rows * cols}.")
    return rows, cols


def parse_sizes(size: Any, batch_worlds: Any, host_buffers: Any, pixel_format: str
                ) -> tuple[tuple[int, int], int, int]:
    """``(size, batch_worlds, host_buffers)`` of a renderer, checked: a frame size (even
    sides for I420), at least one state per batch and one host buffer.

    Raises:
        OptionsError: an unknown pixel format, or a count below 1.
        FrameSizeError: ``size`` is not two positive integers (even for ``"yuv420p"``; the
            message names the nearest even sizes).
    """
    if pixel_format not in PIXEL_FORMATS:
        raise OptionsError(f"pixel_format={pixel_format!r} is not one of {PIXEL_FORMATS}.")
    if int(host_buffers) < 1:
        raise OptionsError(f"host_buffers={host_buffers!r} must be at least 1.")
    size = parse_frame_size(size, even=pixel_format == "yuv420p")
    if int(batch_worlds) < 1:
        raise OptionsError(
            f"batch_worlds={batch_worlds!r} cannot hold a state. Pass a positive integer."
        )
    return size, int(batch_worlds), int(host_buffers)


def parse_batch(qpos: np.ndarray, nq: int, batch_worlds: int, tiles: int = 1) -> int:
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
    if n % tiles:
        raise SelectionError(
            f"A batch of {n} states does not fill whole mosaic frames of {tiles} tiles; pass a "
            "multiple of rows * cols (blank tiles as states with valid=False).")
    return n


def check_trailing_shape(name: str, array: np.ndarray, expected: tuple[int, ...]) -> None:
    shape = np.shape(array)
    if tuple(shape) != expected:
        raise LayoutMismatchError(
            f"{name} has shape {tuple(shape)!r}; expected {expected!r} (n, nmocap, xyz/wxyz). "
            f"Pass one row per qpos row, or None for the model's mocap poses."
        )


def default_state(model: mujoco.MjModel) -> np.ndarray:
    """``qpos0`` and the model's mocap poses, packed as a float32 row ``(nstate,)``."""
    data = mujoco.MjData(model)
    return np.concatenate(
        [data.qpos, data.mocap_pos.ravel(), data.mocap_quat.ravel()]
    ).astype(np.float32)

"""Warp kernels that compose what the batch renderer made, on its device: depth and
segmentation packed into 16-bit maps, and tiles converted to I420 straight into one mosaic
frame; :class:`Composer` launches them, and the overlay text's kernel
(:func:`flyarchive.replay.overlay_text.device_text_kernel`).

Each produces exactly what the host code does (:mod:`flyarchive.replay.output_kinds`,
:mod:`flyarchive.replay.mosaic_tiles`, :mod:`flyarchive.replay.overlay_text`), so the Warp
backends and the OpenGL backend compose alike. Per-slot inputs that change every batch
(whether a slot holds a state, the text of each slot) travel in extra columns of the batch's
state rows, uploaded with the states in one copy. This module imports ``warp``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flyarchive.replay.overlay_text import (
    CELL_H,
    CELL_W,
    GLYPHS,
    TEXT_X,
    TEXT_Y,
    device_text_kernel,
)
from flyarchive.warp_log import import_warp

wp = import_warp("Rendering with mujoco-warp (flyarchive.replay.warp_frames)")

from flyarchive.replay.warp_kernels import (  # noqa: E402
    bt601_u,
    bt601_v,
    bt601_y,
    channel,
    packed_rgb_to_i420,
    packed_rgb_to_uint8,
)

_GEOM = wp.constant(5)  # mujoco.mjtObj.mjOBJ_GEOM
_MAX_COUNT = wp.constant(65535.0)


@wp.kernel
def pack_maps(
    depth: wp.array2d(dtype=wp.float32),  # (B, sum of H*W), planar depth, model units, 0 = miss
    seg: wp.array2d(dtype=wp.vec2i),  # (B, sum of H*W), (object id, object type), -1 = miss
    depth_adr: wp.array(dtype=int),  # (n_cameras,) offset of each camera's depth
    seg_adr: wp.array(dtype=int),  # (n_cameras,) offset of each camera's segmentation
    inv_scale: float,  # depth counts per model length unit
    depth_slot: int,  # index of depth in the output's map axis; -1: not made
    seg_slot: int,  # index of segmentation in the output's map axis; -1: not made
    out: wp.array4d(dtype=wp.uint16),  # (B, n_cameras, n_maps, H*W), device
):
    """Depth to counts (0: no hit, else round(depth / scale) in 1..65535) and segmentation
    to geom id + 1 (0: background or not a geom), as the host's depth_to_counts and
    ids_to_counts."""
    world, cam, pixel = wp.tid()
    if depth_slot >= 0:
        d = depth[world, depth_adr[cam] + pixel]
        count = int(0)
        if d > 0.0:
            count = wp.max(int(wp.floor(wp.min(d * inv_scale + 0.5, _MAX_COUNT))), 1)
        out[world, cam, depth_slot, pixel] = wp.uint16(count)
    if seg_slot >= 0:
        s = seg[world, seg_adr[cam] + pixel]
        value = int(0)
        if s[1] == _GEOM:
            value = s[0] + 1
        out[world, cam, seg_slot, pixel] = wp.uint16(value)


@wp.kernel
def packed_rgb_to_i420_tiled(
    packed: wp.array2d(dtype=wp.uint32),  # (B, sum of H*W) ARGB; slot = frame * tiles + tile
    rgb_adr: wp.array(dtype=int),  # (n_cameras,)
    width: int,  # of a tile
    height: int,  # of a tile
    cols: int,
    tiles: int,  # rows * cols
    states: wp.array2d(dtype=wp.float32),  # (B, nstate); column valid_col: 1 = the slot holds a state
    valid_col: int,
    out: wp.array3d(dtype=wp.uint8),  # (B / tiles, n_cameras, rows*H * cols*W * 3/2) I420
):
    """The I420 conversion of :func:`flyarchive.replay.warp_kernels.packed_rgb_to_i420`,
    each tile written at its place in its mosaic frame; a slot without a state is black
    (luma 16, chroma 128). One thread per 2x2 block of a tile."""
    slot, cam, block = wp.tid()
    m = slot // tiles
    t = slot - m * tiles
    r = t // cols
    c = t - r * cols
    half = width // 2
    by = block // half
    bx = block - by * half
    big_w = cols * width
    plane = big_w * (tiles // cols) * height
    chroma = (r * height // 2 + by) * (big_w // 2) + c * half + bx
    valid = states[slot, valid_col] > 0.5
    base = rgb_adr[cam]
    r_sum = int(0)
    g_sum = int(0)
    b_sum = int(0)
    for dy in range(2):
        for dx in range(2):
            luma = int(16)
            if valid:
                value = packed[slot, base + (2 * by + dy) * width + 2 * bx + dx]
                red = channel(value, wp.uint32(16))
                green = channel(value, wp.uint32(8))
                blue = channel(value, wp.uint32(0))
                luma = bt601_y(red, green, blue)
                r_sum += red
                g_sum += green
                b_sum += blue
            out[m, cam, (r * height + 2 * by + dy) * big_w + c * width + 2 * bx + dx] = wp.uint8(luma)
    u = int(128)
    v = int(128)
    if valid:
        red = (r_sum + 2) >> 2
        green = (g_sum + 2) >> 2
        blue = (b_sum + 2) >> 2
        u = bt601_u(red, green, blue)
        v = bt601_v(red, green, blue)
    out[m, cam, plane + chroma] = wp.uint8(u)
    out[m, cam, plane + plane // 4 + chroma] = wp.uint8(v)


class Composer:
    """Launches the kernels that turn one render's output into a batch's frames and maps.

    Args:
        size: ``(H, W)`` of a camera's image (of a tile, in a mosaic).
        n_cameras: Cameras rendered.
        rows: The batch's :class:`~flyarchive.replay.warp_rows.StateRows` (where each
            slot's text and blank-tile flag are).
        pixel_format: ``"rgb24"`` or ``"yuv420p"`` frames.
        mosaic: ``(rows, cols)`` or None.
        maps: The map outputs, in storage order.
        depth_scale: Model units per depth count.
    """

    def __init__(self, size: tuple[int, int], n_cameras: int, rows: Any, pixel_format: str,
                 mosaic: tuple[int, int] | None, maps: Sequence[str], depth_scale: float) -> None:
        self._size, self._ncam, self._rows = size, n_cameras, rows
        self._pixel_format, self._mosaic = pixel_format, mosaic
        self._slots = [maps.index(n) if n in maps else -1 for n in ("depth", "segmentation")]
        self._inv_scale = 1.0 / depth_scale
        self._glyphs = wp.array(GLYPHS, dtype=wp.uint8) if rows.text_chars else None

    def launch(self, n: int, rc: Any, states: Any, frames: Any, maps: Any) -> None:
        """Queue the kernels for the first ``n`` slots on the current device.

        Args:
            n: Slots rendered.
            rc: The mujoco-warp render context, rendered.
            states: The batch's state rows on the device.
            frames: The device frame buffer to fill, or None (no RGB).
            maps: The device map buffer ``(B, n_cameras, n_maps, H*W)`` to fill, or None.
        """
        height, width = self._size
        rows = self._rows
        if frames is not None and rows.text_chars:
            wp.launch(device_text_kernel(),
                      dim=(n, self._ncam, rows.text_chars * CELL_W * CELL_H),
                      inputs=[self._glyphs, states, rows.text_col, rows.text_chars,
                              rc.rgb_adr, width, height, TEXT_X, TEXT_Y],
                      outputs=[rc.rgb_data])
        if frames is None:
            pass
        elif self._mosaic is not None:
            wp.launch(packed_rgb_to_i420_tiled, dim=(n, self._ncam, height * width // 4),
                      inputs=[rc.rgb_data, rc.rgb_adr, width, height, self._mosaic[1],
                              self._mosaic[0] * self._mosaic[1], states, rows.valid_col],
                      outputs=[frames])
        elif self._pixel_format == "rgb24":
            wp.launch(packed_rgb_to_uint8, dim=(n, self._ncam, height * width),
                      inputs=[rc.rgb_data, rc.rgb_adr], outputs=[frames])
        else:
            wp.launch(packed_rgb_to_i420, dim=(n, self._ncam, height * width // 4),
                      inputs=[rc.rgb_data, rc.rgb_adr, width, height], outputs=[frames])
        if maps is not None:
            wp.launch(pack_maps, dim=(n, self._ncam, height * width),
                      inputs=[rc.depth_data, rc.seg_data, rc.depth_adr, rc.seg_adr,
                              self._inv_scale, *self._slots],
                      outputs=[maps])

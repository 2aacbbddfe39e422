"""The Warp kernels of batch replay: recorded states into a ``Data``, and packed render
output into frames (RGB, or planar I420 for the encoder).

Each kernel runs on the renderer's Warp device over a batch of ``B`` render worlds;
:class:`flyarchive.replay.warp_frames.WarpBatchRenderer` launches them (the states' through
:func:`unpack_states`). This module imports ``warp``.
"""

from __future__ import annotations

from typing import Any

from flyarchive.warp_log import import_warp

wp = import_warp("Rendering with mujoco-warp (flyarchive.replay.warp_frames)")


@wp.kernel
def scatter_qpos(
    states: wp.array2d(dtype=wp.float32),  # (B, nstate), device
    qpos: wp.array2d(dtype=wp.float32),  # (B, nq), device
):
    world, i = wp.tid()
    qpos[world, i] = states[world, i]


@wp.kernel
def scatter_mocap(
    states: wp.array2d(dtype=wp.float32),  # (B, nstate), device
    nq: int,
    nmocap: int,
    mocap_pos: wp.array2d(dtype=wp.vec3),  # (B, nmocap), device
    mocap_quat: wp.array2d(dtype=wp.quat),  # (B, nmocap), device, MuJoCo order w,x,y,z
):
    world, k = wp.tid()
    p = nq + 3 * k
    q = nq + 3 * nmocap + 4 * k
    mocap_pos[world, k] = wp.vec3(states[world, p], states[world, p + 1], states[world, p + 2])
    # Stored component by component: mujoco-warp keeps MuJoCo's w,x,y,z order in wp.quat.
    mocap_quat[world, k] = wp.quat(
        states[world, q], states[world, q + 1], states[world, q + 2], states[world, q + 3]
    )


def unpack_states(states: wp.array2d, data: Any, n: int, nq: int, nmocap: int) -> None:
    """Launch the kernels that copy ``n`` packed state rows (``(B, nstate)`` float32,
    device) into ``data``'s ``qpos`` and mocap poses (a mujoco-warp ``Data``)."""
    wp.launch(scatter_qpos, dim=(n, nq), inputs=[states, data.qpos])
    if nmocap:
        wp.launch(scatter_mocap, dim=(n, nmocap), inputs=[states, nq, nmocap],
                  outputs=[data.mocap_pos, data.mocap_quat])


@wp.kernel
def packed_rgb_to_uint8(
    packed: wp.array2d(dtype=wp.uint32),  # (B, sum of H*W over cameras), ARGB, device
    rgb_adr: wp.array(dtype=int),  # (n_cameras,) offset of each camera's pixels
    out: wp.array4d(dtype=wp.uint8),  # (B, n_cameras, H*W, 3), device
):
    world, cam, pixel = wp.tid()
    value = packed[world, rgb_adr[cam] + pixel]
    out[world, cam, pixel, 0] = wp.uint8((value >> wp.uint32(16)) & wp.uint32(0xFF))
    out[world, cam, pixel, 1] = wp.uint8((value >> wp.uint32(8)) & wp.uint32(0xFF))
    out[world, cam, pixel, 2] = wp.uint8(value & wp.uint32(0xFF))


@wp.func
def channel(value: wp.uint32, shift: wp.uint32) -> int:
    """One 8-bit channel of a packed ARGB pixel (shift 16: red, 8: green, 0: blue)."""
    return int((value >> shift) & wp.uint32(0xFF))


@wp.func
def bt601_y(r: int, g: int, b: int) -> int:
    """Luma of 8-bit RGB, BT.601 limited range in 8-bit fixed point."""
    return ((66 * r + 129 * g + 25 * b + 128) >> 8) + 16


@wp.func
def bt601_u(r: int, g: int, b: int) -> int:
    """Blue-difference chroma of 8-bit RGB (BT.601 limited range)."""
    return ((-38 * r - 74 * g + 112 * b + 128) >> 8) + 128


@wp.func
def bt601_v(r: int, g: int, b: int) -> int:
    """Red-difference chroma of 8-bit RGB (BT.601 limited range)."""
    return ((112 * r - 94 * g - 18 * b + 128) >> 8) + 128


@wp.kernel
def packed_rgb_to_i420(
    packed: wp.array2d(dtype=wp.uint32),  # (B, sum of H*W over cameras), ARGB, device
    rgb_adr: wp.array(dtype=int),  # (n_cameras,) offset of each camera's pixels
    width: int,
    height: int,
    out: wp.array3d(dtype=wp.uint8),  # (B, n_cameras, H*W*3/2) planar I420, device
):
    """One thread per 2x2 block: four luma samples and one U and one V sample.

    BT.601 limited range in 8-bit fixed point; chroma from the mean RGB of the block
    (a box filter, as libyuv's ARGBToI420 does).
    """
    world, cam, block = wp.tid()
    half = width // 2
    by = block // half
    bx = block - by * half
    base = rgb_adr[cam]
    r_sum = int(0)
    g_sum = int(0)
    b_sum = int(0)
    for dy in range(2):
        for dx in range(2):
            pixel = (2 * by + dy) * width + 2 * bx + dx
            value = packed[world, base + pixel]
            r = channel(value, wp.uint32(16))
            g = channel(value, wp.uint32(8))
            b = channel(value, wp.uint32(0))
            out[world, cam, pixel] = wp.uint8(bt601_y(r, g, b))
            r_sum += r
            g_sum += g
            b_sum += b
    r = (r_sum + 2) >> 2
    g = (g_sum + 2) >> 2
    b = (b_sum + 2) >> 2
    plane = width * height
    out[world, cam, plane + block] = wp.uint8(bt601_u(r, g, b))
    out[world, cam, plane + plane // 4 + block] = wp.uint8(bt601_v(r, g, b))

"""Test support: tiny models and synthetic simulations for tests, examples and benchmarks.

Nothing here is needed to record or replay, and no product module imports it
(tests/test_layout_rules.py); it exists so that tests (and users' tests) need no large
model. This module and :mod:`~flyarchive.testing.fixtures` (tiny recordings, snapshots
of committed bytes) need only numpy and MuJoCo. Loaded only by tests, with pytest:

- :mod:`~flyarchive.testing.markers`: ``requires_warp`` and the other skip markers, and
  the Warp device of the Warp tests (``FLYARCHIVE_TEST_WARP_DEVICE``);
- :mod:`~flyarchive.testing.replay_suite`: the conformance suite every renderer passes.

Harnesses: :mod:`~flyarchive.testing.s3` (moto on loopback),
:mod:`~flyarchive.testing.faultproxy` (a flaky S3; :mod:`~flyarchive.testing.flaky_s3`:
record, read and render through it, judged), :mod:`~flyarchive.testing.kills`,
:mod:`~flyarchive.testing.render_kills`, :mod:`~flyarchive.testing.interop_kills`
(processes killed mid-way; :mod:`~flyarchive.testing.trials`: the child process, the
verdict and the frame comparisons they share; :mod:`~flyarchive.testing.warp_recording`:
seeded Warp worlds recorded; :mod:`~flyarchive.testing.warp_states`: CPU worlds in the
Warp arrays the Warp recorder reads, without mujoco-warp), :mod:`~flyarchive.testing.concurrency` (racing writers,
and :mod:`~flyarchive.testing.verify_beside`: ``verify`` beside a writer),
:mod:`~flyarchive.testing.hostile` (hostile archives, made by
:mod:`~flyarchive.testing.hostile_cases`; :mod:`~flyarchive.testing.checksums`:
metadata that would switch checksums off; :mod:`~flyarchive.testing.holes`: holes in
stored state; :mod:`~flyarchive.testing.model_fuzz`: crafted kept models;
:mod:`~flyarchive.testing.spec_zips`: hostile portable models, other releases' MJBs;
:mod:`~flyarchive.testing.hostile_outputs`: hostile output folders),
:mod:`~flyarchive.testing.synthetic` (archives of random states),
:mod:`~flyarchive.testing.walker` (a six-legged walker of known gait, as positions, poses or a
DeepLabCut file),
:mod:`~flyarchive.testing.ways_in` (every way into an archive, side by side;
:mod:`~flyarchive.testing.forks`: many capped jobs forked from one child),
:mod:`~flyarchive.testing.view` (the web viewer in a Chromium page),
:mod:`~flyarchive.testing.across_releases` (an archive recorded under one MuJoCo release and
replayed under another, in the other's environment).

Public, as ``zarr.testing``: every module here declares ``__all__``.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import mujoco
import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "TINY_XML", "SLIDER_XML", "TWO_HINGES_XML", "MESHED_XML", "write_meshed_model", "tiny_model", "slider_model", "slider_columns",
    "block_columns", "simulate", "perturb", "reference_frames", "rgb_to_i420", "shard_file",
    "flip_bits",
]

# Both models keep MuJoCo's shadows but with a 512-pixel shadow map instead of the default
# 4096: Mesa's software rasterizer draws the whole map for every frame, 90 % of a small frame's
# time at the default (0.24 s -> 0.02 s per frame of two 48x64 cameras).
TINY_XML = """
<mujoco model="tiny">
  <option timestep="0.002"/>
  <visual><global offwidth="640" offheight="480"/><quality shadowsize="512"/></visual>
  <worldbody>
    <light pos="0 0 3" dir="0 0 -1"/>
    <geom name="floor" type="plane" size="2 2 0.1" rgba="0.3 0.3 0.3 1"/>
    <camera name="front" pos="0 -2.5 1" xyaxes="1 0 0 0 0.4 1"/>
    <camera name="top" pos="0 0 3" xyaxes="1 0 0 0 1 0"/>
    <body name="torso" pos="0 0 0.6">
      <freejoint name="root"/>
      <geom type="box" size="0.15 0.1 0.05" rgba="0.8 0.2 0.2 1"/>
      <body name="arm" pos="0.15 0 0">
        <joint name="shoulder" type="hinge" axis="0 1 0" damping="0.05"/>
        <geom type="capsule" fromto="0 0 0 0.2 0 0" size="0.03" rgba="0.2 0.8 0.2 1"/>
        <body name="hand" pos="0.2 0 0">
          <joint name="wrist" type="ball" damping="0.05"/>
          <geom type="sphere" size="0.04" rgba="0.2 0.2 0.8 1"/>
        </body>
      </body>
      <body name="piston" pos="-0.15 0 0">
        <joint name="slider" type="slide" axis="0 0 1" range="-0.1 0.1" damping="0.5"/>
        <geom type="cylinder" size="0.03 0.05" rgba="0.8 0.8 0.2 1"/>
      </body>
    </body>
    <body name="target" mocap="true" pos="0.5 0.5 0.3">
      <geom type="sphere" size="0.05" rgba="1 0 1 1" contype="0" conaffinity="0"/>
    </body>
  </worldbody>
  <actuator>
    <motor joint="shoulder" gear="1"/>
    <motor joint="slider" gear="1"/>
  </actuator>
</mujoco>
"""

# A bright block slides along x in front of a camera: its pixel column tells the frame.
SLIDER_XML = """
<mujoco model="slider">
  <option timestep="0.01" gravity="0 0 0"/>
  <visual><global offwidth="640" offheight="480"/><quality shadowsize="512"/></visual>
  <worldbody>
    <light pos="0 0 3" dir="0 0 -1" directional="true"/>
    <camera name="front" pos="0 -3 0" xyaxes="1 0 0 0 0 1" fovy="60"/>
    <body name="block" pos="0 0 0">
      <joint name="x" type="slide" axis="1 0 0"/>
      <geom type="box" size="0.05 0.05 0.4" rgba="1 1 1 1" contype="0" conaffinity="0"/>
    </body>
  </worldbody>
</mujoco>
"""


# Two hinges: the first unnamed, the second named ``{name}`` (``TWO_HINGES_XML.format(name=...)``),
# for dof labels: a name that looks like matplotlib mathtext, or one that collides with the
# label of the unnamed joint ("joint0").
TWO_HINGES_XML = """
<mujoco>
  <worldbody>
    <body><joint type="hinge" axis="0 1 0"/><geom size="0.1" mass="1"/></body>
    <body pos="1 0 0">
      <joint name="{name}" type="hinge" axis="0 1 0"/><geom size="0.1" mass="1"/>
    </body>
  </worldbody>
</mujoco>
"""


# The tiny model with files beside it: a mesh on the torso (assets/shell.obj) and a texture
# on the floor (assets/grid.png), found through the compiler's meshdir and texturedir. Its
# layout, bodies and qpos0 are the tiny model's (:func:`write_meshed_model` writes it).
MESHED_XML = TINY_XML.replace(
    '<mujoco model="tiny">',
    '<mujoco model="meshed">\n  <compiler meshdir="assets" texturedir="assets"/>\n  <asset>\n'
    '    <mesh name="shell" file="shell.obj" scale="0.1 0.08 0.04"/>\n'
    '    <texture name="grid" type="2d" file="grid.png"/>\n'
    '    <material name="grid" texture="grid" texrepeat="4 4"/>\n  </asset>',
).replace('rgba="0.3 0.3 0.3 1"/>', 'material="grid"/>', 1).replace(
    '<geom type="box" size="0.15 0.1 0.05" rgba="0.8 0.2 0.2 1"/>',
    '<geom type="box" size="0.15 0.1 0.05" rgba="0.8 0.2 0.2 1"/>\n'
    '      <geom type="mesh" mesh="shell" pos="0 0 0.08" mass="0.01" contype="0" conaffinity="0"/>')

_CUBE_OBJ = "".join(f"v {x} {y} {z}\n" for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)) + (
    "f 1 3 4\nf 1 4 2\nf 5 6 8\nf 5 8 7\nf 1 2 6\nf 1 6 5\n"
    "f 3 7 8\nf 3 8 4\nf 1 5 7\nf 1 7 3\nf 2 4 8\nf 2 8 6\n")


def _png(width: int, height: int) -> bytes:
    """A ``width`` x ``height`` RGB PNG of a two-colour checker (no image library needed)."""
    rows = b"".join(b"\x00" + bytes(
        c for x in range(width) for c in ((200, 200, 200) if (x // 4 + y // 4) % 2 else (60, 60, 90)))
        for y in range(height))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
            + chunk(b"IEND", b""))


def write_meshed_model(folder: str | Path, name: str = "fly.xml") -> Path:
    """Write :data:`MESHED_XML` as ``folder/name`` with its files in ``folder/assets``
    (``shell.obj``, a box mesh; ``grid.png``, a 16x16 checker); the XML's path."""
    folder = Path(folder)
    (folder / "assets").mkdir(parents=True, exist_ok=True)
    (folder / "assets" / "shell.obj").write_text(_CUBE_OBJ)
    (folder / "assets" / "grid.png").write_bytes(_png(16, 16))
    path = folder / name
    path.write_text(MESHED_XML)
    return path


def tiny_model() -> mujoco.MjModel:
    """A model with free, hinge, ball and slide joints, a mocap body and two cameras (nq=13)."""
    return mujoco.MjModel.from_xml_string(TINY_XML)


def slider_model() -> mujoco.MjModel:
    """A white block on a slide joint ``x`` in front of camera ``front`` (nq=1)."""
    return mujoco.MjModel.from_xml_string(SLIDER_XML)


def slider_columns(xs: ArrayLike, size: tuple[int, int]) -> np.ndarray:
    """Where camera ``front`` of :func:`slider_model` shows the block at ``x = xs``.

    The pinhole projection (``fovy=60``, camera 3 m from the block's plane): the column
    of the block's centre in a ``size = (height, width)`` frame, in pixels, with column
    ``c`` spanning ``c .. c + 1`` (so the middle of the frame is ``width / 2``).
    """
    height, width = size
    focal = (height / 2) / math.tan(math.radians(60) / 2)
    return width / 2 + focal * np.asarray(xs, dtype=float) / 3.0


def block_columns(frames: np.ndarray) -> np.ndarray:
    """The mean column (pixel centres, ``c + 0.5``) of the bright block in each frame.

    Args:
        frames: ``(n, H, W, 3)`` uint8 RGB of :func:`slider_model`'s camera ``front``.

    Returns:
        ``(n,)`` float: compare with :func:`slider_columns` (NaN where no pixel is bright).
    """
    bright = np.asarray(frames).min(axis=-1) > 128
    columns = np.arange(bright.shape[-1]) + 0.5
    return np.array([columns[b.any(axis=0)].mean() if b.any() else np.nan for b in bright])


def perturb(model: mujoco.MjModel, data: mujoco.MjData, seed: int) -> None:
    """Give a world its own deterministic initial velocity and mocap pose."""
    rng = np.random.default_rng(seed)
    data.qvel[:] = rng.normal(0.0, 1.0, model.nv)
    if model.nmocap:
        data.mocap_pos[:] += rng.normal(0.0, 0.1, data.mocap_pos.shape)


def simulate(
    model: mujoco.MjModel,
    n_worlds: int,
    n_steps: int,
    on_step: Callable[[list[mujoco.MjData]], object],
    *,
    seed: int = 0,
) -> list[mujoco.MjData]:
    """Step ``n_worlds`` deterministic CPU worlds and call ``on_step(datas)`` after each step.

    World ``w`` starts from :func:`perturb` with seed ``seed + w``, its controls follow a
    sine, and its mocap body moves on a circle, so every run with the same arguments
    produces bit-identical states. ``on_step`` is also called once before the first step.
    """
    datas = [mujoco.MjData(model) for _ in range(n_worlds)]
    for w, data in enumerate(datas):
        perturb(model, data, seed + w)
    on_step(datas)
    for _ in range(n_steps):
        for w, data in enumerate(datas):
            data.ctrl[:] = 0.3 * np.sin(4.0 * data.time + w)
            if model.nmocap:
                data.mocap_pos[0, :2] = 0.5 * np.cos(data.time + w), 0.5 * np.sin(data.time + w)
            mujoco.mj_step(model, data)
        on_step(datas)
    return datas


def reference_frames(
    model: mujoco.MjModel, n_worlds: int, n_steps: int, *, output_fps: float = 25,
    playback_speed: float = 0.2, seed: int = 0,
) -> dict[str, np.ndarray]:
    """The states :func:`simulate` has at the frame steps, as a recorder should store them.

    Returns:
        ``time`` (n,), ``qpos`` (n_worlds, n, nq), ``mocap_pos`` (n_worlds, n, nmocap, 3)
        and ``mocap_quat`` (n_worlds, n, nmocap, 4), float64.
    """
    from flyarchive.clock import FrameClock, Timing

    clock = FrameClock(Timing(float(model.opt.timestep), output_fps, playback_speed))
    frames: dict[str, list[np.ndarray]] = {"time": [], "qpos": [], "mocap_pos": [], "mocap_quat": []}

    def on_step(datas: list[mujoco.MjData]) -> None:
        if clock.is_due_at(datas[0].time):
            frames["time"].append(np.array(datas[0].time))
            for key in ("qpos", "mocap_pos", "mocap_quat"):
                frames[key].append(np.stack([getattr(d, key).copy() for d in datas]))

    simulate(model, n_worlds, n_steps, on_step, seed=seed)
    return {k: np.array(v) if k == "time" else np.stack(v, axis=1) for k, v in frames.items()}


def rgb_to_i420(frames: np.ndarray) -> np.ndarray:
    """RGB ``(..., H, W, 3)`` uint8 to planar I420 ``(..., H * 3 // 2, W)``, in numpy.

    The same BT.601 limited-range fixed-point formulas as the Warp renderer's device
    conversion (``pixel_format="yuv420p"``), chroma from each 2x2 block's mean RGB: a
    reference to test it against, and a way to feed a yuv420p ``VideoWriter``.
    """
    rgb = np.asarray(frames, dtype=np.int32)
    *lead, height, width, _ = rgb.shape
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    luma = ((66 * r + 129 * g + 25 * b + 128) >> 8) + 16
    blocks = rgb.reshape(*lead, height // 2, 2, width // 2, 2, 3).sum(axis=(-4, -2))
    mean = (blocks + 2) >> 2
    r, g, b = mean[..., 0], mean[..., 1], mean[..., 2]
    u = ((-38 * r - 74 * g + 112 * b + 128) >> 8) + 128
    v = ((112 * r - 94 * g - 18 * b + 128) >> 8) + 128
    planes = [luma.reshape(*lead, -1), u.reshape(*lead, -1), v.reshape(*lead, -1)]
    return np.concatenate(planes, axis=-1).reshape(*lead, height * 3 // 2, width).astype(np.uint8)


def shard_file(url: str, name: str, world_shard: int = 0, time_shard: int = 0) -> Path:
    """The file of one shard of array ``name`` in a local archive (zarr v3 default keys)."""
    folder = Path(url) / name / "c" / str(world_shard) / str(time_shard)
    (path,) = [p for p in folder.rglob("*") if p.is_file()]
    return path


def flip_bits(path: Path, at: float = 0.5, mask: int = 0x40) -> None:
    """Corrupt a file in place: XOR ``mask`` into the byte at fraction ``at`` of it."""
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= mask
    path.write_bytes(bytes(data))


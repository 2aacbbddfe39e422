"""What replay renders besides RGB: depth and segmentation maps, and how they are stored.

Both renderers make the same three outputs from one kinematics pass per state:

- ``"rgb"``: ``(H, W, 3)`` uint8 colour, encoded as H.264 (lossy, as any video);
- ``"depth"``: planar depth, the distance along the camera's optical axis (not along
  the ray), in the **model's length unit** (metres for SI models, millimetres for
  NeuroMechFly), NaN where the ray hits nothing;
- ``"segmentation"``: the **geom id** (``mjOBJ_GEOM`` numbering of the compiled model,
  as ``mj_name2id(model, mjOBJ_GEOM, name)``) of the geom seen at each pixel, ``-1``
  where no geom is seen (background; on OpenGL also a site, tendon or skin drawn in
  front, which mujoco-warp never draws).

Maps are never lossy: they are stored as 16-bit counts (:func:`depth_to_counts`,
:func:`ids_to_counts`) in zarr arrays beside the videos (:mod:`flyarchive.video.maps`):

- depth count ``c`` means ``c * scale`` model units; ``0`` means no hit; ``65535`` means
  at or beyond ``65535 * scale``. The default ``scale`` is the model's far clipping
  plane over 65534 (:func:`default_depth_scale`: 0.75 mm per count for a 49 m far plane,
  3.8 µm for NeuroMechFly's 250 mm), so every visible depth fits and the rounding error
  is at most ``scale / 2``;
- segmentation count ``c`` is geom id ``c - 1``; ``0`` is background (no geom).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mujoco
import numpy as np

from flyarchive.errors import OptionsError, RenderOptionsError

#: What a render can make, in the order outputs are listed.
OUTPUTS = ("rgb", "depth", "segmentation")
#: The outputs stored as lossless 16-bit maps (not as video).
MAP_OUTPUTS = ("depth", "segmentation")
#: The largest depth count: depths at or beyond ``DEPTH_MAX_COUNT * scale`` saturate.
DEPTH_MAX_COUNT = 65535
#: Segmentation counts are geom id + 1 in 16 bits: models with more geoms cannot be stored.
MAX_SEGMENTABLE_GEOMS = 65534


def parse_outputs(outputs: Any) -> tuple[str, ...]:
    """Check the outputs asked for; returns them in :data:`OUTPUTS` order.

    Args:
        outputs: A sequence of names from :data:`OUTPUTS`, or one comma-separated string
            (``"rgb,depth"``, as ``--outputs`` takes it).

    Raises:
        RenderOptionsError: an unknown name, a name given twice, or no name at all.
    """
    names = outputs.split(",") if isinstance(outputs, str) else outputs
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise RenderOptionsError(
            f"outputs must be a sequence of names from {OUTPUTS}, got {outputs!r}.")
    names = [n.strip() for n in names]
    unknown = [n for n in names if n not in OUTPUTS]
    if unknown:
        raise RenderOptionsError(
            f"Unknown output {unknown[0]!r} in outputs={outputs!r}. Outputs: "
            f"{', '.join(map(repr, OUTPUTS))}; e.g. outputs=('rgb', 'depth') "
            "(CLI: --outputs rgb,depth).")
    if len(set(names)) != len(names) or not names:
        raise RenderOptionsError(
            f"outputs={outputs!r} must name each output at most once and at least one of "
            f"{', '.join(map(repr, OUTPUTS))}.")
    return tuple(n for n in OUTPUTS if n in names)


def far_plane(model: mujoco.MjModel) -> float:
    """The far clipping plane, model length units: ``vis.map.zfar * stat.extent``.

    Neither renderer sees farther: OpenGL clips there, mujoco-warp counts a hit beyond it
    as no hit.
    """
    return float(model.vis.map.zfar * model.stat.extent)


def default_depth_scale(model: mujoco.MjModel) -> float:
    """Model length units per depth count: the far plane over 65534 (see the module)."""
    return far_plane(model) / (DEPTH_MAX_COUNT - 1)


def parse_depth_scale(scale: Any) -> float | None:
    """``None`` (the model's default) or a positive finite number of model units per count.

    Raises:
        RenderOptionsError: anything else.
    """
    if scale is None:
        return None
    ok = isinstance(scale, (int, float, np.floating)) and not isinstance(scale, bool)
    if not ok or not np.isfinite(scale) or scale <= 0:
        raise RenderOptionsError(
            f"depth_scale must be None (the model's far plane / 65534) or a positive number "
            f"of model length units per count, got {scale!r}.")
    return float(scale)


def check_segmentable(model: mujoco.MjModel) -> None:
    """Refuse a model whose geom ids do not fit 16-bit segmentation counts.

    Raises:
        OptionsError: ``model.ngeom`` is above 65534.
    """
    if model.ngeom > MAX_SEGMENTABLE_GEOMS:
        raise OptionsError(
            f"The model has {model.ngeom} geoms; segmentation maps store geom id + 1 in 16 "
            f"bits, so at most {MAX_SEGMENTABLE_GEOMS} geoms. Render outputs without "
            "'segmentation', or split the model.")


def depth_to_counts(depth: np.ndarray, scale: float) -> np.ndarray:
    """Depth in model units (NaN: no hit) -> uint16 counts (0: no hit), same shape.

    A hit rounds to ``floor(depth / scale + 0.5)``, at least 1 and at most 65535.
    """
    with np.errstate(invalid="ignore"):
        counts = np.floor(np.asarray(depth, np.float64) / scale + 0.5)
    counts = np.clip(np.nan_to_num(counts, nan=0.0), 0, DEPTH_MAX_COUNT)
    hit = ~np.isnan(depth)
    counts[hit] = np.maximum(counts[hit], 1)
    return counts.astype(np.uint16)


def counts_to_depth(counts: np.ndarray, scale: float) -> np.ndarray:
    """uint16 depth counts -> float32 model units, NaN where the count is 0 (no hit)."""
    counts = np.asarray(counts)
    depth = counts.astype(np.float32) * np.float32(scale)
    depth[counts == 0] = np.nan
    return depth


def ids_to_counts(ids: np.ndarray) -> np.ndarray:
    """Geom ids (-1: none) -> uint16 segmentation counts, geom id + 1 (0: none)."""
    return (np.asarray(ids, np.int64) + 1).astype(np.uint16)


def counts_to_ids(counts: np.ndarray) -> np.ndarray:
    """uint16 segmentation counts -> int32 geom ids, -1 where the count is 0 (background)."""
    return np.asarray(counts).astype(np.int32) - 1


def map_outputs(outputs: Sequence[str]) -> tuple[str, ...]:
    """The map outputs among ``outputs``, in storage order (depth before segmentation)."""
    return tuple(n for n in MAP_OUTPUTS if n in outputs)

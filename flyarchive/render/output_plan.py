"""What a render makes besides one RGB video per (world, camera), planned against the archive
and model before any work: depth and segmentation maps, mosaics, overlays (the
:class:`~flyarchive.render.options.RenderOptions` fields ``outputs``, ``depth_scale``,
``mosaic``, ``overlays``, checked on their own when the options are made).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import mujoco

from flyarchive.errors import RenderOptionsError
from flyarchive.replay.output_kinds import check_segmentable, default_depth_scale, far_plane, map_outputs
from flyarchive.video.mosaic import fit_mosaic, mosaic_jobs
from flyarchive.replay.overlay_text import check_overlay

if TYPE_CHECKING:
    from flyarchive.query.selection import VideoJob
    from flyarchive.render.options import RenderOptions
    from flyarchive.render.plan import Job
    from flyarchive.store.header import Archive


def plan_outputs(options: RenderOptions, ds: Archive, model: mujoco.MjModel,
                 jobs: Sequence[VideoJob]) -> tuple[RenderOptions, list[Job], tuple[str, ...]]:
    """Check the outputs against the archive and model; the options and jobs to plan with,
    and notes on what was changed from what was asked (for the manifest).

    The depth scale is resolved from the model (so tasks and the manifest agree), and
    with ``mosaic`` the per-world jobs become mosaic jobs
    (:class:`flyarchive.video.mosaic.MosaicJob`).

    Raises:
        RenderOptionsError: an overlay item the archive lacks (its per-world variables are
            named); a mosaic of the windows of a ``(world, time)`` where mask.

    A mosaic of more tiles than selected worlds is fitted to them
    (:func:`~flyarchive.video.mosaic.fit_mosaic`); the manifest names the layout asked for.
    Overlay items that do not fit across a frame (a tile) are left out
    (:class:`~flyarchive.replay.overlay_text.OverlayText`), with a note.
        OptionsError: segmentation of a model with more than 65534 geoms.
    """
    check_overlay(options.overlays, ds)
    notes: list[str] = []
    if "segmentation" in options.outputs:
        check_segmentable(model)
    if map_outputs(options.outputs) and options.depth_scale is None:
        options = dataclasses.replace(options, depth_scale=default_depth_scale(model))
    if options.mosaic is not None:
        windows = [j for j in jobs if getattr(j, "window", None) is not None]
        if windows:
            raise RenderOptionsError(
                f"A mosaic shows its worlds' frames side by side in step; a where mask over "
                f"(world, time) cut world {windows[0].world_id} into windows of their own "
                "frames. Select worlds with a (world,) mask (e.g. ds.success == 1) for a "
                "mosaic, or render the windows without mosaic=.")
        asked = options.mosaic
        fitted = fit_mosaic(asked, len(jobs))
        if fitted != asked:  # fewer worlds than tiles: no blank rows or columns
            options = dataclasses.replace(options, mosaic=fitted)
            notes.append(f"A {asked[0]}x{asked[1]} mosaic was asked for {len(jobs)} world(s); "
                         f"it is {fitted[0]}x{fitted[1]}.")
        jobs = mosaic_jobs(list(jobs), fitted, asked=asked)
    options, note = _fit_overlay(options, ds)
    return options, list(jobs), tuple(notes + ([note] if note else []))


def _fit_overlay(options: RenderOptions, ds: Archive) -> tuple[RenderOptions, str]:
    """The options with only the overlay items that fit across a frame (a tile), and a
    note on those left out ("" when none)."""
    from flyarchive.replay.overlay_text import OverlayText

    if not options.overlays and options.mosaic is None:
        return options, ""
    overlay = OverlayText(ds, options.overlays, label_world=options.mosaic is not None,
                          size=tuple(options.size))
    if not overlay.left_out:
        return options, ""
    shown = tuple(name for name in options.overlays if name in overlay.items)
    return dataclasses.replace(options, overlays=shown), overlay.note


def map_attributes(options: RenderOptions, model: mujoco.MjModel, world: int | None, camera: str,
                   first_frame: int, fps: float) -> dict[str, dict[str, Any]]:
    """The attributes of each map of one (world, camera) video."""
    from flyarchive.video.maps import depth_attrs, segmentation_attrs

    where = {"world": world, "camera": camera, "first_frame": first_frame, "fps": fps}
    scale = options.depth_scale or default_depth_scale(model)
    made = {"depth": lambda: depth_attrs(scale, far_plane(model)),
            "segmentation": segmentation_attrs}
    return {n: {**made[n](), **where} for n in map_outputs(options.outputs)}


def text_chars(options: RenderOptions) -> int:
    """Characters of overlay text the Warp renderer holds per frame: what fits across a
    tile (0 without overlay or mosaic)."""
    from flyarchive.replay.overlay_text import CELL_W

    if not options.overlays and options.mosaic is None:
        return 0
    return options.size[1] // CELL_W + 1

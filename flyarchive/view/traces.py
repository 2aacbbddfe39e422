"""Traces for the page: chosen dofs (by :func:`flyarchive.select_dofs` names) or keypoint
positions of the selected worlds over time, cut down on the server to a minimum and a
maximum per pixel column, so that 50 worlds × 1000 frames travel as at most
``2 × width`` points per line; and each dof's unit (:func:`dof_units`) for the legend.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from flyarchive.errors import SelectionError

#: Most worlds one trace request may draw, and most pixel columns.
MAX_WORLDS = 200
MAX_WIDTH = 4000
#: NeuroMechFly's length unit, the millimetre (as the gait measures take it).
LENGTH_UNIT = "mm"


def min_max_columns(times: np.ndarray, values: np.ndarray, width: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Downsample lines to their minimum and maximum in each of ``width`` columns.

    Each column of ``k`` frames becomes two points, at its first and last frame's time,
    holding the column's minimum and maximum in the order they happened: a line drawn
    through them covers exactly the pixels the full line covers at that width, and every
    line shares the same times (one x axis for the plot).

    Args:
        times: ``(n,)`` seconds.
        values: ``(lines, n)``; NaN where there is no data.
        width: Pixel columns (>= 1).

    Returns:
        ``(times (m,), values (lines, m))``: the input when ``n <= 2 * width``; else
        ``m = 2 * ceil(n / k)`` for ``k = ceil(n / width)`` frames per column.
    """
    lines, n = values.shape
    if n <= 2 * width:
        return np.asarray(times, dtype=np.float64).copy(), values.copy()
    k = -(-n // width)
    columns = -(-n // k)
    padded = np.full((lines, columns * k), np.nan)
    padded[:, :n] = values
    blocks = padded.reshape(lines, columns, k)
    empty = np.isnan(blocks).all(axis=2)
    lo = np.argmin(np.where(np.isnan(blocks), np.inf, blocks), axis=2)
    hi = np.argmax(np.where(np.isnan(blocks), -np.inf, blocks), axis=2)
    base = np.arange(columns) * k
    index = np.stack([base + np.minimum(lo, hi), base + np.maximum(lo, hi)], axis=2)
    index = np.minimum(index.reshape(lines, 2 * columns), n - 1)
    out = np.take_along_axis(values, index, axis=1)
    out[np.repeat(empty, 2, axis=1)] = np.nan
    edges = np.stack([base, np.minimum(base + k - 1, n - 1)], axis=1).reshape(-1)
    return np.asarray(times, dtype=np.float64)[edges], out


def dof_choices(labels: Sequence[str], *, leg: str = "", joint: str = "", axis: str = "",
                dof: str = "") -> list[str]:
    """The dofs a trace request names, each once: ``dof`` (labels, comma-separated) or
    the ``leg`` / ``joint`` / ``axis`` of :func:`flyarchive.dof_labels` (comma-separated
    values each; empty: any).

    Raises:
        SelectionError: no match (the message lists what exists), or nothing asked.
    """
    import flyarchive

    if dof.strip():
        asked = list(dict.fromkeys(d.strip() for d in dof.split(",") if d.strip()))
        unknown = [d for d in asked if d not in labels]
        if unknown:
            import difflib

            close = difflib.get_close_matches(unknown[0], list(labels), n=3, cutoff=0.5)
            hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise SelectionError(f"The archive has no dof {unknown[0]!r}.{hint} It has "
                                 f"{len(labels)} dofs, e.g. {', '.join(map(repr, labels[:6]))}.")
        return asked
    criteria = {k: [v.strip() for v in text.split(",") if v.strip()] or None
                for k, text in (("leg", leg), ("joint", joint), ("axis", axis))}
    if not any(criteria.values()):
        raise SelectionError("Choose a dof, or a leg, joint or axis (as flyarchive.select_dofs "
                             "takes them), to draw traces.")
    return list(dict.fromkeys(flyarchive.dof_labels(list(labels), **criteria)))


def keypoint_values(ds: Any, worlds: Sequence[int], body: str, window: slice, *,
                    model: Any) -> tuple[list[str], np.ndarray]:
    """Positions of one keypoint (a body's origin) of the worlds, by forward kinematics
    (:func:`flyarchive.positions`), over the frames of ``window``.

    Returns:
        ``(["body/x", "body/y", "body/z"], (worlds, 3, frames))`` in the model's length unit.

    Raises:
        SelectionError: an unknown body (with the names that exist).
    """
    from flyarchive.analyze import positions

    chosen = ds.isel(time=window).sel(world=list(worlds))
    found = positions(chosen, bodies=[body], model=model)
    values = np.asarray(found.values, dtype=np.float64)[:, :, 0, :]  # (world, time, xyz)
    return [f"{body}/{axis}" for axis in "xyz"], np.moveaxis(values, 2, 1)


def pack(head: dict[str, Any], times: np.ndarray, values: np.ndarray) -> bytes:
    """Traces as the page reads them: a little-endian uint32 length, the JSON ``head``
    (with ``points``: ``m``), zeros up to a multiple of 8 bytes, then float64 ``times``
    ``(m,)`` and ``values`` ``(lines, m)`` (NaN: no data). Binary, so that 50 worlds of
    1000 frames are neither formatted nor parsed as text."""
    text = json.dumps({**head, "points": int(times.shape[0])}, allow_nan=False).encode()
    start = 4 + len(text)
    pad = -start % 8
    return b"".join([len(text).to_bytes(4, "little"), text, b"\0" * pad,
                     np.ascontiguousarray(times, "<f8").tobytes(),
                     np.ascontiguousarray(values, "<f8").tobytes()])


def check_request(worlds: Sequence[int], width: int) -> None:
    """Refuse a trace request of no worlds, too many, or an impossible width."""
    if not worlds:
        raise SelectionError("Select at least one world in the table to draw its traces.")
    if len(worlds) > MAX_WORLDS:
        raise SelectionError(f"{len(worlds)} worlds are selected; traces draw at most "
                             f"{MAX_WORLDS}. Select fewer.")
    if not 1 <= width <= MAX_WIDTH:
        raise SelectionError(f"A trace is 1 to {MAX_WIDTH} pixels wide, not {width!r}.")

"""What a reader reads of an archive before any state: ``n_frames`` and the coordinates,
in the order that keeps them consistent with each other and with the arrays' metadata,
checked as ``verify`` checks them.

:func:`committed_coordinates` is what the lazy dataset
(:func:`~flyarchive.store.dataset.read_dataset`) and the header
(:func:`~flyarchive.store.dataset.read_header`) are built on, so both open an archive
the same way: with consolidated metadata in one concurrent round of requests, the
arrays' own metadata read instead when the consolidated copy lags behind ``n_frames``
(committed frames are never hidden).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import zarr

from flyarchive.errors import CorruptArchiveError, SchemaError
from flyarchive.schema import (
    DERIVED_ATTR,
    TIME_COORDS,
    damage_advice,
    is_state,
    n_frames_problem,
    sizes_problem,
    times_problem,
)
from flyarchive.store.chunk_holes import lost_commit_markers
from flyarchive.store.consolidated import time_extent
from flyarchive.store.replicas import read_checked
from flyarchive.store.location import sync
from flyarchive.store.reader import fused_reads
from flyarchive.zarr_internals import array_getitem


def committed_coordinates(url: str, storage_options: Mapping[str, Any] | None,
                          group: zarr.Group) -> tuple[zarr.Group, dict[str, zarr.Array],
                                                      np.ndarray | None, int, dict[str, np.ndarray]]:
    """What :func:`~flyarchive.store.dataset.read_dataset` and
    :func:`~flyarchive.store.dataset.read_header` build on, checked the same way
    for both (and as ``verify`` checks: :func:`flyarchive.schema.sizes_problem`,
    :func:`~flyarchive.schema.n_frames_problem`, :func:`~flyarchive.schema.times_problem`):
    the group and arrays read, ``n_frames`` (None without it), the committed length of
    ``time``, and the coordinates cut to it.

    Raises:
        SchemaError: arrays of different lengths along a dimension.
        CorruptArchiveError: ``n_frames`` outside the stored frames, or the times of the
            committed frames missing, not finite or not increasing.
    """
    group, arrays, n_frames, coordinates = _committed_and_coordinates(url, storage_options, group)
    extent = time_extent({k: a.metadata for k, a in arrays.items()}) or 0
    if n_frames is not None and n_frames.size and n_frames.min() >= 0 and n_frames.max() > extent:
        # a writer grew the arrays and committed after their metadata was read: read it again
        group, arrays = _arrays_now(url, storage_options)
        extent = time_extent({k: a.metadata for k, a in arrays.items()}) or 0
        coordinates = _read_now(arrays, _coordinate_names(arrays), int(n_frames.max()),
                                group, url)
    fix = damage_advice(url, group.attrs.asdict())
    what = "derived group" if DERIVED_ATTR in group.attrs else "archive"
    problem = sizes_problem({k: (dims_of(a), tuple(int(n) for n in a.shape))
                             for k, a in arrays.items()})
    if problem is not None:
        raise SchemaError(f"The {what} at {url!r} is damaged: {problem} {fix}")
    committed = n_frames_problem(n_frames, extent) if n_frames is not None else None
    if committed is None and n_frames is not None:
        committed = lost_markers_problem(arrays, n_frames)
    if committed is not None:
        raise CorruptArchiveError(f"The {what} at {url!r} is damaged: {committed} {fix}")
    n_frames = n_frames.astype(np.int64) if n_frames is not None else None
    n_time = int(n_frames.max(initial=0)) if n_frames is not None else extent
    cut = {name: values[time_cut(arrays[name], n_time)] for name, values in coordinates.items()}
    times = times_problem(cut["time"], cut.get("sim_time")) if "time" in cut else None
    if times is not None:
        raise CorruptArchiveError(f"The {what} at {url!r} is damaged: {times} {fix}")
    return group, arrays, n_frames, n_time, cut


def lost_markers_problem(arrays: Mapping[str, zarr.Array], n_frames: np.ndarray) -> str | None:
    """What is wrong when a chunk of ``n_frames`` is missing though its worlds' frames were
    recorded (:func:`~flyarchive.store.chunk_holes.lost_commit_markers`), in words; None if
    none is."""
    state = [a for a in arrays.values() if is_state(dims_of(a))]
    lost = lost_commit_markers(arrays["n_frames"], n_frames, state) if state else []
    if not lost:
        return None
    files = ", ".join(f"{key} (worlds at indices {start}..{stop - 1})" for key, start, stop in lost)
    return (f"the commit markers' file {files} is missing, though frames of those worlds were "
            "recorded: they would read as no frame committed.")


def dims_of(arr: zarr.Array) -> tuple[str, ...]:
    """An array's dimension names (none: ``()``)."""
    return tuple(arr.metadata.dimension_names or ())


def time_cut(arr: zarr.Array, n_time: int) -> tuple[slice, ...]:
    """An array's selection of the committed frames: ``time`` cut to ``n_time``."""
    return tuple(slice(0, n_time) if d == "time" else slice(None) for d in dims_of(arr))


def _committed_and_coordinates(url: str, storage_options: Mapping[str, Any] | None,
                               group: zarr.Group) -> tuple[zarr.Group, dict[str, zarr.Array],
                                                           np.ndarray | None, dict[str, np.ndarray]]:
    """``n_frames`` and the coordinates, read in the order that keeps them consistent.

    With consolidated metadata, whose ``time`` extent E was committed before the copy was
    written (hence before it was read here), ``n_frames`` and the coordinates cut to E
    are read in one round. Without it (the arrays' own extents may run ahead of what is
    committed), ``n_frames`` comes first, then the coordinates cut to it; and so when the
    consolidated copy lags behind ``n_frames`` (then the arrays' own metadata is read).

    Returns:
        The group and arrays used, ``n_frames`` as stored (None without it), and the
        coordinates (``time`` may run past the committed frames: cut it).
    """
    with fused_reads():
        arrays = dict(group.arrays())
    names = _coordinate_names(arrays)
    marker = ["n_frames"] if "n_frames" in arrays else []
    consolidated = group.metadata.consolidated_metadata is not None
    extent = time_extent({k: a.metadata for k, a in arrays.items()}) or 0
    if consolidated:
        values = _read_now(arrays, marker + names, extent, group, url)
        n_frames = values.pop("n_frames", None)
        if int(np.max(n_frames, initial=0) if n_frames is not None else 0) <= extent:
            return group, arrays, n_frames, values
        group, arrays = _arrays_now(url, storage_options)  # the copy lags behind
        extent = time_extent({k: a.metadata for k, a in arrays.items()}) or 0
    n_frames = _read_now(arrays, marker, 0, group, url)["n_frames"] if marker else None
    n_time = min(int(np.max(n_frames, initial=0)), extent) if n_frames is not None else extent
    return group, arrays, n_frames, _read_now(arrays, _coordinate_names(arrays), n_time, group, url)


def _coordinate_names(arrays: Mapping[str, zarr.Array]) -> list[str]:
    """The coordinates (small, read at open): arrays named after their dimension, and
    ``sim_time`` and ``frame`` along ``time`` (the state arrays' ``coordinates``
    attribute names them; ``xarray.open_zarr`` makes them coordinates too)."""
    return [n for n, a in arrays.items() if n in dims_of(a)
            or (n in TIME_COORDS and dims_of(a) == ("time",))]


def _read_now(arrays: Mapping[str, zarr.Array], names: Sequence[str], n_time: int,
              group: zarr.Group, url: str) -> dict[str, np.ndarray]:
    """Arrays ``names`` read whole (``time`` cut to ``n_time``), concurrently, beside the
    arrays' own metadata when ``group`` reads the consolidated copy
    (:func:`~flyarchive.store.replicas.read_checked`): one round of requests on remote storage."""
    reads = [array_getitem(arrays[n], time_cut(arrays[n], n_time)) for n in names]
    return {name: np.asarray(value)
            for name, value in zip(names, sync(read_checked(group, str(url), reads)))}


def _arrays_now(url: str, storage_options: Mapping[str, Any] | None
                ) -> tuple[zarr.Group, dict[str, zarr.Array]]:
    """The group and every array's own metadata, read now (checked as at open)."""
    from flyarchive.store.opener import open_for_reading  # the opener reads through here

    group = open_for_reading(url, storage_options, consolidated=False)
    with fused_reads():
        return group, dict(group.arrays())

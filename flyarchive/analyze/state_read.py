"""The state of a window of an archive read in big blocks, for streaming positions
(:mod:`~flyarchive.analyze.warp_stream`): straight through the store's getters
(:class:`~flyarchive.store.dataset.CommittedFrames`, the same objects the lazy dataset
reads with, their :class:`~flyarchive.store.shards.ShardReader` reading whole shards and
decoding each inner chunk into its place), with no dask graph per read.

A read of rows ``[r0, r1)`` (the window's frames flattened world by world) is one call
of the getter per run of consecutive worlds held whole (and one per partial world at the
ends): a few Python calls per shard, the decoding outside the GIL, so reader threads
read in parallel. Frames past a world's ``n_frames`` read as NaN (the getter masks them,
as for the lazy array). When the window cannot be found in the archive's getters (a
dataset not read from an archive, or cut in ways other than worlds and a time span),
:func:`state_reader` returns a reader through dask instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from flyarchive.analyze.prepare import Prepared, committed_getter

if TYPE_CHECKING:
    import xarray as xr

__all__ = ["StateReader", "state_reader"]


class StateReader:
    """Reads rows of a window's state (see the module's docstring).

    Args:
        getters: ``{name: getter}`` of the state arrays to read (``(world, time, ...)``
            array-likes of the whole archive).
        worlds: ``(W,)`` the window's worlds, as indices of the getters' ``world`` axis.
        start, stop: The window's frames, ``[start, stop)`` of the getters' ``time`` axis.
    """

    def __init__(self, getters: dict[str, Any], worlds: np.ndarray, start: int, stop: int
                 ) -> None:
        self.getters, self.worlds, self.start, self.stop = getters, worlds, start, stop
        self.n_time = stop - start

    def read(self, r0: int, r1: int) -> dict[str, np.ndarray]:
        """Rows ``[r0, r1)`` of each state array: ``{name: (r1 - r0, ...)}`` as stored
        (dtype of the archive), NaN past each world's ``n_frames``."""
        pieces = list(_pieces(r0, r1, self.n_time, self.worlds))
        state = {}
        for name, getter in self.getters.items():
            parts = [getter[w0:w1, self.start + t0:self.start + t1].reshape(-1, *getter.shape[2:])
                     for w0, w1, t0, t1 in pieces]
            state[name] = parts[0] if len(parts) == 1 else \
                np.concatenate(parts) if parts else np.empty((0, *getter.shape[2:]), getter.dtype)
        return state


def _pieces(r0: int, r1: int, n_time: int, worlds: np.ndarray
            ) -> Iterator[tuple[int, int, int, int]]:
    """``(w0, w1, t0, t1)`` boxes (getter worlds ``[w0, w1)``, window frames ``[t0, t1)``)
    covering rows ``[r0, r1)``: runs of whole consecutive worlds in one box each."""
    row = r0
    while row < r1:
        w, t = divmod(row, n_time)
        if t == 0 and r1 - row >= n_time:
            take = (r1 - row) // n_time
            run = 1  # consecutive archive worlds
            while run < take and worlds[w + run] == worlds[w] + run:
                run += 1
            yield int(worlds[w]), int(worlds[w]) + run, 0, n_time
            row += run * n_time
        else:
            stop = min(n_time, t + r1 - row)
            yield int(worlds[w]), int(worlds[w]) + 1, t, stop
            row += stop - t


class _DaskReader:
    """Rows of a window's state through its dask arrays (any dataset; slower: a graph per
    read, run in the calling thread)."""

    def __init__(self, ds: xr.Dataset, names: list[str]) -> None:
        self.arrays = {name: ds[name].data for name in names}
        self.n_time = int(ds.sizes["time"])

    def read(self, r0: int, r1: int) -> dict[str, np.ndarray]:
        state = {}
        for name, data in self.arrays.items():
            parts = [data[w0:w1, t0:t1] for w0, w1, t0, t1 in
                     _pieces(r0, r1, self.n_time, np.arange(data.shape[0]))]
            parts = [p.reshape((-1, *data.shape[2:])) for p in parts]
            if hasattr(parts[0], "compute"):
                import dask.array as da

                block = parts[0] if len(parts) == 1 else da.concatenate(parts)
                state[name] = np.asarray(block.compute(scheduler="synchronous"))
            else:
                state[name] = np.concatenate(parts) if len(parts) > 1 else np.asarray(parts[0])
        return state


def state_reader(prepared: Prepared, names: list[str]
                 ) -> StateReader | _DaskReader:
    """The fastest reader of the prepared window's state arrays ``names``: through the
    archive's getters when the window is found in them, else through dask."""
    located = _locate(prepared, names)
    if located is None:
        return _DaskReader(prepared.ds, names)
    getters, worlds, (start, stop) = located
    return StateReader(getters, worlds, start, stop)


def _locate(prepared: Prepared, names: list[str]
            ) -> tuple[dict[str, Any], np.ndarray, tuple[int, int]] | None:
    """The getters of ``names`` and where the window lies in them (world indices, frames
    ``[start, stop)``); None when the window is not a set of worlds by a span of frames
    of one archive's getters."""
    whole, ds = prepared.whole, prepared.ds
    if whole is None:
        return None
    getters = {name: committed_getter(whole[name]) for name in names}
    first = getters[names[0]]
    if any(g is None for g in getters.values()) or first is None:
        return None
    if any(g.shape[:2] != first.shape[:2] for g in getters.values()):  # type: ignore[union-attr]
        return None
    ids = np.asarray(first.world_ids)
    if (whole.sizes["world"], whole.sizes["time"]) != first.shape[:2] or \
            not np.array_equal(np.asarray(whole.world.values), ids):
        return None  # the dataset given was cut already
    where = {int(w): i for i, w in enumerate(ids)}
    asked = [int(w) for w in ds.world.values]
    if any(w not in where for w in asked):
        return None
    times, all_times = np.asarray(ds.time.values), np.asarray(whole.time.values)
    if times.size == 0:
        return None
    start = int(np.searchsorted(all_times, times[0]))
    stop = start + times.size
    if stop > all_times.size or not np.array_equal(all_times[start:stop], times):
        return None
    indices = np.array([where[w] for w in asked], dtype=np.int64)
    return getters, indices, (start, stop)  # type: ignore[return-value]


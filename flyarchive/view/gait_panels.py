"""The gait panels' data: per shown world, each leg's stance intervals (the footfall
diagram), the thorax's path seen from above, and a few measures with their units.

Computed on request by :mod:`flyarchive.analyze.gait` (:func:`flyarchive.gait_epochs`,
:func:`flyarchive.gait_summary`) from the gait points only, the thorax and the six tarsus
tips (:func:`flyarchive.gait_positions`: read where the archive keeps them, else computed
by forward kinematics for those worlds and that window), and kept per (archive, world,
window) in a bounded cache (:class:`GaitCache`), so that moving between worlds already
shown asks for nothing again. The request's cost is checked by the caller
(:meth:`flyarchive.view.app.Viewer.gait`) before any work: :func:`answer_bytes` says how
big its answer may be.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from flyarchive.errors import SelectionError
from flyarchive.lru import LRUCache

#: Most worlds one gait request covers (the 3D view shows at most 9).
MAX_WORLDS = 16
#: Most points of one world's path in an answer (its frames, evenly thinned).
MAX_PATH_POINTS = 1000
#: Worlds' gait kept in memory: at most this many, weighing at most this many bytes.
CACHE_ITEMS = 512
CACHE_BYTES = 64 << 20
#: The measures sent beside the footfalls (per leg: ``<name>_<leg>``), as
#: :data:`flyarchive.analyze.gait.MEASURES` names them.
WORLD_MEASURES = ("mean_speed", "distance", "tcs")
LEG_MEASURES = ("step_frequency", "duty_factor")
#: Decimals of the times (s) and lengths (mm) sent.
TIME_DIGITS, LENGTH_DIGITS = 9, 6
#: Bytes of JSON per number sent, at most (a float64 written out, a comma).
_NUMBER_BYTES = 26


@dataclass(frozen=True)
class WorldGait:
    """The gait of one world over one window, as the page draws it.

    Attributes:
        world: The world's id.
        legs: Leg names (``lf``, ``lm``, ``lh``, ``rf``, ``rm``, ``rh``).
        stance: Per leg, ``(k, 2)`` float64 start and stop times (s) of its stances, in
            time order; frames without positions belong to none.
        path: ``(3, m)`` float64 time (s), x and y (mm) of the thorax, at most
            :data:`MAX_PATH_POINTS` frames evenly spread (the first and last kept); NaN
            where the world has no frame.
        measures: Name -> value (NaN: nothing to measure), per leg a list in ``legs``
            order.
    """

    world: int
    legs: tuple[str, ...]
    stance: tuple[np.ndarray, ...]
    path: np.ndarray
    measures: Mapping[str, Any]

    @property
    def nbytes(self) -> int:
        return int(sum(s.nbytes for s in self.stance) + self.path.nbytes + 64 * len(self.measures))

    def as_json(self) -> dict[str, Any]:
        """JSON-ready (NaN as None; times rounded to the nanosecond, lengths to the
        nanometre: shorter to send, and far below a frame or a tip's noise)."""
        return {"world": self.world,
                "stance": [np.round(s, TIME_DIGITS).tolist() for s in self.stance],
                "path": {"t": _numbers(self.path[0], TIME_DIGITS),
                         "x": _numbers(self.path[1], LENGTH_DIGITS),
                         "y": _numbers(self.path[2], LENGTH_DIGITS)},
                "measures": {k: _numbers(v) if isinstance(v, (list, np.ndarray)) else _number(v)
                             for k, v in self.measures.items()}}


def _number(value: Any) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def _numbers(values: Any, digits: int | None = None) -> list[float | None]:
    values = np.asarray(values, dtype=np.float64).ravel()
    return [_number(v) for v in (values if digits is None else np.round(values, digits))]


def thorax_of(bodies: Sequence[str]) -> str:
    """The body whose path is the fly's: the first named like a flygym fly's thorax
    (``<fly>/c_thorax``); its fly's tarsus tips are the legs.

    Raises:
        SelectionError: the model has no such body (its bodies named).
    """
    for body in bodies:
        if body.endswith("/c_thorax"):
            return body
    shown = ", ".join(repr(b) for b in bodies[:8]) + (" ..." if len(bodies) > 8 else "")
    raise SelectionError(
        f"No gait: the model has no thorax named as a flygym fly's ('<fly>/c_thorax', e.g. "
        f"'nmf/c_thorax') with tarsus tips '<fly>/<leg>_tarsus5'. Its bodies: {shown}. The "
        "footfalls and paths need a fly; the table, traces and 3D view do not.")


def check_worlds(worlds: Sequence[int]) -> None:
    """Refuse a gait request of no worlds or too many."""
    if not worlds:
        raise SelectionError("Select at least one world in the table to see its gait.")
    if len(worlds) > MAX_WORLDS:
        raise SelectionError(f"{len(worlds)} worlds are asked for; the gait panels show at most "
                             f"{MAX_WORLDS}. Select fewer.")


def answer_bytes(worlds: int, frames: int, legs: int = 6) -> int:
    """The most bytes an answer of ``worlds`` worlds over ``frames`` frames may take: at
    most one stance every two frames per leg, and the thinned path."""
    stances = legs * (frames // 2 + 1) * 2
    path = 3 * min(frames, MAX_PATH_POINTS)
    return worlds * (stances + path + 64) * _NUMBER_BYTES


def world_gaits(source: Any, worlds: Sequence[int], time: tuple[float, float], *,
                thorax: str, model: Any = None,
                storage_options: Mapping[str, Any] | None = None) -> list[WorldGait]:
    """The gait of ``worlds`` over ``time``, computed together (one positions request).

    Args:
        source: The archive's dataset (:func:`flyarchive.open_archive`).
        worlds: World ids.
        time: ``(start, end)`` seconds, inclusive, holding at least two frames.
        thorax: The thorax body (:func:`thorax_of`); the tips are its fly's tarsus tips.
        model: The model; None: the one kept beside the archive (then positions kept by
            ``flyarchive positions`` for it are read instead of computed).
        storage_options: Of the archive.

    Returns:
        A :class:`WorldGait` per world, in ``worlds`` order.

    Raises:
        SelectionError: bodies the model lacks, fewer than two frames.
        And as :func:`flyarchive.gait_positions`.
    """
    import warnings

    from flyarchive.analyze.gait import gait_epochs, gait_positions, gait_summary

    pos = gait_positions(source, thorax=thorax, worlds=list(worlds), time=time, model=model,
                         storage_options=storage_options, processes=0)
    epochs = gait_epochs(pos)
    with warnings.catch_warnings():  # a world that stood still: NaN measures, said as such
        warnings.simplefilter("ignore", RuntimeWarning)
        summary = gait_summary(pos)
    legs = tuple(str(k).rpartition("/")[2].removesuffix("_tip")
                 for k in pos.keypoint.values[2:])
    times = np.asarray(pos.time.values, dtype=np.float64)
    thorax_xy = np.asarray(pos.sel(keypoint="gait/thorax", xyz=["x", "y"]).values)  # (w, t, 2)
    keep = _thinned(len(times), MAX_PATH_POINTS)
    stance = epochs[epochs["phase"] == "stance"]  # ordered by world, leg, then time
    of_world = stance["world"].to_numpy()
    of_leg = stance["leg"].to_numpy().astype(str)
    spans = stance[["start_time", "stop_time"]].to_numpy(np.float64)
    out = []
    for i, world in enumerate(int(w) for w in pos.world.values):
        mine = of_world == world
        intervals = tuple(np.ascontiguousarray(spans[mine & (of_leg == leg)]) for leg in legs)
        path = np.stack([times[keep], thorax_xy[i, keep, 0], thorax_xy[i, keep, 1]])
        measures: dict[str, Any] = {name: float(summary[name].values[i])
                                    for name in WORLD_MEASURES}
        for name in LEG_MEASURES:
            measures[name] = [float(summary[f"{name}_{leg}"].values[i]) for leg in legs]
        out.append(WorldGait(world, legs, intervals, path, measures))
    order = {g.world: g for g in out}
    return [order[int(w)] for w in worlds]


def _thinned(n: int, most: int) -> np.ndarray:
    """Indices of at most ``most`` of ``n`` frames, evenly spread, first and last kept."""
    if n <= most:
        return np.arange(n)
    return np.unique(np.round(np.linspace(0, n - 1, most)).astype(np.int64))


def units(length: str = "mm") -> dict[str, str]:
    """The units of the answer's values: times, path, and each measure
    (:data:`flyarchive.analyze.gait.MEASURES`)."""
    from flyarchive.analyze.gait import MEASURES

    found = {"time": "s", "path": length}
    for name in WORLD_MEASURES:
        found[name] = MEASURES[name][0]
    for name in LEG_MEASURES:
        found[name] = MEASURES[f"{name}_<leg>"][0]
    return found


class GaitCache:
    """The gait of worlds already computed, per (archive, world, window): at most
    :data:`CACHE_ITEMS` worlds weighing :data:`CACHE_BYTES` (the least recently shown go
    first). Thread-safe."""

    def __init__(self) -> None:
        self._kept: LRUCache[tuple[Any, ...], WorldGait] = LRUCache(
            CACHE_ITEMS, max_weight=CACHE_BYTES, weight=lambda g: g.nbytes,
            name="gait of shown worlds")

    def get(self, keys: Mapping[int, tuple[Any, ...]],
            compute: Callable[[list[int]], list[WorldGait]]) -> list[WorldGait]:
        """The gait of the worlds of ``keys`` (world -> its key: the archive's
        ``archive_id``, the viewer's generation of it, the world, its committed frames and
        the window's frames): those kept, and the others from ``compute(missing worlds)``
        (one call for all of them), kept. In ``keys`` order."""
        found: dict[int, WorldGait] = {}
        for world, key in keys.items():
            hit = self._kept.peek(key)
            if hit is not None:
                found[world] = self._kept.get(key, lambda hit=hit: hit)  # counted as used
        missing = [w for w in keys if w not in found]
        if missing:
            for gait in compute(missing):
                found[gait.world] = self._kept.get(keys[gait.world], lambda g=gait: g)
        return [found[w] for w in keys]

    def clear(self) -> None:
        self._kept.clear()

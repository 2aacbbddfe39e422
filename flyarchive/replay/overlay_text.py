"""What overlays say: the text burnt into each frame, from the archive.

Items, in the order asked for, joined by spaces, e.g. ``w3 t=0.152s x0.2 gain=1.25``:

- ``"world"``: the world id, ``w3``;
- ``"time"``: the frame's simulated time (the archive's ``time`` coordinate), ``t=0.152s``,
  with as many decimals as the frame interval needs;
- ``"speed"``: the playback speed (simulated seconds per second of video), ``x0.2``;
- any per-world variable of the archive (a ``(world,)`` variable such as a seed or a
  parameter), ``name=value``.

The pixels are burnt by :func:`flyarchive.replay.compose.burn_text` (OpenGL backend) or on
the Warp device; mosaics label every tile with its world id first.

Text fits its frame (tile): given the frame size, :class:`OverlayText` keeps the items, in
order, whose widest text over the whole archive fits across it in whole characters and
leaves the rest out (:attr:`OverlayText.left_out`, :attr:`OverlayText.note`); frames too
low for a line of text get none. Nothing is ever cut through a character.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from flyarchive.errors import RenderOptionsError, did_you_mean

if TYPE_CHECKING:
    from flyarchive.store.header import Archive

#: Overlay items every archive has.
BUILT_IN = ("world", "time", "speed")


def parse_overlay(overlay: Any) -> tuple[str, ...]:
    """The overlay items asked for, as a tuple: a sequence of names or one comma-separated
    string (``"time,world"``, as ``--overlay`` takes it); empty: no overlay.

    Raises:
        RenderOptionsError: not strings, an empty name, or a name given twice.
    """
    names = [n.strip() for n in overlay.split(",")] if isinstance(overlay, str) else overlay
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) and n for n in names):
        raise RenderOptionsError(
            f"overlays must be a sequence of item names ({', '.join(BUILT_IN)} or per-world "
            f"variables of the archive), got {overlay!r}.")
    if len(set(names)) != len(names):
        raise RenderOptionsError(f"overlays={overlay!r} names an item twice; name each once.")
    return tuple(names)


def world_variables(ds: Archive) -> list[str]:
    """The archive's per-world variables (dims ``(world,)``), sorted."""
    return sorted(str(n) for n, v in ds.data_vars.items() if v.dims == ("world",))


def check_overlay(items: Sequence[str], ds: Archive) -> None:
    """Refuse overlay items that are neither built in nor a per-world variable of ``ds``.

    Raises:
        RenderOptionsError: naming the item, the built-in items and the archive's
            per-world variables.
    """
    known = world_variables(ds)
    unknown = [name for name in items if name not in BUILT_IN and name not in known]
    if unknown:
        raise RenderOptionsError(
            f"Cannot overlay {unknown[0]!r}: it is neither a built-in item "
            f"({', '.join(map(repr, BUILT_IN))}) nor a per-world variable of the archive "
            f"(it has {', '.join(map(repr, known)) or 'none'})."
            f"{did_you_mean(unknown[0], (*BUILT_IN, *known))} Pass one of those, or add the "
            "variable to the archive first.")


class OverlayText:
    """The overlay text of every frame of an archive's worlds.

    Args:
        ds: The archive (:func:`flyarchive.open_archive`), or its header
            (:func:`flyarchive.store.opening.open_header`).
        items: Overlay items, checked (:func:`check_overlay`).
        label_world: Put the world id first, also if ``"world"`` is not an item (mosaic
            tiles).
        size: ``(H, W)`` of the frames (of a tile) the text goes into: items that do not
            fit are left out (see the module). None: every item.

    Attributes:
        items: The items shown, in order.
        left_out: The items asked for that do not fit, in order.
    """

    def __init__(self, ds: Archive, items: Sequence[str], *, label_world: bool = False,
                 size: tuple[int, int] | None = None) -> None:
        items = tuple(items)
        if label_world:  # the world label first: kept when the frame is small
            items = ("world", *(name for name in items if name != "world"))
        self._times = np.asarray(ds.time.values, np.float64)
        self._world_ids = np.asarray(ds.world.values)
        self._speed = float(ds.attrs.get("playback_speed", 1.0))
        self._values = {n: np.asarray(ds[n].values) for n in items if n not in BUILT_IN}
        interval = self._speed / float(ds.attrs.get("output_fps", 25.0))
        self._decimals = min(9, max(1, math.ceil(-math.log10(interval)))) if interval > 0 else 3
        self.items, self.left_out, self._size = items, (), size
        if size is not None:
            self.items, self.left_out = self._fit(items, size)

    def _fit(self, items: tuple[str, ...], size: tuple[int, int]
             ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The leading items whose widest texts fit across ``size`` together, and the rest."""
        from flyarchive.replay.compose import max_chars

        room, used = max_chars(size), -1
        for i, name in enumerate(items):
            used += 1 + self._widest(name)
            if used > room:
                return items[:i], items[i:]
        return items, ()

    def _widest(self, name: str) -> int:
        """Characters of the widest text of an item over every world and frame."""
        if name == "time":
            ends = [t for t in (self._times.min(initial=0.0), self._times.max(initial=0.0))
                    if np.isfinite(t)]
            return max(len(f"t={t:.{self._decimals}f}s") for t in ends or [0.0])
        return max((len(self._part(name, w)) for w in range(len(self._world_ids))), default=0)

    @property
    def note(self) -> str:
        """What was left out and why, for the manifest ("" when nothing was)."""
        if not self.left_out or self._size is None:
            return ""
        from flyarchive.replay.compose import max_chars

        height, width = self._size
        room = max_chars(self._size)
        why = (f"{height}-pixel-high frames hold no line of text" if room == 0 else
               f"{width}-pixel-wide frames hold {room} characters")
        return (f"Overlay items {', '.join(map(repr, self.left_out))} left out: {why}. "
                "Render larger frames to show them.")

    def __bool__(self) -> bool:
        return bool(self.items)

    def texts(self, world_index: int, start: int, stop: int) -> list[str]:
        """The texts of frames ``[start, stop)`` (archive indices) of one world."""
        parts = [self._part(name, world_index) for name in self.items]
        if "time" not in self.items:
            return [" ".join(parts)] * (stop - start)
        at = self.items.index("time")
        texts = []
        for k in range(start, stop):
            parts[at] = f"t={self._times[k]:.{self._decimals}f}s" if k < len(self._times) else ""
            texts.append(" ".join(p for p in parts if p))
        return texts

    def _part(self, name: str, world_index: int) -> str:
        if name == "world":
            return f"w{int(self._world_ids[world_index])}"
        if name == "speed":
            return f"x{self._speed:g}"
        if name == "time":
            return ""
        return f"{name}={_format(self._values[name][world_index])}"


def _format(value: Any) -> str:
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (float, np.floating)):
        return f"{float(value):.4g}"
    if isinstance(value, (bytes, np.bytes_)):
        return value.decode(errors="replace")
    return str(value)

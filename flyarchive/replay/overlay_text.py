"""Text burnt into frames, the one home of overlay text: what overlays say, in which font,
where it goes, and how it is burnt on the host (numpy, the OpenGL backend) and on the Warp
device (a kernel, the Warp backends), pixel for pixel alike.

What overlays say, from the archive. Items, in the order asked for, joined by spaces, e.g.
``w3 t=0.152s x0.2 gain=1.25``:

- ``"world"``: the world id, ``w3``;
- ``"time"``: the frame's simulated time (the archive's ``time`` coordinate), ``t=0.152s``,
  with as many decimals as the frame interval needs;
- ``"speed"``: the playback speed (simulated seconds per second of video), ``x0.2``;
- any per-world variable of the archive (a ``(world,)`` variable such as a seed or a
  parameter), ``name=value``.

Mosaics label every tile with its world id first.

How it looks: white, in a 5 x 7 bitmap font drawn for flyarchive (no font file, no font
library: :data:`GLYPHS`, the printable ASCII characters, each in a cell of :data:`CELL_W` x
:data:`CELL_H` pixels), on a box of the frame darkened to half (every channel halved), at
:data:`TEXT_X`, :data:`TEXT_Y` from the top left corner. Text fits its frame (tile): only
whole characters are drawn (:func:`max_chars`); given the frame size, :class:`OverlayText`
keeps the items, in order, whose widest text over the whole archive fits across it and
leaves the rest out (:attr:`OverlayText.left_out`, :attr:`OverlayText.note`); frames too low
for a line of text get none. Nothing is ever cut through a character.

Where it is burnt: :func:`burn_text` into an RGB frame in host memory; on the device,
:func:`device_text_kernel` (built on first use: ``import flyarchive`` and the OpenGL
backend never import Warp), launched by :class:`flyarchive.replay.warp_compose.Composer`
on the packed ARGB frames of a batch, each slot's text read from its state row
(:mod:`flyarchive.replay.warp_rows`, :func:`text_codes`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from flyarchive.errors import RenderOptionsError, did_you_mean
from flyarchive.lru import LRUCache

if TYPE_CHECKING:
    from flyarchive.store.header import Archive


# ----------------------------------------------------------------------------- what it says
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
            (:func:`flyarchive.store.dataset.open_header`).
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


# ----------------------------------------------------------------------------- the font
#: Pixels per character cell: width and height.
CELL_W, CELL_H = 6, 8

# One line per character: the character, a space, then its 7 rows of 5 pixels.
_DRAWN = r"""
  ..... ..... ..... ..... ..... ..... .....
! ..#.. ..#.. ..#.. ..#.. ..#.. ..... ..#..
" .#.#. .#.#. ..... ..... ..... ..... .....
# .#.#. .#.#. ##### .#.#. ##### .#.#. .#.#.
$ ..#.. .#### #.#.. .###. ..#.# ####. ..#..
% ##... ##..# ...#. ..#.. .#... #..## ...##
& .##.. #..#. #.#.. .#... #.#.# #..#. .##.#
' ..#.. ..#.. ..... ..... ..... ..... .....
( ...#. ..#.. .#... .#... .#... ..#.. ...#.
) .#... ..#.. ...#. ...#. ...#. ..#.. .#...
* ..... ..#.. #.#.# .###. #.#.# ..#.. .....
+ ..... ..#.. ..#.. ##### ..#.. ..#.. .....
, ..... ..... ..... ..... .##.. ..#.. .#...
- ..... ..... ..... ##### ..... ..... .....
. ..... ..... ..... ..... ..... .##.. .##..
/ ..... ....# ...#. ..#.. .#... #.... .....
0 .###. #...# #..## #.#.# ##..# #...# .###.
1 ..#.. .##.. ..#.. ..#.. ..#.. ..#.. .###.
2 .###. #...# ....# ...#. ..#.. .#... #####
3 ##### ...#. ..#.. ...#. ....# #...# .###.
4 ...#. ..##. .#.#. #..#. ##### ...#. ...#.
5 ##### #.... ####. ....# ....# #...# .###.
6 ..##. .#... #.... ####. #...# #...# .###.
7 ##### ....# ...#. ..#.. .#... .#... .#...
8 .###. #...# #...# .###. #...# #...# .###.
9 .###. #...# #...# .#### ....# ...#. .##..
: ..... .##.. .##.. ..... .##.. .##.. .....
; ..... .##.. .##.. ..... .##.. ..#.. .#...
< ...#. ..#.. .#... #.... .#... ..#.. ...#.
= ..... ..... ##### ..... ##### ..... .....
> .#... ..#.. ...#. ....# ...#. ..#.. .#...
? .###. #...# ....# ...#. ..#.. ..... ..#..
@ .###. #...# ....# .##.# #.#.# #.#.# .###.
A .###. #...# #...# ##### #...# #...# #...#
B ####. #...# #...# ####. #...# #...# ####.
C .###. #...# #.... #.... #.... #...# .###.
D ###.. #..#. #...# #...# #...# #..#. ###..
E ##### #.... #.... ####. #.... #.... #####
F ##### #.... #.... ####. #.... #.... #....
G .###. #...# #.... #.### #...# #...# .####
H #...# #...# #...# ##### #...# #...# #...#
I .###. ..#.. ..#.. ..#.. ..#.. ..#.. .###.
J ..### ...#. ...#. ...#. ...#. #..#. .##..
K #...# #..#. #.#.. ##... #.#.. #..#. #...#
L #.... #.... #.... #.... #.... #.... #####
M #...# ##.## #.#.# #.#.# #...# #...# #...#
N #...# #...# ##..# #.#.# #..## #...# #...#
O .###. #...# #...# #...# #...# #...# .###.
P ####. #...# #...# ####. #.... #.... #....
Q .###. #...# #...# #...# #.#.# #..#. .##.#
R ####. #...# #...# ####. #.#.. #..#. #...#
S .#### #.... #.... .###. ....# ....# ####.
T ##### ..#.. ..#.. ..#.. ..#.. ..#.. ..#..
U #...# #...# #...# #...# #...# #...# .###.
V #...# #...# #...# #...# #...# .#.#. ..#..
W #...# #...# #...# #.#.# #.#.# #.#.# .#.#.
X #...# #...# .#.#. ..#.. .#.#. #...# #...#
Y #...# #...# .#.#. ..#.. ..#.. ..#.. ..#..
Z ##### ....# ...#. ..#.. .#... #.... #####
[ .###. .#... .#... .#... .#... .#... .###.
\ ..... #.... .#... ..#.. ...#. ....# .....
] .###. ...#. ...#. ...#. ...#. ...#. .###.
^ ..#.. .#.#. #...# ..... ..... ..... .....
_ ..... ..... ..... ..... ..... ..... #####
` .#... ..#.. ..... ..... ..... ..... .....
a ..... ..... .###. ....# .#### #...# .####
b #.... #.... #.##. ##..# #...# #...# ####.
c ..... ..... .###. #.... #.... #...# .###.
d ....# ....# .##.# #..## #...# #...# .####
e ..... ..... .###. #...# ##### #.... .###.
f ..##. .#..# .#... ###.. .#... .#... .#...
g ..... .#### #...# #...# .#### ....# .###.
h #.... #.... #.##. ##..# #...# #...# #...#
i ..#.. ..... .##.. ..#.. ..#.. ..#.. .###.
j ...#. ..... ..##. ...#. ...#. #..#. .##..
k #.... #.... #..#. #.#.. ##... #.#.. #..#.
l .##.. ..#.. ..#.. ..#.. ..#.. ..#.. .###.
m ..... ..... ##.#. #.#.# #.#.# #...# #...#
n ..... ..... #.##. ##..# #...# #...# #...#
o ..... ..... .###. #...# #...# #...# .###.
p ..... ..... ####. #...# ####. #.... #....
q ..... ..... .##.# #..## .#### ....# ....#
r ..... ..... #.##. ##..# #.... #.... #....
s ..... ..... .###. #.... .###. ....# ####.
t .#... .#... ###.. .#... .#... .#..# ..##.
u ..... ..... #...# #...# #...# #..## .##.#
v ..... ..... #...# #...# #...# .#.#. ..#..
w ..... ..... #...# #...# #.#.# #.#.# .#.#.
x ..... ..... #...# .#.#. ..#.. .#.#. #...#
y ..... ..... #...# #...# .#### ....# .###.
z ..... ..... ##### ...#. ..#.. .#... #####
{ ...#. ..#.. ..#.. .#... ..#.. ..#.. ...#.
| ..#.. ..#.. ..#.. ..#.. ..#.. ..#.. ..#..
} .#... ..#.. ..#.. ...#. ..#.. ..#.. .#...
~ ..... ..... .#... #.#.# ...#. ..... .....
"""


def _glyphs() -> np.ndarray:
    table = np.zeros((128, CELL_H, CELL_W), np.uint8)
    for line in _DRAWN.split("\n"):
        if not line:
            continue
        rows = line[2:].split()
        table[ord(line[0]), :len(rows), :5] = [[c == "#" for c in row] for row in rows]
    return table


#: ``(128, CELL_H, CELL_W)`` uint8, 1 where a character's pixel is drawn; indexed by
#: ASCII code (control characters are blank).
GLYPHS = _glyphs()


def text_codes(texts: Sequence[str], max_chars: int) -> np.ndarray:
    """Texts as ``(len(texts), max_chars)`` int32 ASCII codes, 0 after each text's end.

    Characters beyond ``max_chars`` are dropped; characters outside printable ASCII
    become ``?``.
    """
    codes = np.zeros((len(texts), max_chars), np.int32)
    for i, text in enumerate(texts):
        raw = np.frombuffer(text[:max_chars].encode("ascii", "replace"), np.uint8)
        codes[i, :len(raw)] = np.where((raw >= 32) & (raw < 127), raw, ord("?"))
    return codes


# ----------------------------------------------------------------------------- on the host
#: Top left corner of burnt-in text, pixels from the frame's left and top edges.
TEXT_X, TEXT_Y = 2, 2


def text_width(n_chars: int) -> int:
    """Pixels that ``n_chars`` characters take across."""
    return n_chars * CELL_W


def burn_text(frame: np.ndarray, text: str, x: int = TEXT_X, y: int = TEXT_Y) -> None:
    """Burn ``text`` into an RGB frame in place (see the module for the look).

    Args:
        frame: ``(H, W, 3)`` uint8 RGB, host memory; modified.
        text: ASCII text (other characters show as ``?``); empty: nothing changes.
        x, y: Top left corner of the text, pixels.
    """
    height, width = frame.shape[:2]
    text = text[:max_chars((height, width), x, y)]
    if not text:
        return
    codes = text_codes([text], len(text))[0]
    mask = np.hstack(GLYPHS[codes])[: height - y, : width - x].astype(bool)
    box = frame[y:y + mask.shape[0], x:x + mask.shape[1]]
    box >>= 1
    box[mask] = 255


def max_chars(size: tuple[int, int], x: int = TEXT_X, y: int = TEXT_Y) -> int:
    """Whole characters that fit across a frame of ``size = (H, W)`` from ``(x, y)``: 0
    when a glyph's 7 rows do not fit below ``y`` (the last character's blank column may
    fall outside the frame)."""
    height, width = size
    if y + CELL_H - 1 > height or x >= width:
        return 0
    return max(0, (width - x + 1) // CELL_W)


# ----------------------------------------------------------------------------- on the device
#: The ARGB words the kernel writes: white, opaque, and each channel halved.
_WHITE, _OPAQUE, _HALF_MASK = 0xFFFFFFFF, 0xFF000000, 0x7F7F7F7F

_KERNELS: LRUCache[str, Any] = LRUCache(1, name="overlay text kernel")


def device_text_kernel() -> Any:
    """The Warp kernel that burns each slot's text into a batch's packed ARGB frames, as
    :func:`burn_text` does on the host (built once per process, on first use; this imports
    Warp).

    Launched with ``dim=(slots, cameras, chars * CELL_W * CELL_H)``, inputs ``glyphs``
    (:data:`GLYPHS` on the device), ``states`` ``(B, nstate)`` float32 (the texts' ASCII
    codes from column ``text_col``), ``text_col``, ``max_chars``, ``rgb_adr``, ``width``,
    ``height``, ``x0``, ``y0``, and output ``packed`` ``(B, sum of H*W)`` uint32 ARGB.

    Raises:
        MissingDependencyError: Warp is not installed.
    """
    return _KERNELS.get("argb", _build_kernel)


def _build_kernel() -> Any:
    from flyarchive.warp_log import import_warp

    wp = import_warp("Overlay text on the Warp device (flyarchive.replay.overlay_text)")

    @wp.kernel
    def burn_text_argb(
        glyphs: wp.array3d(dtype=wp.uint8),  # (128, CELL_H, CELL_W), 1 = drawn
        states: wp.array2d(dtype=wp.float32),  # (B, nstate): the text's ASCII codes from text_col
        text_col: int,
        max_chars: int,
        rgb_adr: wp.array(dtype=int),  # (n_cameras,)
        width: int,
        height: int,
        x0: int,
        y0: int,
        packed: wp.array2d(dtype=wp.uint32),  # (B, sum of H*W) ARGB, in place
    ):
        """One thread per pixel of a character cell: glyph pixels white, the rest of the cell
        darkened to half, as :func:`burn_text`; only characters whose
        5 x 7 glyph fits in the frame whole are drawn."""
        world, cam, p = wp.tid()
        k = p // (CELL_W * CELL_H)
        q = p - k * CELL_W * CELL_H
        gy = q // CELL_W
        gx = q - gy * CELL_W
        code = int(states[world, text_col + k])
        if code <= 0 or code >= 128:
            return
        if x0 + CELL_W * k + 4 >= width or y0 + 6 >= height:  # the glyph would be cut
            return
        x = x0 + CELL_W * k + gx
        y = y0 + gy
        if x >= width or y >= height:
            return
        i = rgb_adr[cam] + y * width + x
        if glyphs[code, gy, gx] != wp.uint8(0):
            packed[world, i] = wp.uint32(_WHITE)
        else:
            half = (packed[world, i] >> wp.uint32(1)) & wp.uint32(_HALF_MASK)
            packed[world, i] = half | wp.uint32(_OPAQUE)

    return burn_text_argb

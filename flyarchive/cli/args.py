"""What the ``flyarchive`` subcommands share: the parsers of their arguments (worlds, times,
sizes, GPUs, storage options, world variables, ``where`` masks), the arguments of ``render``
(:func:`add_render_arguments`), and their one-line messages on stderr
(:func:`say`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from flyarchive.errors import SelectionError

#: Most world ids one ``--worlds`` selection may name (a range is refused before it is expanded).
MAX_WORLDS = 1_000_000


def parse_worlds(text: str, *, limit: int = MAX_WORLDS,
                 ids: Sequence[int] | None = None) -> list[int]:
    """``"0,3,10-20"`` -> ``[0, 3, 10, ..., 20]``; ``"512-"`` (an open range) -> the ids of
    ``ids`` (the archive's) from 512 on.

    Raises:
        SelectionError: unreadable text, a range whose end is before its start, an open
            range without ``ids`` or that selects none of them, a world named twice, an
            empty selection, or more than ``limit`` ids (checked before any range is
            expanded).
    """
    bounds: list[tuple[int, int | None]] = []
    try:
        for part in text.split(","):
            lo, sep, hi = part.strip().partition("-")
            bounds.append((int(lo), int(hi) if hi else None if sep else int(lo)))
    except ValueError:
        raise SelectionError(
            f"Cannot read worlds {text!r}; write ids and ranges like '0,3,10-20' (or '512-' "
            "for every world from 512 on)."
        ) from None
    closed = [(lo, hi) for lo, hi in bounds if hi is not None]
    backwards = [f"{lo}-{hi}" for lo, hi in closed if hi < lo]
    if backwards:
        raise SelectionError(
            f"The world range {backwards[0]!r} in {text!r} ends before it starts; write START-END."
        )
    count = sum(hi - lo + 1 for lo, hi in closed)
    if count > limit:
        raise SelectionError(
            f"The world selection {text!r} names {count:,} worlds; at most {limit:,} can be "
            "selected at once. Select fewer, or leave --worlds out to take every world."
        )
    worlds: list[int] = []
    for lo, hi in bounds:
        worlds += range(lo, hi + 1) if hi is not None else _open_range(text, lo, ids)
    if not worlds:
        raise SelectionError(f"The world selection {text!r} is empty.")
    if len(set(worlds)) < len(worlds):
        from collections import Counter

        twice = sorted(w for w, n in Counter(worlds).items() if n > 1)
        raise SelectionError(
            f"The world selection {text!r} names world(s) {twice[:10]} more than once; name "
            "each world once."
        )
    return worlds


def _open_range(text: str, lo: int, ids: Sequence[int] | None) -> list[int]:
    """The archive's world ids from ``lo`` on (``--worlds 512-``), in the archive's order."""
    if ids is None:
        raise SelectionError(
            f"The world selection {text!r} has an open range ('{lo}-'), which needs the "
            "archive's world ids; write START-END instead."
        )
    found = [int(w) for w in ids if int(w) >= lo]
    if not found:
        raise SelectionError(
            f"The world range '{lo}-' in {text!r} selects no world: the archive's largest "
            f"world id is {max((int(w) for w in ids), default=None)}."
        )
    return found


def worlds_arg(args: argparse.Namespace, storage_options: dict[str, Any] | None) -> list[int] | None:
    """``--worlds`` of a command on ``args.url``; the archive's world ids are read (its
    header) only for an open range such as ``512-``."""
    if args.worlds is None:
        return None
    ids = None
    if any(part.strip().endswith("-") for part in args.worlds.split(",")):
        from flyarchive.store.dataset import open_header

        ids = [int(w) for w in open_header(path_arg(args.url), storage_options).world.values]
    return parse_worlds(args.worlds, ids=ids)


def path_arg(text: str) -> str:
    """A path or URL as the user gave it, with ``~`` expanded for local paths."""
    return text if "://" in text else os.path.expanduser(text)


def parse_time(text: str) -> tuple[float | None, float | None]:
    """``"0.5:2.0"`` -> ``(0.5, 2.0)``; either side may be empty (open), or ``inf``."""
    lo, sep, hi = text.partition(":")
    try:
        if not sep:
            raise ValueError
        window = (float(lo) if lo.strip() else None, float(hi) if hi.strip() else None)
    except ValueError:
        window = None
    nan = window is not None and any(side is not None and side != side for side in window)
    if window is None or nan:
        raise SelectionError(
            f"Cannot read time window {text!r}{': NaN is no time' if nan else ''}; write "
            "START:END in seconds, e.g. '0.5:2.0' or '1:' (an empty side is open)."
        )
    return window


def parse_gpus(text: str) -> list[int]:
    """``"0,1"`` -> ``[0, 1]``: CUDA device numbers for ``--gpus``.

    Raises:
        RenderOptionsError: not a comma-separated list of whole numbers.
    """
    from flyarchive.errors import RenderOptionsError

    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise RenderOptionsError(
            f"Cannot read GPUs {text!r}; write CUDA device numbers like '0,1' (nvidia-smi "
            "lists them), or leave --gpus out to use every GPU."
        ) from None


def parse_size(text: str) -> tuple[int, int]:
    """``"240x320"`` (height x width) -> ``(240, 320)``."""
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise SelectionError(f"Cannot read size {text!r}; write HEIGHTxWIDTH, e.g. 240x320.") from None
    return h, w


def storage_options_arg(text: str | None, flag: str = "--storage-options"
                        ) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise SelectionError(f"{flag} must be a JSON object ({err}).") from None
    if not isinstance(value, dict):
        raise SelectionError(f"{flag} must be a JSON object, e.g. '{{\"anon\": true}}'.")
    return value


def where_mask(url: str, storage_options: dict[str, Any] | None, world_vars: list[str] | None,
           dofs: list[str] | None) -> Any:
    """The ``where`` mask of ``--where-world-var`` and ``--where-dof`` (None without any)."""
    if not world_vars and not dofs:
        return None
    from flyarchive.query import open_archive
    from flyarchive.query.conditions import where_from_conditions

    return where_from_conditions(open_archive(url, storage_options), world_vars or [], dofs or [])


def _number(text: str) -> float | None:
    from flyarchive.query.conditions import parse_number

    return parse_number(text)


def parse_world_var(text: str) -> tuple[str, Any]:
    """``"success=1,0,1"`` -> ``("success", array([1, 0, 1]))``.

    Values: comma-separated numbers (all whole numbers: int64; else float64, ``nan``
    allowed), ``true`` / ``false`` (bool), or text when no value is a number
    (``genotype=wt,mutA``: str); or ``@file.npy`` / ``@file.json`` (a list, e.g. of
    strings for text that looks like numbers).

    Raises:
        OptionsError: no ``=``, an empty name, numbers mixed with values that are not
            numbers (or with true/false), or a file that cannot be read.
    """
    import numpy as np

    from flyarchive.errors import OptionsError

    name, sep, rhs = text.partition("=")
    name, rhs = name.strip(), rhs.strip()
    how = ("write NAME=V1,V2,... with one value per world (e.g. success=1,0,1, "
           "ok=true,false,true or genotype=wt,mutA,wt), or NAME=@values.npy / NAME=@values.json")
    if not sep or not name or not rhs:
        raise OptionsError(f"Cannot read the world variable {text!r}; {how}.")
    if rhs.startswith("@"):
        return name, _values_file(name, path_arg(rhs[1:]), how)
    items = [item.strip() for item in rhs.split(",")]
    if "" in items:
        raise OptionsError(
            f"Cannot read the world variable {text!r}: value {items.index('') + 1} is empty; "
            f"{how}.")
    if all(item.lower() in ("true", "false") for item in items):
        return name, np.array([item.lower() == "true" for item in items])
    bad = [item for item in items if _number(item) is None or item.lower() in ("true", "false")]
    if len(bad) == len(items):  # no number: text
        return name, np.array(items, dtype=str)
    if bad:
        raise OptionsError(
            f"Cannot read the world variable {text!r}: {bad[0]!r} is not a number, and other "
            "values are (true/false only when every value is one; text only when no value is "
            f"a number: for text that looks like numbers use @values.json); {how}.")
    try:
        return name, np.array([int(item) for item in items], dtype=np.int64)
    except ValueError:  # not all whole numbers: floats
        pass
    except OverflowError:
        raise OptionsError(
            f"Cannot read the world variable {text!r}: a whole number is beyond 64 bits "
            f"(-2**63..2**63-1); write it as a decimal (1e20) to store floats, or as text "
            f"with @values.json; {how}.") from None
    values = np.array([float(item) for item in items], dtype=np.float64)
    huge = [item for item, v in zip(items, values)
            if np.isinf(v) and "inf" not in item.lower()]
    if huge:
        raise OptionsError(
            f"Cannot read the world variable {text!r}: {huge[0]!r} is beyond what a 64-bit "
            f"float holds (about 1.8e308); write inf if you mean infinity; {how}.")
    return name, values


def _values_file(name: str, path: str, how: str) -> Any:
    import numpy as np

    from flyarchive.errors import OptionsError

    try:
        if path.endswith(".npy"):
            return np.load(path, allow_pickle=False)
        if path.endswith(".json"):
            with open(path) as f:
                return np.asarray(json.load(f))
    except (OSError, ValueError) as err:
        raise OptionsError(f"Cannot read the values of {name!r} from {path!r} ({err}).") from None
    raise OptionsError(f"The values of {name!r} come from {path!r}; {how} (.npy or .json).")


def crf_arg(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 51:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer from 0 to 51")
    return int(text)


def add_render_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``flyarchive render`` (but ``--storage-options``)."""
    from flyarchive.replay import BACKENDS, OLD_BACKENDS
    from flyarchive.video import PRESETS

    p.add_argument("url")
    p.add_argument("--model", help="MJCF .xml, spec zip (.mjz) or compiled .mjb (default: the "
                   "model kept in the archive when it was recorded)")
    p.add_argument("--camera", action="append", required=True, help="camera name (repeatable)")
    p.add_argument("--worlds", help="e.g. 0,3,10-20, or 512- for every world from 512 on "
                   "(default all)")
    p.add_argument("--time", help="START:END seconds of simulated time")
    p.add_argument("--where-world-var", action="append", metavar="NAME=VALUE",
                   help="only worlds whose world variable holds: NAME=VALUE, or with != > >= "
                        "< <= (repeatable: all must hold), e.g. success=1 or 'n_frames>0'")
    p.add_argument("--where-dof", action="append", metavar="DOF>VALUE",
                   help="only the frames where a dof's qpos holds, e.g. 'joint>0.5' (= != > "
                        ">= < <=; repeatable); each window of frames is a video of its own")
    p.add_argument("--pad", type=float, default=0.0,
                   help="simulated seconds of context around each --where-dof window "
                        "(windows closer than 2*pad merge; default 0)")
    p.add_argument("--size", default="240x320", help="HEIGHTxWIDTH (default 240x320)")
    p.add_argument("--out", default="videos", help="output folder or fsspec URL")
    p.add_argument("--out-storage-options", metavar="JSON",
                   help="fsspec options of --out as JSON (default: --storage-options when --out "
                        "is of the archive's remote protocol; e.g. a local archive rendered to "
                        "s3:// on another endpoint)")
    p.add_argument("--scheduler", help="Dask scheduler address (default: a local cluster)")
    p.add_argument("--workers", type=int, help="local worker processes (default: opengl: one "
                   "per core; warp-cpu: none, one render thread per core in this process; "
                   "gpu: one per GPU, see --gpus; 0: one thread in this process)")
    p.add_argument("--backend", default="opengl", choices=(*BACKENDS, *OLD_BACKENDS),
                   help="opengl (mujoco.Renderer, bit-exact; default), gpu (mujoco-warp on "
                        "CUDA) or warp-cpu (mujoco-warp on Warp's CPU device); cpu is the "
                        "old name of opengl")
    p.add_argument("--batch-worlds", type=int, metavar="N",
                   help="states per batch of the Warp backends (default: 1024 on gpu, 4 "
                        "on warp-cpu); smaller uses less GPU and pinned host memory")
    p.add_argument("--preset", choices=PRESETS,
                   help="x264 preset (default: veryfast; ultrafast with --backend gpu)")
    p.add_argument("--crf", type=crf_arg, help="x264 quality, 0 (lossless) to 51 (default 18)")
    p.add_argument("--outputs", default="rgb", metavar="rgb,depth,segmentation",
                   help="what to make: rgb (mp4), depth and segmentation (lossless 16-bit "
                        "zarr maps beside the mp4; default rgb)")
    p.add_argument("--mosaic", metavar="ROWSxCOLS",
                   help="tile that many worlds (each at --size) into one video per camera, "
                        "labelled with world ids, e.g. 2x3")
    p.add_argument("--overlay", metavar="time,world,speed,VAR",
                   help="text burnt into the frames: time, world, speed and per-world "
                        "variables (default none)")
    p.add_argument("--overwrite", action="store_true", help="replace existing videos")
    p.add_argument("--resume", action="store_true",
                   help="continue a render into --out that stopped (Ctrl-C, a kill): keep the "
                        "finished videos its manifest lists, render the rest")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--verbose", action="store_true", help="show Warp's initialization and "
                   "kernel-loading messages (hidden by default)")
    p.add_argument("--gpus", help="with --backend gpu and no --scheduler: CUDA device numbers "
                   "to use, e.g. 0,1 (default: every visible GPU, one worker process each with "
                   "its share of the cores; one GPU renders in this process)")


def say(line: str) -> None:
    """``line`` on stderr, never while Warp's start in another thread has captured it."""
    from flyarchive.warp_log import STDERR_LOCK

    with STDERR_LOCK:
        print(line, file=sys.stderr, flush=True)

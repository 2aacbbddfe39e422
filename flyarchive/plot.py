"""Joint traces of one world (``flyarchive plot``), with matplotlib."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from flyarchive.errors import (
    CorruptArchiveError,
    OutputExistsError,
    SelectionError,
    did_you_mean,
    missing_dependency,
)
from flyarchive.query import open_archive
from flyarchive.store.local_files import refuse_inside_archive, write_whole
from flyarchive.store.location import as_url


def _target(out: str | Path, world: int) -> Path:
    """The file to write: inside ``out`` when it is a folder, with ``.png`` when it has no
    suffix (matplotlib would add one and the caller would report another path)."""
    text = os.fspath(out)
    path = Path(text).expanduser()
    if path.is_dir() or text.endswith(("/", os.sep)):
        return path / f"world{world:05d}.png"
    return path if path.suffix else path.with_name(path.name + ".png")


def _traces(url: str, storage_options: Mapping[str, Any] | None, ds: Any, world: int,
            chosen: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Times ``(n,)`` and values ``(n, len(chosen))`` of one world's committed frames.

    Raises:
        CorruptArchiveError: naming the damaged chunk (and its file) when a read fails.
    """
    one = ds.sel(world=world)
    n = int(one.n_frames)
    try:
        return one.time.values[:n], one.qpos.sel(dof=chosen).values[:n]
    except CorruptArchiveError:  # names the variable, worlds, frames and file already
        raise
    except Exception as err:  # a checksum mismatch, bytes that do not decode, a refused file
        from flyarchive.store.localstore import UnsafeFileError
        from flyarchive.store.opener import open_for_reading
        from flyarchive.store.reader import corrupt_read, damaged_chunks

        index = [int(w) for w in ds.world.values].index(world)
        found = damaged_chunks(open_for_reading(url, storage_options)["qpos"], limit=1,
                               region=(slice(index, index + 1), slice(0, n)))
        if found and isinstance(found[0].error, UnsafeFileError):  # names its file already
            raise found[0].error from None
        what = found[0].describe() if found else f"qpos of world {world}"
        raise corrupt_read(url, what, found[0].error if found else err) from None


def plot_traces(
    url: str | os.PathLike[str],
    world: int,
    out: str | Path,
    *,
    dofs: Sequence[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    overwrite: bool = False,
) -> Path:
    """Plot dof traces of one world against simulated time into a PNG.

    Labels are drawn as plain text (a ``$`` in a joint name is not mathtext).

    Args:
        url: Archive URL.
        world: World id.
        out: Image path (``~`` expanded; ``.png`` added when it has no suffix), or an
            existing folder (or one ending in ``/``), which gets ``world{world:05d}.png``.
        dofs: dof labels (default: the first six hinge or slide joints).
        overwrite: Replace an existing file at that path (else it is refused). The image
            is written beside it and moved into place whole.

    Returns:
        The path written.

    Raises:
        SelectionError: unknown world or dof label (the message lists what exists, and
            the closest labels), or a world without committed frames (nothing is written).
        OutputExistsError: something exists at the image's path and ``overwrite`` is False.
        CorruptArchiveError: a chunk of the world's frames is damaged (named, with its file).
        StorageError: the image cannot be written there (one line, the likely fix).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise missing_dependency("matplotlib", "plot", "flyarchive plot") from None
    if isinstance(world, (bool, np.bool_)) or not isinstance(world, (int, np.integer)):
        raise SelectionError(f"world must be a world id (a whole number), got {world!r}.")
    if "://" in os.fspath(out):  # else s3://lab/x.png became a local folder named "s3:"
        raise SelectionError(f"The plot is written to a local file; {os.fspath(out)!r} is a URL. "
                             "Write it to a local path, then copy it where it belongs.")
    url = as_url(url)
    ds = open_archive(url, storage_options)
    ids = [int(w) for w in ds.world.values]
    if world not in ids:
        raise SelectionError(f"World {world!r} is not in the archive; it has {ids[:20]}.")
    if int(ds.n_frames.values[ids.index(world)]) == 0:
        with_frames = [w for w, n in zip(ids, ds.n_frames.values) if n > 0]
        raise SelectionError(
            f"World {world} of {url!r} has no committed frames, so there are no traces to "
            f"plot (nothing was recorded for it, or its recorder was never closed). Worlds "
            f"with frames: {with_frames[:20] or 'none'}. Nothing was written.")
    labels = [str(d) for d in ds.dof.values]
    layout = ds.attrs["layout"]
    hinges = [n for n, t in zip(layout["joint_names"], layout["joint_types"]) if t in ("hinge", "slide")]
    chosen = list(dofs) if dofs else hinges[:6] or labels[:6]
    unknown = [d for d in chosen if d not in labels]
    if unknown:
        raise SelectionError(
            f"dof label(s) {unknown} are not in the archive.{did_you_mean(unknown[0], labels)} "
            f"Labels: {', '.join(labels[:30])}{'...' if len(labels) > 30 else ''}."
        )
    target = _target(out, world)
    refuse_inside_archive(target, "--out (out=...)")
    if os.path.lexists(target) and not overwrite:
        raise OutputExistsError(
            f"{str(target)!r} exists. Pass --overwrite (overwrite=True) to replace it, or "
            "another --out.")
    times, values = _traces(url, storage_options, ds, world, chosen)
    with matplotlib.rc_context({"text.parse_math": False, "text.usetex": False}):
        fig, ax = plt.subplots(figsize=(8, 4), dpi=100)
        try:
            kinds = fig.canvas.get_supported_filetypes()
            if target.suffix[1:].lower() not in kinds:
                raise SelectionError(
                    f"Cannot write a plot to {str(target)!r}: matplotlib writes "
                    f"{', '.join(kinds)}. Name the file with one of these suffixes, e.g. "
                    "traces.png."
                )
            for i, label in enumerate(chosen):
                ax.plot(times, values[:, i], label=label)
            ax.set_xlabel("simulated time (s)")
            ax.set_ylabel(_y_label(chosen, layout))
            ax.set_title(f"world {world}")
            # beside the axes: long dof names neither hide traces nor are cut off
            ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
            fig.tight_layout()
            # StorageError (cannot write there) says what is wrong in one line
            write_whole(target, lambda tmp: fig.savefig(
                tmp, format=target.suffix[1:].lower(), bbox_inches="tight"))
        finally:
            plt.close(fig)
    return target


def _y_label(chosen: list[str], layout: Any) -> str:
    """The y axis's label for these dofs: their units (:func:`flyarchive.layout.dof_units`)."""
    from flyarchive.layout import dof_units

    units = dof_units(layout)
    shown = dict.fromkeys(units.get(d) or "1" for d in chosen)
    return f"qpos ({', '.join(shown)})"

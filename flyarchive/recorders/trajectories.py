"""What a recording holds, read back as flygym ``RecordedTrajectory`` objects: the
``trajectory`` / ``trajectories`` that flygym's simulations read from their recorder."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from flyarchive.errors import SelectionError, missing_dependency
from flyarchive.query import open_archive
from flyarchive.query.selection import parse_world_ids
from flyarchive.store.location import as_url


def read_trajectories(
    url: str | os.PathLike[str],
    storage_options: Mapping[str, Any] | None = None,
    *,
    worlds: Sequence[int] | None = None,
) -> list[Any]:
    """Committed frames of worlds of an archive as flygym ``RecordedTrajectory`` objects.

    Args:
        url: Archive URL.
        storage_options: Passed to fsspec.
        worlds: World ids (default: every world), in the order returned.

    Returns:
        One ``flygym.recording.RecordedTrajectory`` per world: ``time`` (n,) the
        simulation time of each frame (``sim_time``; ``time`` for archives without it),
        ``qpos`` (n, nq) and mocap poses as stored, ``output_fps``, ``playback_speed``
        and ``world_id``. Only committed frames.

    Raises:
        MissingDependencyError: if flygym is not installed.
        SelectionError: for a world id that is not in the archive, or ``worlds`` that are
            not whole numbers each given once.
    """
    try:
        from flygym.recording import RecordedTrajectory
    except ImportError:
        raise missing_dependency("flygym", "flygym", "Reading flygym trajectories") from None
    asked = parse_world_ids(worlds)
    url = as_url(url)
    ds = open_archive(url, storage_options)
    ids = [int(w) for w in ds.world.values]
    chosen = ids if asked is None else asked
    unknown = [w for w in chosen if w not in ids]
    if unknown:
        raise SelectionError(f"World(s) {unknown} are not in {url!r}; it has worlds {ids[:20]}.")
    fps = float(ds.attrs["output_fps"])
    times = ds["sim_time"] if "sim_time" in ds.variables else ds["time"]
    out = []
    for w in chosen:
        one = ds.sel(world=w)
        n = int(one.n_frames)
        mocap = "mocap_pos" in ds
        out.append(RecordedTrajectory(
            time=np.asarray(times.values[:n]),
            qpos=np.asarray(one.qpos.values[:n]),
            output_fps=int(fps) if fps.is_integer() else fps,  # type: ignore[arg-type]
            playback_speed=float(ds.attrs["playback_speed"]),
            world_id=w,
            mocap_pos=np.asarray(one.mocap_pos.values[:n]) if mocap else None,
            mocap_quat=np.asarray(one.mocap_quat.values[:n]) if mocap else None,
        ))
    return out

"""``flyarchive.positions``: keypoint positions of every world of an archive, as a lazy
(dask) DataArray whose chunks follow the archive's (built by
:mod:`~flyarchive.analyze.prepare`); values kept beside the archive (``flyarchive
positions``, :mod:`~flyarchive.analyze.keep`) are read instead when they match the request.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from flyarchive.analyze.keep import stored_positions
from flyarchive.analyze.keypoints import KeypointRequest, PointSpec
from flyarchive.analyze.prepare import as_positions, check_backend, lazy_positions, prepare

if TYPE_CHECKING:
    import mujoco
    import xarray as xr

#: Values per chunk of kept positions that :func:`computed_positions` gives (float64: 24 MB).
_KEPT_CHUNK_VALUES = 3_000_000


def positions(
    source: str | xr.Dataset,
    bodies: str | Iterable[str] | None = None,
    sites: str | Iterable[str] | None = None,
    points: Mapping[str, PointSpec] | None = None,
    *,
    leg: str | Iterable[str] | None = None,
    segment: str | Iterable[str] | None = None,
    fly: str | Iterable[str] | None = None,
    worlds: Sequence[int] | None = None,
    time: tuple[float | None, float | None] | None = None,
    model: mujoco.MjModel | None = None,
    storage_options: Mapping[str, Any] | None = None,
    orientations: bool = False,
    backend: str = "cpu",
    stored: bool = True,
) -> xr.DataArray | xr.Dataset:
    """Positions of keypoints of every world and frame of an archive, lazily (dask).

    Example: ``flyarchive.positions("run.zarr", "nmf/c_thorax",
    points=flyarchive.tarsus_tips())`` gives the thorax and the six tarsus tips of
    NeuroMechFly; ``flyarchive.positions("run.zarr", leg="lf")`` every body of the left
    front leg.

    Args:
        source: The archive's URL (any fsspec URL), or its dataset from
            :func:`flyarchive.open_archive` (a selection of it too).
        bodies: Body names (positions of their origins, MuJoCo's ``xpos``); ``"*"``: every
            body but the world. None: every body when no sites or points are asked for,
            else none.
        sites: Site names (MuJoCo's ``site_xpos``).
        points: ``{label: (body, (x, y, z))}``: points fixed in a body's frame, the offset
            in that frame in the model's length unit; ``(body, "tip")``: the point of the
            body's geoms farthest from its origin (:func:`flyarchive.tarsus_tips`).
        leg, segment, fly: Keep the keypoints whose label reads ``{fly}/{leg}_{segment}``
            with these values (any case), as :func:`flyarchive.select_dofs` does.
        worlds: World ids (None: every world).
        time: ``(start, end)`` simulated seconds, inclusive (None on a side: open).
        model: The compiled model the archive was recorded with; None: the one kept
            beside the archive. A given model is checked against the archive's layout.
        storage_options: Passed to fsspec.
        orientations: Also give each keypoint's orientation: then a Dataset with
            ``position`` and ``orientation`` ``(world, time, keypoint, wxyz)`` (w, x, y,
            z: a body's ``xquat``; a site's times its ``site_quat``; a point's is its
            body's).
        backend: ``"cpu"`` (``mujoco.mj_kinematics``, float64, bit-exact with a live
            ``MjData``), ``"warp-cpu"`` (mujoco-warp on Warp's CPU device) or ``"gpu"``
            (mujoco-warp on CUDA): float32, within 1e-4 of the CPU's values for
            NeuroMechFly (mm), tested.
        stored: Read positions kept beside the archive (``flyarchive positions URL``)
            when they hold these keypoints of this model for every committed frame
            (CPU values serve every backend). False: always compute.

    Returns:
        ``position`` ``(world, time, keypoint, xyz)`` in the model's length unit
        (millimetres for NeuroMechFly), dask-backed: chunks are the archive's (a shard of
        worlds by several chunks of frames); NaN for frames past a world's ``n_frames``.
        Coordinates: the archive's ``world``, ``time`` (and ``sim_time``, ``frame``),
        ``keypoint`` labels with ``keypoint_kind`` (``body``, ``site``, ``point``) and
        ``keypoint_body``. With ``orientations``, a Dataset (see above).

        Called while a ``distributed.Client`` is the default, the model is sent to its
        workers now, once per client and model, and every computation of the result (or
        of arrays made from it) sends only its key (:mod:`flyarchive.models.shipping`).
        The result then computes on that client or in this process (any scheduler, also
        after the client closed); on another cluster or in a process pool, a
        ModelLoadError says so: call this again with that client as the default.

    Raises:
        SelectionError: an unknown body or site (with close names and those that exist),
            a point in a body that does not exist, a selector that keeps nothing, unknown
            worlds or a time window outside the recording.
        ModelLoadError: no model given and the archive keeps none.
        LayoutMismatchError: the model does not fit the archive.
        OptionsError: an unknown backend.
        MissingDependencyError: a Warp backend without mujoco-warp (``flyarchive[gpu]``).
    """
    check_backend(backend)
    request = KeypointRequest.of(bodies, sites, points, leg=leg, segment=segment, fly=fly)
    prepared = prepare(source, request, worlds=worlds, time=time, model=model,
                       storage_options=storage_options)
    if stored and prepared.url is not None:
        kept = stored_positions(prepared, orientations=orientations, backend=backend)
        if kept is not None:
            return kept
    return as_positions(prepared, lazy_positions(prepared, orientations, backend),
                        orientations, backend)


def computed_positions(
    source: str | xr.Dataset,
    bodies: str | Iterable[str] | None = None,
    points: Mapping[str, PointSpec] | None = None,
    *,
    worlds: Sequence[int] | None = None,
    time: tuple[float | None, float | None] | None = None,
    model: mujoco.MjModel | None = None,
    storage_options: Mapping[str, Any] | None = None,
    backend: str = "cpu",
    processes: int | None = None,
) -> xr.DataArray:
    """:func:`positions` (no orientations), computed into host memory: on the CPU by
    this process and worker processes (:mod:`~flyarchive.analyze.cpu_processes`:
    bit-exact with one process) when the window can be read by them, else by dask's
    scheduler as :func:`positions` would be.

    Args:
        source, bodies, points, worlds, time, model, storage_options, backend: As for
            :func:`positions`.
        processes: Worker processes beside this one; 0: none (dask's scheduler); None:
            one per other usable core when the window holds at least
            :data:`~flyarchive.analyze.cpu_processes.AUTO_FRAMES` frames.

    Returns:
        ``position`` ``(world, time, keypoint, xyz)`` as :func:`positions` gives it,
        numpy-backed; kept positions (:func:`flyarchive.keep_positions`) are read when a
        chunk of them is asked for (dask chunks of whole worlds, about
        :data:`_KEPT_CHUNK_VALUES` values each, each one read of the stored group: a
        caller going through the worlds a chunk at a time holds one chunk in memory).
        Raises as :func:`positions` does.
    """
    check_backend(backend)
    request = KeypointRequest.of(bodies, None, points)
    prepared = prepare(source, request, worlds=worlds, time=time, model=model,
                       storage_options=storage_options)
    kept = None if prepared.url is None else \
        stored_positions(prepared, orientations=False, backend=backend,
                         chunk_values=_KEPT_CHUNK_VALUES)
    if kept is not None:
        return kept
    if backend == "cpu":
        from flyarchive.analyze.cpu_processes import cpu_positions_in_processes, worth_processes

        count = worth_processes(prepared) if processes is None else processes
        values = cpu_positions_in_processes(prepared, False, count) if count > 0 else None
        if values is not None:
            return as_positions(prepared, values, False, backend)  # type: ignore[return-value]
    return as_positions(prepared, lazy_positions(prepared, False, backend), False,
                        backend).compute()

"""Keep positions: compute them once and store them beside the archive (a derived group,
``derived/positions-<hash>/``) or as an archive of their own, and read them back.

:func:`keep_positions` walks the archive's frames one chunk of frames at a time (every
world), computes that block's keypoints (in parallel, as the lazy array does) and commits
it with the store's :class:`~flyarchive.store.derived.DerivedWriter`: chunks, times,
then ``n_frames``. A killed run loses at most the block it was writing; running it again
resumes after the last committed frame, and extends the group when the archive has
grown since. Running it again also repairs: the group is read back as ``verify`` reads
it, committed frames that do not read back are recomputed (whole shards), and a group
whose metadata, labels or times are damaged, or that no longer matches the archive, is
made anew; each is said (``on_repair``). :func:`stored_positions` is how
:func:`flyarchive.positions` finds them: only groups of this archive, of the same
model, whose metadata and coordinates are sound; reads of damaged chunks fail.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from flyarchive.analyze.keypoints import KeypointRequest, PointSpec
from flyarchive.analyze.prepare import (
    UNITS,
    Prepared,
    as_positions,
    check_backend,
    lazy_positions,
    prepare,
)

if TYPE_CHECKING:
    import mujoco
    import xarray as xr

#: What a derived group of positions is, in its ``derived`` attribute.
KIND = "positions"


def provenance(prepared: Prepared, orientations: bool, backend: str) -> dict[str, Any]:
    """The ``derived`` attribute of kept positions: what they are and what made them."""
    return {"kind": KIND, "keypoints": prepared.keypoints.definitions(),
            "model_sha256": prepared.model.identity, "orientations": bool(orientations),
            "backend": backend, "units": UNITS,
            "source_archive_id": prepared.ds.attrs.get("archive_id")}


def keep_positions(
    url: str,
    bodies: str | Iterable[str] | None = None,
    sites: str | Iterable[str] | None = None,
    points: Mapping[str, PointSpec] | None = None,
    *,
    leg: Any = None,
    segment: Any = None,
    fly: Any = None,
    to: str | None = None,
    model: mujoco.MjModel | None = None,
    storage_options: Mapping[str, Any] | None = None,
    to_storage_options: Mapping[str, Any] | None = None,
    orientations: bool = False,
    backend: str = "cpu",
    overwrite: bool = False,
    takeover: bool = False,
    on_block: Callable[[int, int], None] | None = None,
    on_repair: Callable[[str], None] | None = None,
) -> str:
    """Compute keypoint positions of every committed frame and store them.

    Kept beside the archive (default) as ``{url}/derived/positions-<hash>`` (the hash of
    the request: keypoint definitions, model, orientations, backend), where
    :func:`flyarchive.positions` finds them; or as a new archive at ``to``, read with
    :func:`open_positions`. Running it again resumes an interrupted run, extends the
    stored frames when the archive has grown, and repairs what is damaged: committed
    frames that do not read back (a chunk missing, bytes that fail their checksum) are
    recomputed, shard by shard; a group whose metadata, labels, commit markers or times
    are damaged, or that no longer matches the archive, is made anew. Good frames of
    this group, and every other group, are left as they are.

    Args:
        url: The archive.
        bodies, sites, points, leg, segment, fly: The keypoints, as for
            :func:`flyarchive.positions`.
        to: Another URL to write them to (an archive of positions); None: beside the archive.
        model: The compiled model; None: the one kept beside the archive.
        storage_options, to_storage_options: fsspec options of ``url`` and ``to``
            (``to`` defaults to ``storage_options`` when it is of the same protocol, as
            another key of the same bucket; a local ``to`` of an ``s3://`` archive to none).
        orientations: Keep orientations too.
        backend: ``"cpu"``, ``"warp-cpu"`` or ``"gpu"`` (as :func:`flyarchive.positions`).
        overwrite: Replace other positions kept at ``to`` (or at the derived group); never
            a recorded archive (the source included) nor what flyarchive did not write.
        takeover: Take over the claim of a writer that crashed on another host.
        on_block: Called ``(frames committed, frames in all)`` after each committed block.
        on_repair: Called with one sentence for each repair (a group made anew, frames
            recomputed) before it is made.

    Returns:
        The URL of the stored positions.

    Raises:
        As :func:`flyarchive.positions`; ArchiveExistsError when something else is at
        ``to`` (nothing is changed); ArchiveInUseError when another writer holds it.
    """
    from flyarchive.store.derived import (
        DerivedSource,
        DerivedSpec,
        DerivedWriter,
        derived_url,
        make_parent,
        stored_chunks,
    )
    from flyarchive.store.location import protocol

    check_backend(backend)
    request = KeypointRequest.of(bodies, sites, points, leg=leg, segment=segment, fly=fly)
    prepared = prepare(str(url), request, model=model, storage_options=storage_options)
    made = provenance(prepared, orientations, backend)
    digest = hashlib.sha256(json.dumps(made, sort_keys=True).encode()).hexdigest()[:16]
    ds = prepared.ds
    if to is None:
        target, options = derived_url(str(url), f"{KIND}-{digest}"), storage_options
        make_parent(str(url), storage_options)
    else:
        target = str(to)
        options = to_storage_options if to_storage_options is not None else \
            storage_options if protocol(target) == protocol(str(url)) != "file" else None
        _check_apart(str(url), target)
    chunk_frames, shard_worlds = stored_chunks(str(url), storage_options)
    spec = DerivedSpec(dict(ds.attrs), made, prepared.keypoints.labels,
                       tuple(int(w) for w in ds.world.values), orientations,
                       "float64" if backend == "cpu" else "float32",
                       chunk_frames=chunk_frames, shard_worlds=shard_worlds)
    say = on_repair if on_repair is not None else (lambda text: None)
    with DerivedWriter.open(target, spec, storage_options=options, takeover=takeover,
                            overwrite=overwrite, source=DerivedSource.of(ds, str(url)),
                            owned=to is None) as writer:
        if writer.remade is not None:
            say(f"Made {target} anew: {writer.remade}")
        for damage in writer.damaged():
            (w0, w1), (t0, t1) = damage.worlds, damage.frames
            say(f"Recomputing worlds {w0}..{w1 - 1}, frames {t0}..{t1 - 1} of {target}: "
                f"{damage.text}")
            _recompute(writer, prepared, damage, orientations, backend)
        _fill(writer, prepared, orientations, backend, spec.chunk_frames, on_block)
    return target


def _block(prepared: Prepared, worlds: slice, frames: slice, orientations: bool,
           backend: str) -> Any:
    """The derived block of the archive's ``worlds`` over ``frames``, computed."""
    from flyarchive.store.derived import DerivedBlock

    ds = prepared.ds
    part = Prepared(ds.isel(world=worlds, time=frames), prepared.url, prepared.model,
                    prepared.keypoints, prepared.storage_options)
    # aligned: an array a Dask cluster sends back may not be (pcodec refuses it)
    values = np.require(lazy_positions(part, orientations, backend).compute(),
                        requirements="A")
    times = {name: part.ds[name].values if name in part.ds.coords else None
             for name in ("time", "sim_time", "frame")}
    return DerivedBlock(times["time"], values[..., :3], values[..., 3:] if orientations else None,
                        sim_time=times["sim_time"], frame=times["frame"])


def _recompute(writer: Any, prepared: Prepared, damage: Any, orientations: bool,
               backend: str) -> None:
    """The damaged frames (a whole shard) computed again and written over."""
    (w0, w1), (t0, t1) = damage.worlds, damage.frames
    t1 = min(t1, int(prepared.ds.sizes["time"]))
    block = _block(prepared, slice(w0, w1), slice(t0, t1), orientations, backend)
    writer.rewrite(block, (w0, w1), t0)


def _fill(writer: Any, prepared: Prepared, orientations: bool, backend: str, chunk: int,
          on_block: Callable[[int, int], None] | None) -> None:
    """Commit every block of frames after the writer's last committed one."""
    ds = prepared.ds
    n_time, n_frames = int(ds.sizes["time"]), ds.n_frames.values
    t0 = writer.n_frames
    while t0 < n_time:
        t1 = min(n_time, (t0 // chunk + 1) * chunk)
        block = _block(prepared, slice(None), slice(t0, t1), orientations, backend)
        writer.write(block, n_frames=np.minimum(n_frames, t1))
        t0 = t1
        if on_block is not None:
            on_block(t1, n_time)


def open_positions(url: str, storage_options: Mapping[str, Any] | None = None
                   ) -> xr.DataArray | xr.Dataset:
    """Positions kept by :func:`keep_positions` (a derived group or an archive of
    positions), lazily: ``position`` (and a Dataset with ``orientation`` when kept).

    A group kept beside an archive (``<archive>/derived/<name>``) is checked against it.

    Raises:
        ArchiveNotFoundError: nothing at ``url``.
        SchemaError: not kept positions, or damaged metadata or labels (as
            :func:`flyarchive.store.derived.open_derived`).
        CorruptArchiveError: damaged commit markers or times, a group that does not match
            its archive (another archive's...); when computing, committed frames missing
            or damaged. Each says what to do: `flyarchive positions` again recomputes them.
    """
    from flyarchive.errors import SchemaError
    from flyarchive.store.derived import open_derived

    kept = open_derived(str(url), storage_options)
    derived = kept.attrs["derived"]
    if derived.get("kind") != KIND or "position" not in kept:
        raise SchemaError(
            f"{str(url)!r} holds derived values of another kind ({str(derived.get('kind'))[:40]!r}"
            "), not positions. Make positions with flyarchive.keep_positions or `flyarchive "
            "positions`.")
    kinds = {d.get("label"): (str(d.get("kind", "")), str(d.get("body", "")))
             for d in derived.get("keypoints", [])}  # each an object: validate_derived
    labels = [str(v) for v in kept.keypoint.values]
    kept = kept.assign_coords(keypoint_kind=("keypoint", [kinds.get(k, ("", ""))[0] for k in labels]),
                              keypoint_body=("keypoint", [kinds.get(k, ("", ""))[1] for k in labels]))
    attrs = {"units": derived.get("units", UNITS), "model_sha256": derived.get("model_sha256"),
             "backend": derived.get("backend"), "stored": str(url)}
    position = kept.position.assign_attrs(attrs)
    if "orientation" not in kept:
        return position
    orientation = kept.orientation.assign_attrs({**attrs, "units": "quaternion"})
    return position.to_dataset().assign(orientation=orientation).assign_attrs(attrs)


def stored_positions(prepared: Prepared, *, orientations: bool, backend: str,
                     chunk_values: int | None = None) -> xr.DataArray | xr.Dataset | None:
    """The request's positions read from a derived group kept beside the archive, if one
    holds its keypoints (same definitions), of the same model (its identity) and archive,
    for every committed frame of the window's worlds (and orientations if asked); else
    None. Positions computed on the CPU serve every backend; Warp's serve Warp's backends.
    A group of another archive is never read; one of this archive and request whose
    metadata or coordinates are damaged is refused (as :func:`open_positions`), and a read
    of its damaged chunks fails, saying to recompute it. ``chunk_values``: positions only,
    in dask chunks of whole worlds of about this many values, each read by one call of the
    group's reader (:func:`~flyarchive.store.derived.state_getter`: one task per chunk,
    straight into its array); None: chunks as the group stores them."""
    import dask.array as da

    from flyarchive.store.derived import (
        DerivedSource,
        find_derived,
        open_derived_group,
        state_getter,
    )

    ds, kp = prepared.ds, prepared.keypoints
    whole = prepared.whole if prepared.whole is not None else ds
    wanted = {d["label"]: d for d in kp.definitions()}
    for group_url, derived, n_frames in find_derived(prepared.url, prepared.storage_options):
        have = {d.get("label"): d for d in derived.get("keypoints", []) if isinstance(d, dict)}
        if derived.get("kind") != KIND or derived.get("model_sha256") != prepared.model.identity \
                or derived.get("source_archive_id") != ds.attrs.get("archive_id") \
                or (orientations and not derived.get("orientations")) \
                or derived.get("backend") not in ("cpu", backend) \
                or any(have.get(label) != d for label, d in wanted.items()):
            continue
        kept, opened = open_derived_group(group_url, prepared.storage_options,
                                          source=DerivedSource.of(whole, prepared.url))
        n_frames = kept.n_frames.values
        ids = [int(w) for w in kept.world.values]
        if not set(int(w) for w in ds.world.values) <= set(ids):
            continue
        at = [ids.index(int(w)) for w in ds.world.values]
        if not np.array_equal(n_frames[at], ds.n_frames.values):
            continue  # the archive has grown since (or the group is not finished)
        frames = np.searchsorted(kept.time.values, ds.time.values)
        if frames.size and (frames.max() >= kept.sizes["time"]
                            or not np.array_equal(kept.time.values[frames], ds.time.values)):
            continue
        stored = [str(k) for k in kept.keypoint.values]
        picked = np.asarray([stored.index(label) for label in kp.labels])
        if chunk_values is not None and not orientations:
            reader = state_getter(group_url, prepared.storage_options, kept, opened, "position")
            picks = _Selection(reader, np.asarray(at), frames, picked)
            per = max(1, chunk_values // max(1, len(frames) * len(picked) * 3))
            data = da.from_array(picks, chunks=(per, -1, -1, -1), asarray=False,
                                 inline_array=True, meta=np.empty((0, 0, 0, 0), picks.dtype),
                                 name=f"kept-{group_url}-{hash(picks.key)}")
            return as_positions(prepared, data, False, backend, stored=group_url)
        pick = kept.isel(world=_as_slice(np.asarray(at)), time=_as_slice(frames),
                         keypoint=_as_slice(picked))
        data = pick.position.data
        if orientations:
            data = da.concatenate([data, pick.orientation.data.astype(data.dtype)], axis=-1)
        return as_positions(prepared, data, orientations, backend, stored=group_url)
    return None


class _Selection:
    """A selection of worlds, frames and keypoints of a kept group's reader, as an array
    for dask (``(world, time, keypoint, xyz)``): each read is one read of the reader."""

    def __init__(self, reader: Any, worlds: np.ndarray, frames: np.ndarray,
                 keypoints: np.ndarray) -> None:
        self.reader, self.worlds, self.frames, self.keypoints = reader, worlds, frames, keypoints
        self.shape = (len(worlds), len(frames), len(keypoints), 3)
        self.dtype = reader.dtype
        self.ndim = 4
        self.key = (worlds.tobytes(), frames.tobytes(), keypoints.tobytes())

    def __getitem__(self, key: tuple[slice, ...]) -> np.ndarray:
        w, t, k, xyz = (tuple(key) + (slice(None),) * 4)[:4]
        return self.reader[_as_slice(self.worlds[w]), _as_slice(self.frames[t]),
                           _as_slice(self.keypoints[k]), xyz]


def _as_slice(index: np.ndarray) -> slice | np.ndarray:
    """Consecutive indices as a slice (a selection the reader takes as it is, reading only
    the chunks it touches), else the indices."""
    if index.size and np.array_equal(index, np.arange(index[0], index[0] + index.size)):
        return slice(int(index[0]), int(index[0]) + index.size)
    return index


def _check_apart(url: str, to: str) -> None:
    """``to`` is neither inside the archive at ``url`` nor holds it (the archive itself is
    refused where it is found: a recording is never replaced).

    Raises:
        OutputLocationError: it is.
    """
    from flyarchive.errors import OutputLocationError
    from flyarchive.store.location import protocol

    if protocol(to) == "file":
        from flyarchive.store.local_files import refuse_nested_archive

        refuse_nested_archive(os.path.expanduser(to.removeprefix("file://")))  # another's
    if protocol(to) == "file" and protocol(url) == "file":
        here, there = (os.path.realpath(os.path.expanduser(p.removeprefix("file://")))
                       for p in (to, url))
    else:
        here, there = to.rstrip("/"), url.rstrip("/")
    if here != there and (here.startswith(there + "/") or there.startswith(here + "/")):
        inside = here.startswith(there + "/")
        raise OutputLocationError(
            f"--to {to!r} is {'inside' if inside else 'a folder holding'} the archive at "
            f"{url!r}: positions kept there would {'be written into' if inside else 'replace'} "
            "it. Pass --to a place beside it, e.g. "
            f"{url.rstrip('/').removesuffix('.zarr')}-positions.zarr. Nothing was written.")

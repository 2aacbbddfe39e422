"""The nodes of a new archive: its arrays planned from its spec, their metadata built
by zarr, and every node written with one round of concurrent requests per step.

Creating an archive writes (after its root group, :mod:`~flyarchive.store.writer`):

1. the ``zarr.json`` of every array but ``n_frames``, of the ``claims`` group and of the
   ``models`` group, and the kept model's bytes, both forms
   (:mod:`~flyarchive.models.kept`);
2. the values written at creation: labels (``dof``, ``mocap``...), ``world``, world
   variables, and the frame schedule of an archive of fixed capacity;
3. ``n_frames``'s ``zarr.json``, the marker that the creation completed, and its chunks of
   zeros (no frame committed) with it.

The writes of a step go concurrently; a step starts once every write of the one before
it has finished (:func:`~flyarchive.store.location.settled`). Nothing is looked up first:
the creator holds the archive's claim and found its location empty (or emptied it), so
there is nothing to find. What was written is handed to the writer
(:class:`Created`), which reads none of it back.

zarr builds an array's metadata only while it creates the array: each array is created
once in a scratch in-memory store, which gives the very metadata
:meth:`zarr.Group.create_array` stores. The metadata built is kept for the life of the
process, by the options it was built from (and zarr's configuration), so that an
archive created with the options of an earlier one (many short recordings of one model)
builds none again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
import zarr.api.asynchronous
import zarr.storage
from zarr.abc.codec import BaseCodec

from flyarchive import codecs
from flyarchive.archive_spec import ArchiveSpec, world_var_dtype
from flyarchive.schema import TIME_COORDS, WHOLE_ATTR
from flyarchive.lru import LRUCache
from flyarchive.store.creation import claims_metadata
from flyarchive.models.entries import MODELS_GROUP, model_entry, models_metadata, portable_entry
from flyarchive.store.location import settled, sync
from flyarchive.zarr_internals import (
    ArrayV3Metadata,
    GroupMetadata,
    default_buffer_prototype,
    save_metadata,
)


@dataclass(frozen=True)
class Created:
    """What :func:`create_arrays` made, as the writer of the new archive keeps it.

    Attributes:
        arrays: Every array, by name, opened on the archive's store.
        members: The metadata of every node under the root (the arrays, the ``claims``
            group, the ``models`` group if a model is kept), for the consolidated copy.
        world_ids: The values written to ``world``.
    """

    arrays: dict[str, zarr.Array]
    members: dict[str, ArrayV3Metadata | GroupMetadata]
    world_ids: tuple[int, ...]


def create_arrays(group: zarr.Group, spec: ArchiveSpec) -> Created:
    """Every node of a new archive under its root ``group``, the model kept by content
    (if any), ``n_frames`` (the completion marker) last (see the module's docstring).

    Raises:
        OSError (and the storage's client errors): the storage failed; once every write
        has finished.
    """
    groups = {"claims": claims_metadata(world_blocks=bool(spec.capacity_frames))}
    objects = {}
    if spec.model is not None:
        objects[model_entry(spec.model)["path"]] = spec.model
    if spec.portable is not None:
        objects[portable_entry(spec.portable)["path"]] = spec.portable.blob
    if objects:
        groups[MODELS_GROUP] = models_metadata()
    planned = _planned_arrays(spec)
    marker = planned.pop()  # n_frames
    arrays = sync(_store(group, planned, groups, objects))
    arrays.update(sync(_store(group, [marker], {}, {}, at_once=True)))
    members: dict[str, ArrayV3Metadata | GroupMetadata] = dict(groups)
    members.update((name, arr.metadata) for name, arr in arrays.items())
    return Created(arrays, members, spec.world_ids)


#: An array to create: its name, :meth:`zarr.Group.create_array`'s options, its values
#: (None: none written at creation).
_Planned = tuple[str, dict[str, Any], Any]


def _planned_arrays(spec: ArchiveSpec) -> list[_Planned]:
    """Every array of a new archive, in the order of its creation; ``n_frames`` last."""
    nw, nq, nm, ct = spec.n_worlds, spec.layout.nq, spec.layout.nmocap, spec.chunk_frames
    sw = min(spec.shard_worlds, nw)
    nt = spec.capacity_frames or 0

    def state_array(name: str, tail: tuple[int, ...], dims: list[str]) -> _Planned:
        state = codecs.array_codecs(spec.codec, np.dtype(spec.dtype), ndim=len(dims))
        return name, dict(
            shape=(nw, nt, *tail), dtype=spec.dtype, chunks=(1, ct, *tail),
            shards=(sw, ct, *tail), fill_value=np.nan, dimension_names=dims,
            attributes={"coordinates": " ".join(TIME_COORDS)}, **state,
        ), None

    planned = [state_array("qpos", (nq,), ["world", "time", "dof"])]
    if nm:
        planned += [state_array("mocap_pos", (nm, 3), ["world", "time", "mocap", "xyz"]),
                    state_array("mocap_quat", (nm, 4), ["world", "time", "mocap", "wxyz"]),
                    _label_array("mocap", spec.layout.mocap_names),
                    _label_array("xyz", ("x", "y", "z")),
                    _label_array("wxyz", ("w", "x", "y", "z"))]
    planned.append(_label_array("dof", spec.layout.dof_labels))
    crc = {"compressors": [zarr.codecs.Crc32cCodec()]}
    schedule: dict[str, Any] = {"time": None, "sim_time": None, "frame": None}
    if nt:  # several writers: the schedule's times, written once, never resized
        steps = np.array([spec.timing.frame_step(k) for k in range(nt)])
        schedule = {"time": spec.timing.frame_times(np.arange(nt)),
                    "sim_time": steps * spec.timing.timestep, "frame": np.arange(nt)}
    planned += [
        ("time", dict(shape=(nt,), dtype="float64", chunks=(ct,), fill_value=np.nan,
                      dimension_names=["time"],
                      attributes={"description": "scheduled simulation time, s"}, **crc),
         schedule["time"]),
        ("sim_time", dict(shape=(nt,), dtype="float64", chunks=(ct,), fill_value=np.nan,
                          dimension_names=["time"],
                          attributes={"description": "simulation time when recorded, s"}, **crc),
         schedule["sim_time"]),
        ("frame", dict(shape=(nt,), dtype="int64", chunks=(ct,), fill_value=-1,
                       dimension_names=["time"],
                       attributes={"description": "index on the frame schedule (-1: unknown)"},
                       **crc),
         schedule["frame"]),
        ("world", dict(shape=(nw,), dtype="int64", chunks=(nw,), fill_value=-1,
                       dimension_names=["world"], **crc),
         np.asarray(spec.world_ids, dtype=np.int64)),
    ]
    for name, values in spec.world_vars.items():  # checked by the spec (world_var_array)
        planned.append((name, dict(shape=values.shape, dtype=world_var_dtype(values),
                                   chunks=values.shape, dimension_names=["world"],
                                   attributes={WHOLE_ATTR: True}, **crc), values))
    # One chunk per shard of worlds when several writers share the archive (each writes
    # its own), else one chunk: a reader opens it with one request.
    # Its zeros are written (with its zarr.json, at once): a writer killed in its first
    # commit, between the frames' chunks and n_frames, leaves frames past n_frames = 0 to
    # redo, not a missing commit-marker file, which reads as one lost.
    planned.append(("n_frames", dict(shape=(nw,), dtype="int64", chunks=(sw if nt else nw,),
                                     fill_value=0, dimension_names=["world"],
                                     attributes={"description": "committed frames per world"},
                                     **crc), np.zeros(nw, dtype=np.int64)))
    return planned


def _label_array(name: str, labels: Sequence[str]) -> _Planned:
    return name, dict(shape=(len(labels),), dtype=str, chunks=(max(len(labels), 1),),
                      dimension_names=[name]), np.array(labels, dtype=str) if labels else None


async def _store(group: zarr.Group, planned: list[_Planned], groups: Mapping[str, GroupMetadata],
                 objects: Mapping[str, bytes], *, at_once: bool = False
                 ) -> dict[str, zarr.Array]:
    """Write ``planned`` arrays, ``groups`` and ``objects`` (bytes by key) under
    ``group``: every metadata document and object, then the arrays' values (with
    ``at_once``, all together: one round of requests)."""
    built = {name: await _metadata(name, options) for name, options, _ in planned}
    paths = {name: group.store_path / name for name in built}
    proto = default_buffer_prototype()
    documents = [*(save_metadata(paths[name], meta) for name, meta in built.items()),
                 *(save_metadata(group.store_path / name, meta) for name, meta in groups.items()),
                 *((group.store_path / key).set(proto.buffer.from_bytes(blob))
                   for key, blob in objects.items())]
    if not at_once:
        await settled(documents)
        documents = []
    # every chunk written, even one of fill values only: a missing chunk is then damage
    whole = {"write_empty_chunks": True}
    arrays = {name: zarr.AsyncArray(meta, paths[name], config=whole)
              for name, meta in built.items()}
    await settled([*documents, *(arrays[name].setitem(slice(None), values)
                                 for name, _, values in planned if values is not None)])
    return {name: zarr.Array(arr) for name, arr in arrays.items()}


# ----------------------------------------------------------------------------- metadata
#: Most metadata kept (the least recently used is dropped first).
MAX_BUILT = 256
#: Array metadata zarr built, by :func:`_options_key` of the options it was built from.
_BUILT: LRUCache[str, ArrayV3Metadata] = LRUCache(MAX_BUILT, name="array metadata zarr built")


async def _metadata(name: str, options: Mapping[str, Any]) -> ArrayV3Metadata:
    """The metadata :meth:`zarr.Group.create_array` stores for ``options``: built by zarr
    in a scratch in-memory store, or kept from an earlier build with the same options."""
    key = _options_key(options)
    meta = _BUILT.peek(key) if key is not None else None
    if meta is None:  # built here (an await), then kept: the cache's own get makes synchronously
        scratch = zarr.storage.MemoryStore()
        meta = (await zarr.api.asynchronous.create_array(scratch, name=name, **options)).metadata
        if key is not None:
            _BUILT.put(key, meta)
    else:
        _BUILT.get(key, lambda: meta)  # the most recently used now
    return meta


def _options_key(options: Mapping[str, Any]) -> str | None:
    """A text that differs whenever the metadata zarr builds from ``options`` may: every
    option (codecs as their class and their metadata, dtypes as numpy writes them), zarr's
    array configuration and its codec registry. None for an option it cannot write down
    (nothing is then kept)."""
    def plain(value: Any) -> Any:
        if isinstance(value, BaseCodec):
            return ["codec", type(value).__module__, type(value).__qualname__, value.to_dict()]
        if isinstance(value, np.dtype):
            return ["dtype", value.str]
        if isinstance(value, type):
            return ["type", value.__module__, value.__qualname__]
        if isinstance(value, np.generic):
            return ["scalar", value.dtype.str, value.item()]
        raise TypeError(f"{type(value).__name__} is not written down")

    try:
        return json.dumps([options, zarr.__version__, zarr.config.get("array"),
                           zarr.config.get("codecs")], sort_keys=True, default=plain)
    except (TypeError, ValueError):
        return None


def forget_built() -> None:
    """Drop every metadata kept (the next creation builds it again)."""
    _BUILT.clear()

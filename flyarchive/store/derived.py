"""Derived groups: values computed from an archive (keypoint positions), kept beside it as
``derived/<name>/`` or as an archive of their own, written and committed as recordings are.

A derived group is laid out as an archive (``zarr.json`` with the source's schema
attributes, ``time``, ``sim_time``, ``frame``, ``world``, ``n_frames`` as commit marker,
``claims/``), with its own state arrays: ``position`` ``(world, time, keypoint, xyz)`` and,
on request, ``orientation`` ``(world, time, keypoint, wxyz)``, and the ``keypoint`` labels.
Its attribute ``derived`` holds the provenance: what it is (``"positions"``), the keypoint
definitions, the SHA-256 of the model, the backend, the source archive's ``archive_id``
and the flyarchive version (in ``versions``).

:class:`DerivedWriter` is the store's :class:`~flyarchive.store.writer.ArchiveWriter` on
those arrays: the same claim (one writer at a time), the same commit protocol (chunks,
then times, then ``n_frames``, then the consolidated metadata), so a killed writer loses
at most the block it was writing, and :meth:`DerivedWriter.open` resumes after the last
committed frame. :func:`open_derived` reads one back lazily, frames past ``n_frames``
masked inside the read; :func:`find_derived` lists the groups kept beside an archive.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr

from flyarchive import codecs
from flyarchive.errors import ArchiveExistsError, FlyarchiveError, SchemaError, StorageError
from flyarchive.layout import ModelLayout
from flyarchive.store import storage_errors
from flyarchive.store.claims import WRITER_KEY, claim_archive
from flyarchive.store.consolidated import consolidate
from flyarchive.store.creation import claims_group, clear, package_versions, undo
from flyarchive.store.location import access_denied, open_store, sync
from flyarchive.store.reader import open_checked, open_group
from flyarchive.store.writer import ArchiveWriter

if TYPE_CHECKING:
    import xarray as xr

#: The group under an archive's root that holds its derived groups.
DERIVED_GROUP = "derived"
#: Attributes of the source archive a derived group does not copy.
_NOT_COPIED = ("model", "archive_id", "created", "derived", "npz_import")


def derived_url(url: str, name: str) -> str:
    """The URL of the derived group ``name`` of the archive at ``url``."""
    return f"{url.rstrip('/')}/{DERIVED_GROUP}/{name}"


@dataclass(frozen=True)
class DerivedSpec:
    """What is fixed when a derived group is created.

    Attributes:
        source_attrs: The source archive's root attributes (schema, timing, layout...).
        provenance: The ``derived`` attribute: ``kind``, ``keypoints`` (definitions),
            ``model_sha256``, ``orientations``, ``backend``, ``source_archive_id``...
        labels: The ``keypoint`` coordinate.
        world_ids: The source's world ids.
        orientations: Whether an ``orientation`` array is kept too.
        dtype: ``"float64"`` or ``"float32"``.
        chunk_frames, shard_worlds: As the source's state (chunks follow the archive's).
    """

    source_attrs: Mapping[str, Any] = field(repr=False)
    provenance: Mapping[str, Any]
    labels: tuple[str, ...]
    world_ids: tuple[int, ...]
    orientations: bool = False
    dtype: str = "float64"
    chunk_frames: int = 100
    shard_worlds: int = 64


@dataclass(frozen=True)
class DerivedBlock:
    """Frames of every world of a derived group, host arrays.

    Attributes:
        time, sim_time, frame: ``(n,)`` the source's times of the frames.
        position: ``(worlds, n, K, 3)``.
        orientation: ``(worlds, n, K, 4)`` or None.
    """

    time: np.ndarray
    position: np.ndarray
    orientation: np.ndarray | None = None
    sim_time: np.ndarray | None = None
    frame: np.ndarray | None = None


class DerivedWriter(ArchiveWriter):
    """Appends and commits frames of a derived group (see the module's docstring)."""

    STATE = ("position", "orientation")

    @classmethod
    def open(cls, url: str, spec: DerivedSpec, *,
             storage_options: Mapping[str, Any] | None = None, takeover: bool = False,
             overwrite: bool = False) -> "DerivedWriter":
        """Create the derived group at ``url``, or resume it when it holds the same request.

        Args:
            url: Where: a derived group's URL (:func:`derived_url`) or a new archive's.
            spec: What it holds.
            overwrite: Replace what is at ``url`` whatever it is.
            takeover: Take over the claim of a writer that crashed on another host.

        Raises:
            ArchiveExistsError: something else is at ``url`` (another kind of object, or
                values derived from another request or archive), naming both; nothing
                is changed.
            ArchiveInUseError: another writer holds it.
        """
        url = str(url)
        try:
            with storage_errors.translated(url, storage_options):
                return cls._open(url, spec, storage_options, takeover, overwrite)
        except PermissionError as err:
            raise access_denied(url, err) from None
        except OSError as err:
            if isinstance(err, FlyarchiveError):
                raise
            raise StorageError(f"Cannot write derived values at {url!r} ({type(err).__name__}: "
                               f"{err}). Choose a location that is writable.") from None

    @classmethod
    def _open(cls, url: str, spec: DerivedSpec, storage_options: Mapping[str, Any] | None,
              takeover: bool, overwrite: bool) -> "DerivedWriter":
        store = open_store(url, storage_options)
        there = _what_is_there(store, spec)
        if there == "other" and not overwrite:
            raise ArchiveExistsError(
                f"Something that is not these derived values is at {url!r} (another archive, "
                "other keypoints, another model, or values of another archive); flyarchive "
                "never overwrites without being asked. Choose another URL, or pass "
                "overwrite=True (--overwrite) to replace it.")
        writer = claim_archive(store, url, takeover=takeover)
        claim = ([WRITER_KEY], writer)
        ours = there != "same"
        try:
            if there == "same":
                group = open_group(url, storage_options, mode="r+")
                return cls(group, url, ModelLayout.from_attrs(group.attrs["layout"]), claim=claim)
            if there != "empty":
                sync(clear(store))
            group = zarr.create_group(store, attributes=_root_attrs(spec), zarr_format=3)
            _create_arrays(group, spec)
            consolidate(group, n_time=0)
            return cls(group, url, ModelLayout.from_attrs(group.attrs["layout"]), claim=claim)
        except BaseException:
            undo(store, claim, ours)
            raise

    def _check_block(self, block: Any) -> int:
        n = len(block.time)
        k = int(self._group["keypoint"].shape[0])
        for name, width in (("position", 3), ("orientation", 4)):
            if name not in self._state:
                continue
            got = getattr(block, name)
            want = (self.n_worlds, n, k, width)
            if got is None or np.shape(got) != want:
                raise ValueError(f"{name} has shape {np.shape(got)}; the group needs {want}.")
        return n


def _what_is_there(store: zarr.abc.store.Store, spec: DerivedSpec) -> str:
    """``"empty"``, ``"same"`` (a derived group of this request), ``"interrupted"`` (its
    creation did not finish: made anew) or ``"other"``."""
    raw = sync(store.get("zarr.json", prototype=zarr.core.buffer.default_buffer_prototype()))
    if raw is None:
        async def anything() -> bool:
            async for name in store.list_dir(""):
                if name != "claims":
                    return True
            return False

        return "other" if sync(anything()) else "empty"
    import json

    try:
        derived = json.loads(raw.to_bytes())["attributes"]["derived"]
    except (ValueError, KeyError, TypeError):
        return "other"
    if derived != dict(spec.provenance):
        return "other"
    return "same" if sync(store.exists("n_frames/zarr.json")) else "interrupted"


def _root_attrs(spec: DerivedSpec) -> dict[str, Any]:
    attrs = {k: v for k, v in spec.source_attrs.items() if k not in _NOT_COPIED}
    attrs.update(versions=package_versions(), archive_id=uuid.uuid4().hex,
                 created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                 derived=dict(spec.provenance))
    return attrs


def _create_arrays(group: zarr.Group, spec: DerivedSpec) -> None:
    """The arrays of a new derived group; ``n_frames`` (the commit marker) last."""
    nw, k, ct = len(spec.world_ids), len(spec.labels), spec.chunk_frames
    sw = min(spec.shard_worlds, nw)
    crc = {"compressors": [zarr.codecs.Crc32cCodec()]}
    claims_group(group, world_blocks=False)

    def state(name: str, width: int, dims: list[str]) -> None:
        group.create_array(
            name, shape=(nw, 0, k, width), dtype=spec.dtype, chunks=(1, ct, k, width),
            shards=(sw, ct, k, width), fill_value=np.nan, dimension_names=dims,
            attributes={"coordinates": "sim_time frame"},
            **codecs.array_codecs("lossless", np.dtype(spec.dtype), ndim=4))

    state("position", 3, ["world", "time", "keypoint", "xyz"])
    if spec.orientations:
        state("orientation", 4, ["world", "time", "keypoint", "wxyz"])
    for name, labels in (("keypoint", spec.labels), ("xyz", ("x", "y", "z")),
                         ("wxyz", ("w", "x", "y", "z"))):
        arr = group.create_array(name, shape=(len(labels),), dtype=str,
                                 chunks=(max(len(labels), 1),), dimension_names=[name])
        arr[:] = np.array(labels, dtype=str)
    for name, dtype, fill in (("time", "float64", np.nan), ("sim_time", "float64", np.nan),
                              ("frame", "int64", -1)):
        group.create_array(name, shape=(0,), dtype=dtype, chunks=(ct,), fill_value=fill,
                           dimension_names=["time"], **crc)
    group.create_array("world", shape=(nw,), dtype="int64", chunks=(nw,), fill_value=-1,
                       dimension_names=["world"], **crc)[:] = np.asarray(spec.world_ids)
    group.create_array("n_frames", shape=(nw,), dtype="int64", chunks=(nw,), fill_value=0,
                       dimension_names=["world"],
                       attributes={"description": "committed frames per world"}, **crc)


def stored_chunks(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[int, int]:
    """``(frames per chunk, worlds per shard)`` of the archive's stored ``qpos``."""
    qpos = open_group(url, storage_options)["qpos"]
    return int(qpos.chunks[1]), int((qpos.shards or qpos.chunks)[0])


def make_parent(url: str, storage_options: Mapping[str, Any] | None = None) -> None:
    """The archive's ``derived`` group (a zarr group, so that zarr lists it), made if missing.

    Raises:
        ArchiveNotFoundError, SchemaError: no archive at ``url``.
    """
    group = open_group(url, storage_options, mode="r+")
    if DERIVED_GROUP in group:
        return
    try:
        zarr.create_group(group.store, path=DERIVED_GROUP, attributes={
            "description": "values derived from the archive (flyarchive positions...)"})
    except zarr.errors.ContainsGroupError:
        pass  # made by another process at the same moment


# ----------------------------------------------------------------------------- reading
def find_derived(url: str, storage_options: Mapping[str, Any] | None = None
                 ) -> list[tuple[str, dict[str, Any], np.ndarray]]:
    """The derived groups kept beside the archive at ``url``: ``(url, provenance,
    n_frames)`` of each whose creation finished; ``[]`` when there are none."""
    try:  # the archive's consolidated metadata may predate its derived groups: not used
        root = open_group(url, storage_options, consolidated=False)
        parent = root.get(DERIVED_GROUP)
    except (FlyarchiveError, KeyError, OSError):
        return []
    if not isinstance(parent, zarr.Group):
        return []
    found = []
    for name, node in sorted(parent.groups()):
        derived = node.attrs.get("derived")
        if not isinstance(derived, dict) or "n_frames" not in node:
            continue
        found.append((derived_url(url, name), derived, np.asarray(node["n_frames"][:])))
    return found


def open_derived(url: str, storage_options: Mapping[str, Any] | None = None) -> xr.Dataset:
    """A derived group (or positions archive) as a lazy dataset: ``position`` (and
    ``orientation``) as dask arrays whose chunks are the stored shards of worlds by
    chunks of frames, frames past each world's ``n_frames`` NaN; ``n_frames``, the
    coordinates and the attributes (``derived``: the provenance) read.

    Raises:
        ArchiveNotFoundError: nothing at ``url``.
        SchemaError: not a derived group (no ``derived`` attribute), or metadata that
            flyarchive does not write.
    """
    import dask.array as da
    import xarray as xr

    from flyarchive.store.dataset import CommittedFrames

    group = open_checked(url, storage_options)
    if not isinstance(group.attrs.get("derived"), dict) or "position" not in group:
        raise SchemaError(
            f"{url!r} holds no derived positions (no 'derived' attribute or 'position' array). "
            "Make them with flyarchive.keep_positions or `flyarchive positions`.")
    n_frames = np.asarray(group["n_frames"][:]).astype(np.int64)
    n_time = min(int(n_frames.max(initial=0)), int(group["time"].shape[0]))
    n_frames = n_frames.clip(0, n_time)
    coords = {name: (name, np.asarray(group[name][:])) for name in ("world", "keypoint", "xyz")}
    for name in ("time", "sim_time", "frame"):
        coords[name] = ("time", np.asarray(group[name][:n_time]))
    variables: dict[str, Any] = {"n_frames": ("world", n_frames)}
    for name, dims in (("position", ("world", "time", "keypoint", "xyz")),
                       ("orientation", ("world", "time", "keypoint", "wxyz"))):
        if name not in group:
            continue
        arr = group[name]
        masked = None if (n_frames == n_time).all() else n_frames
        getter = CommittedFrames(arr, name, masked, n_time, coords["world"][1], url, storage_options)
        chunks = (int(arr.shards[0]), int(arr.chunks[1]), *arr.shape[2:])
        variables[name] = (dims, da.from_array(getter, chunks=chunks, asarray=False,
                                               meta=np.empty((0,) * 4, arr.dtype),
                                               name=f"flyarchive-derived-{name}-{_token(group, n_frames)}"))
    if "orientation" in variables:
        coords["wxyz"] = ("wxyz", np.asarray(group["wxyz"][:]))
    return xr.Dataset(variables, coords=coords, attrs=group.attrs.asdict())


def _token(group: zarr.Group, n_frames: np.ndarray) -> str:
    from dask.base import tokenize

    return tokenize(group.attrs.get("archive_id"), n_frames.tobytes())

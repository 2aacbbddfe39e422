"""Derived groups: values computed from an archive (keypoint positions), kept beside it as
``derived/<name>/`` or as an archive of their own, written and committed as recordings are.

A derived group is laid out as an archive (``zarr.json`` with the source's schema
attributes, ``time``, ``sim_time``, ``frame``, ``world``, ``n_frames`` as commit marker,
``claims/``), with its own state arrays: ``position`` ``(world, time, keypoint, xyz)`` and,
on request, ``orientation`` ``(world, time, keypoint, wxyz)``, and the ``keypoint`` labels.
Its attribute ``derived`` holds the provenance: what it is (``"positions"``), the keypoint
definitions, the model's identity (``model_sha256``: :func:`model_identity`), the backend,
the source archive's ``archive_id`` and the flyarchive version (in ``versions``).

Derived values are held to the archive's guarantees, by the readers of the states
themselves, not by a check per kind: every array of dims ``(world, time, ...)``
(:func:`flyarchive.schema.is_state`) is read by
:func:`~flyarchive.store.dataset.read_dataset`, so a missing chunk, shard or index entry
inside ``n_frames`` fails the read (:mod:`~flyarchive.store.chunk_holes`) and every byte is
checksummed; the group's metadata passes :mod:`~flyarchive.store.allowlist` (the state
pipelines) and the checks of ``n_frames``, extents and times at open
(:mod:`~flyarchive.store.coordinates`); :func:`flyarchive.schema.validate_derived` holds
its labels to its provenance; and :func:`source_problems` holds it to its archive
(:class:`DerivedSource`): the same ``archive_id``, layout and worlds, no frame committed
that the archive has not, the same times. ``verify`` runs all of it
(:mod:`~flyarchive.store.integrity`).

:class:`DerivedWriter` is the store's :class:`~flyarchive.store.writer.ArchiveWriter` on
those arrays: the same claim (one writer at a time), the same commit protocol (chunks,
then times, then ``n_frames``, then the consolidated metadata), so a killed writer loses
at most the block it was writing, and :meth:`DerivedWriter.open` resumes after the last
committed frame; a group whose metadata, labels or times are damaged, or that no longer
matches its archive, it makes anew (:attr:`DerivedWriter.remade` says why), and
:meth:`DerivedWriter.damaged` and :meth:`DerivedWriter.rewrite` let the caller recompute
committed frames that do not read back, whole shards at a time. :func:`open_derived`
reads one back lazily, checked, frames past ``n_frames`` masked inside the read;
:func:`find_derived` lists the groups kept beside an archive.
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
from flyarchive.errors import (
    ArchiveExistsError,
    CorruptArchiveError,
    FlyarchiveError,
    SchemaError,
    StorageError,
)
from flyarchive.layout import ModelLayout
from flyarchive.schema import (
    DERIVED_ATTR,
    DERIVED_GROUP,
    SCHEMA_NAME,
    TIME_COORDS,
    damage_advice,
    derived_source_url,
    validate_derived,
)
from flyarchive.store import storage_errors
from flyarchive.store.claims import WRITER_KEY, claim_archive
from flyarchive.store.consolidated import consolidate
from flyarchive.store.creation import (
    claims_group,
    clear,
    foreign,
    package_versions,
    refuse_strangers,
    undo,
)
from flyarchive.models import PORTABLE_MODEL_ATTR, model_identity
from flyarchive.store.location import absolute_url, as_url, open_store, settled, sync, write_faults
from flyarchive.store.opener import open_for_reading, open_for_writing
from flyarchive.store.reader import StateDamage, state_damage
from flyarchive.store.writer import ArchiveWriter
from flyarchive.zarr_internals import default_buffer_prototype

if TYPE_CHECKING:
    import xarray as xr

    from flyarchive.store.header import ArchiveHeader

#: Attributes of the source archive a derived group does not copy (the kept models'
#: entries name objects of the archive, not of the group).
_NOT_COPIED = ("model", PORTABLE_MODEL_ATTR, "archive_id", "created", DERIVED_ATTR,
               "npz_import", "codec")


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
    """Appends and commits frames of a derived group (see the module's docstring).

    Attributes:
        remade: Why the group of this request that was at the URL was made anew (one
            line: what was damaged or did not match the archive); None when it was
            resumed as it was, or created.
    """

    STATE = ("position", "orientation")
    remade: str | None = None

    @classmethod
    def open(cls, url: str, spec: DerivedSpec, *,
             storage_options: Mapping[str, Any] | None = None, takeover: bool = False,
             overwrite: bool = False, source: DerivedSource | None = None,
             owned: bool = False) -> "DerivedWriter":
        """Create the derived group at ``url``, or resume it when it holds the same request.

        A group of the same request that cannot be extended as it is (its metadata,
        labels, commit markers or times damaged, or not matching ``source``:
        :func:`unsound`) is made anew, and :attr:`remade` says why; its chunks are not
        read here (:meth:`damaged`).

        Args:
            url: Where: a derived group's URL (:func:`derived_url`) or a new archive's.
            spec: What it holds.
            overwrite: Replace the derived values of another request at ``url`` (never a
                recorded archive, nor what flyarchive did not write).
            takeover: Take over the claim of a writer that crashed on another host.
            source: The archive the values are computed from, as opened; None: a group
                there is checked alone.
            owned: ``url`` is flyarchive's own name for this request
                (``<archive>/derived/<kind>-<hash of the request>``, :func:`derived_url`):
                what is there and is not a group of this request (no ``zarr.json``, its
                provenance changed) is a damaged one, made anew (:attr:`remade`).

        Raises:
            ArchiveExistsError: something else is at ``url`` (another kind of object, or
                values derived from another request or archive), naming both, unless
                ``owned`` or ``overwrite``; nothing is changed.
            ArchiveInUseError: another writer holds it.
        """
        url = as_url(url)
        with write_faults(url, storage_options, "Writing derived values at",
                          "Choose a location that is writable."):
            return cls._open(url, spec, storage_options, takeover, overwrite, source, owned)

    @classmethod
    def _open(cls, url: str, spec: DerivedSpec, storage_options: Mapping[str, Any] | None,
              takeover: bool, overwrite: bool, source: DerivedSource | None, owned: bool
              ) -> "DerivedWriter":
        store = open_store(url, storage_options)
        there = _what_is_there(store, spec)
        if there == "foreign" and not owned:
            raise foreign(url)
        if there == "recording":
            raise ArchiveExistsError(
                f"A recorded archive is at {url!r} (the archive these values come from, or "
                "another); derived values never replace a recording, overwrite or not. "
                "Nothing was changed. Choose another URL (e.g. beside it: "
                f"{url.rstrip('/').removesuffix('.zarr')}-positions.zarr).")
        if there == "other" and not overwrite and not owned:
            raise ArchiveExistsError(
                f"Something that is not these derived values is at {url!r} (another archive, "
                "other keypoints, another model, or values of another archive); flyarchive "
                "never overwrites without being asked. Choose another URL, or pass "
                "overwrite=True (--overwrite) to replace it.")
        writer = claim_archive(store, url, takeover=takeover)
        claim = ([WRITER_KEY], writer)
        ours = there != "same"
        try:
            remade = unsound(url, storage_options, source) if there == "same" else None
            if there in ("other", "foreign") and owned and not overwrite:
                remade = ("What was there is not a derived group of this request: its root "
                          "zarr.json is missing or unreadable, or its provenance was changed.")
            if there == "same" and remade is None:
                group = open_for_writing(url, storage_options)
                return cls(group, url, ModelLayout.from_attrs(group.attrs["layout"]), claim=claim)
            if there != "empty" and not owned:  # (its own derived/ folder: the archive's)
                refuse_strangers(store, url)
            ours = True  # what was there is replaced: derived values, recomputed
            if there != "empty":
                sync(clear(store))
            group = zarr.create_group(store, attributes=_root_attrs(spec), zarr_format=3)
            _create_arrays(group, spec)
            consolidate(group, n_time=0)
            made = cls(group, url, ModelLayout.from_attrs(group.attrs["layout"]), claim=claim)
            made.remade = remade
            return made
        except BaseException:
            undo(store, claim, ours)
            raise

    def damaged(self) -> list[StateDamage]:
        """The committed frames of the group that do not read back (a chunk, shard or index
        entry missing, bytes that fail their checksum, values not finite), one entry per
        shard (its first finding), read as ``verify`` reads them.

        Raises:
            StorageError: the storage failed (not the group's fault).
        """
        n_frames = np.asarray(self._arrays["n_frames"][:], dtype=np.int64)
        found: dict[tuple[tuple[int, int], tuple[int, int]], StateDamage] = {}
        with storage_errors.translated(self.url):
            for name in self._state:
                for damage in state_damage(self._arrays[name], name, n_frames):
                    found.setdefault((damage.worlds, damage.frames), damage)
        return [found[key] for key in sorted(found)]

    def rewrite(self, block: DerivedBlock, worlds: tuple[int, int], start: int) -> None:
        """Write committed frames again, e.g. once recomputed: every state array of worlds
        ``worlds[0]..worlds[1]-1`` over frames ``start..start+n-1`` (``n`` the block's
        frames), whole shards (as :meth:`damaged` names them). Times and commit markers
        are not changed.

        Raises:
            ValueError: a block that does not fit the region, or frames outside the
                stored ones.
            StorageError: the storage failed; what was committed stays committed.
        """
        w0, w1 = (int(w) for w in worlds)
        t0, n = int(start), len(block.time)
        k = int(self._group["keypoint"].shape[0])
        if t0 < 0 or n == 0 or t0 + n > self._extent or not 0 <= w0 < w1 <= self.n_worlds:
            raise ValueError(f"Frames {t0}..{t0 + n - 1} of worlds {w0}..{w1 - 1} are not "
                             f"stored ({self._extent} frames of {self.n_worlds} worlds).")
        for name, width in (("position", 3), ("orientation", 4)):
            got = getattr(block, name)
            if name in self._state and (got is None or np.shape(got) != (w1 - w0, n, k, width)):
                raise ValueError(f"{name} has shape {np.shape(got)}; the region needs "
                                 f"{(w1 - w0, n, k, width)}.")
        region = (slice(w0, w1), slice(t0, t0 + n))
        try:
            sync(settled([self._arrays[name].async_array.setitem(region, getattr(block, name))
                          for name in self._state]))
        except (OSError, RuntimeError, TimeoutError, *storage_errors.client_errors()) as err:
            raise StorageError(
                f"Writing frames {t0}..{t0 + n - 1} of worlds {w0}..{w1 - 1} again to "
                f"{self.url!r} failed ({err!r}); retry.") from err

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
    creation did not finish: made anew), ``"other"`` (another request's derived group),
    ``"recording"`` (a recorded archive: never replaced) or ``"foreign"`` (anything
    else: never replaced but in an archive's own ``derived/`` folder)."""
    raw = sync(store.get("zarr.json", prototype=default_buffer_prototype()))
    if raw is None:
        async def anything() -> bool:
            async for name in store.list_dir(""):
                if name != "claims":
                    return True
            return False

        return "foreign" if sync(anything()) else "empty"
    import json

    try:
        attributes = json.loads(raw.to_bytes())["attributes"]
        derived = attributes.get(DERIVED_ATTR)
        made_here = derived is not None or attributes.get("flyarchive_schema") == SCHEMA_NAME
    except (ValueError, KeyError, TypeError, AttributeError):
        return "foreign"
    if not made_here:
        return "foreign"
    if derived is None:
        return "recording"
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
            attributes={"coordinates": "sim_time frame"}, **codecs.plain_codecs())

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
    qpos = open_for_reading(url, storage_options, attributes_only=True)["qpos"]
    return int(qpos.chunks[1]), int((qpos.shards or qpos.chunks)[0])


def make_parent(url: str, storage_options: Mapping[str, Any] | None = None) -> None:
    """The archive's ``derived`` group (a zarr group, so that zarr lists it), made if missing.

    Raises:
        ArchiveNotFoundError, SchemaError: no archive at ``url``.
        StorageError: the storage refused or failed the write (one line, the fix).
    """
    group = open_for_writing(url, storage_options)
    if DERIVED_GROUP in group:
        return
    try:
        with write_faults(url, storage_options, "Making the group of derived values in",
                          "Nothing else was written; keep them elsewhere with --to (to=...)."):
            zarr.create_group(group.store, path=DERIVED_GROUP, attributes={
                "description": "values derived from the archive (flyarchive positions...)"})
    except zarr.errors.ContainsGroupError:
        pass  # made by another process at the same moment


# ----------------------------------------------------------------------------- checking
@dataclass(frozen=True)
class DerivedSource:
    """The archive a derived group is checked against, as read when it was opened.

    Attributes:
        url: The archive's URL.
        attrs: Its root attributes (``archive_id``, ``layout``, ``model``...).
        world: ``(world,)`` int64 world ids.
        n_frames: ``(world,)`` int64 committed frames.
        times: ``time`` (and ``sim_time``, ``frame``) of its committed frames, ``(n,)``
            with ``n`` the largest ``n_frames``.
    """

    url: str
    attrs: Mapping[str, Any] = field(repr=False)
    world: np.ndarray = field(repr=False)
    n_frames: np.ndarray = field(repr=False)
    times: Mapping[str, np.ndarray] = field(repr=False)

    @classmethod
    def of(cls, ds: xr.Dataset | ArchiveHeader, url: str) -> "DerivedSource":
        """From the archive's dataset or header, as opened (not a window of it)."""
        times = {n: np.asarray(ds[n].values) for n in ("time", *TIME_COORDS) if n in ds.variables}
        return cls(str(url), dict(ds.attrs), np.asarray(ds["world"].values),
                   np.asarray(ds["n_frames"].values), times)

    @classmethod
    def read(cls, url: str, storage_options: Mapping[str, Any] | None = None
             ) -> "DerivedSource":
        """The archive at ``url``, its header read (checked as ``open_archive`` checks it).

        Raises:
            As :func:`flyarchive.store.dataset.open_header`.
        """
        from flyarchive.store.dataset import open_header

        return cls.of(open_header(url, storage_options), url)


def foreign_problem(attrs: Mapping[str, Any], source: DerivedSource) -> str | None:
    """The sentence for a derived group (root attributes ``attrs``) whose provenance names
    another archive than ``source``, with what to do; None when it names ``source``."""
    derived = attrs.get(DERIVED_ATTR)
    named = derived.get("source_archive_id") if isinstance(derived, Mapping) else None
    here = source.attrs.get("archive_id")
    if named == here:
        return None
    return (f"was computed from the archive {str(named)[:80]!r}, not from the archive "
            f"{str(here)[:80]!r} at {source.url!r} that it is kept beside (copied there, or left "
            "from an archive replaced at that URL): flyarchive never reads it for this archive. "
            "Delete it; `flyarchive positions` keeps this archive's positions in a group of "
            "their own.")


def source_problems(kept: xr.Dataset | ArchiveHeader, source: DerivedSource) -> list[str]:
    """How a derived group of ``source`` disagrees with it, one sentence each: its layout,
    its worlds, frames committed that the archive has not, times of its committed frames
    that are not the archive's. [] when it agrees.

    Args:
        kept: The derived group as opened (``n_frames`` and coordinates read, ``time`` cut
            to its committed frames), whose provenance names ``source``
            (:func:`foreign_problem`).
        source: Its archive.
    """
    problems = []
    mine, theirs = kept.attrs.get("layout"), source.attrs.get("layout")
    mine = mine.get("hash") if isinstance(mine, Mapping) else None
    theirs = theirs.get("hash") if isinstance(theirs, Mapping) else None
    if mine != theirs:
        problems.append(f"Its model layout (hash {str(mine)[:16]!r}) is not the archive's "
                        f"(hash {str(theirs)[:16]!r}).")
    world = np.asarray(kept["world"].values)
    if not np.array_equal(world, source.world):
        problems.append(f"Its worlds {_few(world)} are not the archive's worlds "
                        f"{_few(source.world)}.")
        return problems  # frames of other worlds cannot be compared
    n_frames = np.asarray(kept["n_frames"].values)
    over = np.flatnonzero(n_frames > source.n_frames)
    if over.size:
        problems.append(
            f"It has committed {_few(n_frames[over])} frames of worlds {_few(world[over])}, "
            f"but the archive has only {_few(source.n_frames[over])}: its commit markers are "
            "not the archive's.")
    n = min(int(n_frames.max(initial=0)), len(source.times.get("time", ())))
    for name, theirs_values in source.times.items():
        if name not in kept.variables:
            continue
        values, expected = np.asarray(kept[name].values)[:n], np.asarray(theirs_values)[:n]
        if values.shape != expected.shape:
            continue  # fewer committed times than frames: the readers refuse that at open
        same = values == expected
        if values.dtype.kind == "f" and expected.dtype.kind == "f":
            same |= np.isnan(values) & np.isnan(expected)
        differ = np.flatnonzero(~same)
        if differ.size:
            i = int(differ[0])
            problems.append(
                f"Its {name!r} differs from the archive's at {differ.size} committed frames "
                f"(first: frame {i}, {values[i].item()!r} against {expected[i].item()!r}): its "
                "frames are not the archive's.")
    return problems


def model_note(attrs: Mapping[str, Any], source: DerivedSource) -> str | None:
    """A sentence when a derived group was computed with another model than the one its
    archive keeps (a model passed by the caller; such values are read only by callers
    that pass that model); None when it was not, or the archive keeps none."""
    derived = attrs.get(DERIVED_ATTR)
    used = derived.get("model_sha256") if isinstance(derived, Mapping) else None
    kept = model_identity(source.attrs)
    if kept is None or used == kept:
        return None
    return (f"it was computed with the model {str(used)[:16]!r}..., not the one the archive "
            f"keeps ({kept[:16]!r}...): only callers that pass that model read it.")


def _few(values: np.ndarray) -> str:
    shown = [v.item() if hasattr(v, "item") else v for v in np.asarray(values)[:8]]
    return f"{shown}{'...' if len(values) > 8 else ''}"


def unsound(url: str, storage_options: Mapping[str, Any] | None,
            source: DerivedSource | None) -> str | None:
    """Why the derived group at ``url`` cannot be extended as it is (its metadata, labels,
    commit markers or times damaged, or it does not match ``source``), in one line; None
    when it can. Chunks are not read (see :meth:`DerivedWriter.damaged`)."""
    try:
        open_derived(url, storage_options, source=source)
    except (SchemaError, CorruptArchiveError) as err:
        text = str(err)
        for kind in ("positions", None):  # being remade: the advice to remake it goes
            text = text.replace(" " + damage_advice(url, {DERIVED_ATTR: {"kind": kind}}), "")
        return text
    return None


# ----------------------------------------------------------------------------- reading
def derived_names(url: str, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The names of everything under the archive's ``derived/`` folder (sound groups or
    not; ``[]`` when there is none), sorted."""
    store = open_store(url, storage_options, read_only=True)

    async def names() -> list[str]:
        return [n async for n in store.list_dir(DERIVED_GROUP) if n != "zarr.json"]

    try:
        return sorted(sync(names()))
    except (FileNotFoundError, NotADirectoryError):
        return []


def holds_derived(url: str, storage_options: Mapping[str, Any] | None = None) -> bool:
    """Whether ``url`` is a derived group or an archive of derived values (it has the
    ``derived`` attribute), sound or not; False for an archive or nothing readable."""
    try:
        group = open_for_reading(str(url), storage_options, consolidated=False,
                                 attributes_only=True)
    except (FlyarchiveError, OSError):
        return False
    return isinstance(group.attrs.get(DERIVED_ATTR), dict)


def find_derived(url: str, storage_options: Mapping[str, Any] | None = None
                 ) -> list[tuple[str, dict[str, Any], np.ndarray]]:
    """The derived groups kept beside the archive at ``url``: ``(url, provenance,
    n_frames)`` of each whose creation finished; ``[]`` when there are none."""
    try:  # the archive's consolidated metadata may predate its derived groups: not used
        root = open_for_reading(url, storage_options, consolidated=False, attributes_only=True)
        parent = root.get(DERIVED_GROUP)
    except (FlyarchiveError, KeyError, OSError):
        return []
    if not isinstance(parent, zarr.Group):
        return []
    found = []
    for name, node in sorted(parent.groups()):
        derived = node.attrs.get(DERIVED_ATTR)
        if not isinstance(derived, dict) or "n_frames" not in node:
            continue
        try:
            n_frames = np.asarray(node["n_frames"][:])
        except Exception:  # noqa: BLE001 - damaged: its reader names what is wrong
            n_frames = np.zeros(0, dtype=np.int64)
        found.append((derived_url(url, name), derived, n_frames))
    return found


#: :func:`open_derived`'s default source: the archive the group is kept beside.
BESIDE = "beside"


def state_getter(url: str, storage_options: Mapping[str, Any] | None, ds: xr.Dataset,
                 group: zarr.Group, name: str) -> Any:
    """The reader of a state array (``position``...) of the derived group ``ds`` opened from
    ``url`` with ``group`` (:func:`open_derived_group`), as its dask arrays read it
    (committed frames checked, frames past ``n_frames`` NaN, every read checking the group
    is still the one opened): one call reads a whole selection into memory, without a task
    per chunk.

    Returns:
        A :class:`~flyarchive.store.dataset.CommittedFrames`: ``reader[worlds, frames, ...]``
        (worlds and frames as slices or index arrays) gives a numpy array.
    """
    from flyarchive.store.dataset import committed_frames
    from flyarchive.store.reader import fused_reads

    with fused_reads():
        arr = group[name]
    if arr.shape[1] < ds.sizes["time"]:  # the consolidated copy lags: the array's own
        from flyarchive.store.opener import open_for_reading

        with fused_reads():
            arr = open_for_reading(url, storage_options, consolidated=False)[name]
    n_frames = np.asarray(ds.n_frames.values, dtype=np.int64)
    return committed_frames(arr, name, n_frames, int(ds.sizes["time"]),
                            np.asarray(ds.world.values), url, storage_options,
                            archive_id=ds.attrs.get("archive_id"),
                            advice=damage_advice(url, ds.attrs))


def open_derived(url: str, storage_options: Mapping[str, Any] | None = None, *,
                 source: DerivedSource | str | None = BESIDE) -> xr.Dataset:
    """A derived group (or an archive of positions) as a lazy dataset, read and checked as
    an archive's states are (:func:`~flyarchive.store.dataset.read_dataset`): its state
    arrays (``position``, ``orientation``...) as dask arrays, frames past each world's
    ``n_frames`` NaN, a read of committed frames whose chunk, shard or index entry is
    missing, or whose bytes fail their checksum, an error; ``n_frames``, the coordinates
    and the attributes (``derived``: the provenance) read.

    Args:
        url: The derived group.
        storage_options: Passed to fsspec.
        source: The archive it is checked against (:func:`foreign_problem`,
            :func:`source_problems`); ``"beside"`` (default): the archive it is kept
            beside, read here, when ``url`` is ``<archive>/derived/<name>``; None: none
            (an archive of positions of its own is checked alone).

    Raises:
        ArchiveNotFoundError: nothing at ``url``.
        SchemaError: not a derived group (no ``derived`` attribute), metadata that
            flyarchive does not write, labels that disagree with each other or with the
            provenance (:func:`flyarchive.schema.validate_derived`).
        CorruptArchiveError: ``n_frames`` outside the stored frames or committed times
            missing (at open), or a group that does not match its archive; when computing,
            committed frames missing or damaged. Each names the group and what to do
            (:func:`flyarchive.schema.damage_advice`: recompute it).
    """
    return open_derived_group(url, storage_options, source=source)[0]


def open_derived_group(url: str, storage_options: Mapping[str, Any] | None = None, *,
                       source: DerivedSource | str | None = BESIDE
                       ) -> tuple[xr.Dataset, zarr.Group]:
    """:func:`open_derived`, and the group it opened (for :func:`state_getter`)."""
    from flyarchive.store import dataset
    from flyarchive.store.dataset import read_archive
    from flyarchive.store.opener import open_for_reading

    url = absolute_url(as_url(url))  # (its reads may run in Dask workers of other folders)
    group = open_for_reading(url, storage_options, own_later=True)
    if not isinstance(group.attrs.get(DERIVED_ATTR), dict):
        raise SchemaError(
            f"{url!r} holds no derived values (no 'derived' attribute): it is not kept "
            "positions. Make them with flyarchive.keep_positions or `flyarchive positions`.")
    ds = read_archive(url, storage_options, dataset.read_dataset, group)
    advice = damage_advice(url, ds.attrs)
    try:
        validate_derived(ds)
    except SchemaError as err:
        raise SchemaError(f"The derived group at {url!r} is damaged: {err} {advice}") from None
    if source == BESIDE:
        archive = derived_source_url(url)
        source = DerivedSource.read(archive, storage_options) if archive is not None else None
    if isinstance(source, DerivedSource):
        foreign = foreign_problem(ds.attrs, source)
        if foreign is not None:
            raise CorruptArchiveError(f"The derived group at {url!r} {foreign}")
        problems = source_problems(ds, source)
        if problems:
            raise CorruptArchiveError(f"The derived group at {url!r} does not match its "
                                      f"archive: {problems[0]} {advice}")
    return ds, group

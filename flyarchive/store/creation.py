"""Creating and reopening an archive: its root attributes, what is at a URL before it
is created, and whether an existing archive can be appended to (the nodes of a new
archive are :mod:`~flyarchive.store.nodes`'s).

Used by :mod:`flyarchive.store` (see its docstring for what each mode does with
what it finds); touches the store only through zarr's store API.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
import json
import threading
import uuid
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import mujoco
import numpy as np
import zarr

from flyarchive import codecs
from flyarchive.clock import Timing
from flyarchive.errors import ArchiveExistsError, CorruptArchiveError, FlyarchiveError, SchemaError
from flyarchive.layout import ModelLayout, check_compatible
from flyarchive.schema import SCHEMA_NAME, SCHEMA_VERSION, STATE_VARS, TIME_COORDS
from flyarchive.store.chunk_holes import lost_commit_markers
from flyarchive.store.claims import WRITER_KEY, release
from flyarchive.models.entries import MODEL_ATTR, PORTABLE_MODEL_ATTR, model_entry, portable_entry
from flyarchive.store import storage_errors
from flyarchive.store.location import archive_exists, exists_error, open_store, sync
from flyarchive.archive_spec import ArchiveSpec
from flyarchive.zarr_internals import GroupMetadata, default_buffer_prototype


def package_versions() -> dict[str, str]:
    """The installed versions of the packages an archive's ``versions`` attribute names
    (a new dict each call); packages not installed are left out. ``mujoco`` is the
    release of the MuJoCo library this process runs (replay reads it:
    :mod:`flyarchive.replay.releases`)."""
    return dict(_installed_versions())


@functools.cache
def _installed_versions() -> tuple[tuple[str, str], ...]:
    """Looked up once per process: ``importlib.metadata`` scans the installed
    distributions on every lookup (15-40 ms for these seven on a 2-core machine, per
    archive created). The versions recorded are those the process started its first
    archive with; a package upgraded in place while it runs is not seen until the next
    process, as the modules it already imported are not either."""
    out = []
    for pkg in ("flyarchive", "mujoco", "mujoco-warp", "zarr", "numpy", "xarray", "flygym"):
        if pkg == "mujoco":  # the library this process runs: since MuJoCo 4 the bindings
            out.append((pkg, mujoco.__version__))  # are "mujoco-core", "mujoco" a metapackage
            continue
        try:
            out.append((pkg, importlib.metadata.version(pkg)))
        except importlib.metadata.PackageNotFoundError:
            pass
    return tuple(out)


def root_attrs(spec: ArchiveSpec) -> dict[str, Any]:
    return {
        "flyarchive_schema": SCHEMA_NAME,
        "flyarchive_schema_version": SCHEMA_VERSION,
        "timestep": spec.timing.timestep,
        "output_fps": spec.timing.output_fps,
        "playback_speed": spec.timing.playback_speed,
        "source": spec.source,
        "versions": package_versions(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "archive_id": uuid.uuid4().hex,  # which archive this is, also when one replaces another
        "layout": spec.layout.to_attrs(),
        "codec": codecs.describe(spec.codec),
        **({MODEL_ATTR: model_entry(spec.model)} if spec.model is not None else {}),
        **({PORTABLE_MODEL_ATTR: portable_entry(spec.portable)} if spec.portable is not None
           else {}),
        **dict(spec.attrs),
    }


#: The root attribute that lists the releases that appended to an archive, when they are
#: not the ones that created it (``versions`` names those): each entry ``{"versions":
#: {package: version}, "from_frame": the first frame that writer wrote, "at": when}``.
APPENDED_ATTR = "appended_with"


def appended_attrs(attrs: Mapping[str, Any], from_frame: int) -> dict[str, Any] | None:
    """``attrs`` with an entry of :data:`APPENDED_ATTR` for this process's packages, if
    they differ from those that created the archive and from the last entry; None when
    nothing is to be said (a resumed run on the same releases adds nothing)."""
    versions = package_versions()
    entries = attrs.get(APPENDED_ATTR)
    entries = list(entries) if isinstance(entries, list) else []
    last = entries[-1].get("versions") if entries and isinstance(entries[-1], Mapping) else None
    if versions == (last if last is not None else attrs.get("versions")):
        return None
    entries.append({"versions": versions, "from_frame": int(from_frame),
                    "at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    return {**attrs, APPENDED_ATTR: entries}


def claims_group(group: zarr.Group, *, world_blocks: bool) -> None:
    """The ``claims`` group (writer claims live in it), unless it exists."""
    if "claims" in group:
        return
    try:
        zarr.create_group(group.store_path.store, path=f"{group.path}/claims".lstrip("/"),
                          attributes=claims_metadata(world_blocks=world_blocks).attributes)
    except zarr.errors.ContainsGroupError:
        pass  # another writer made it at the same moment


def claims_metadata(*, world_blocks: bool) -> GroupMetadata:
    """The metadata of the ``claims`` group of an archive written by one writer, or by
    several (``world_blocks``: an archive of fixed capacity)."""
    description = "writers holding the archive" + (" or blocks of its worlds" if world_blocks else "")
    return GroupMetadata(attributes={"description": description, "world_blocks": world_blocks})


# ----------------------------------------------------------------------------- what is at a URL
async def inventory(store: zarr.abc.store.Store) -> str:
    """``"empty"``, ``"archive"``, ``"interrupted"``, ``"damaged"`` or ``"other"``."""
    names = [n async for n in store.list_dir("") if n != "claims" and not n.endswith(".partial")]
    if not names:
        return "empty"
    ours = False
    root = await store.get("zarr.json", prototype=default_buffer_prototype())
    if root is not None:
        try:
            ours = json.loads(root.to_bytes())["attributes"]["flyarchive_schema"] == SCHEMA_NAME
        except (ValueError, KeyError, TypeError):
            ours = False
    if ours and "n_frames" in names and await store.exists("n_frames/zarr.json"):
        return "archive"
    for name in STATE_VARS:
        if name in names:
            async for _ in store.list_prefix(f"{name}/c"):
                return "damaged"
    if root is None and await store.exists("claims/zarr.json") and \
            all(name in _OWN_ENTRIES for name in names):
        return "interrupted"  # a replacement or an undo cut short (the root goes first)
    return "interrupted" if ours else "other"


#: Entries of an archive's folder that are its own, with or without their ``zarr.json``
#: (one its creation or a crash left without): its root, groups and arrays.
_OWN_ENTRIES = ("zarr.json", "claims", "models", "derived", *STATE_VARS, *TIME_COORDS, "time",
                "n_frames", "world", "dof", "mocap", "xyz", "wxyz")


def refuse_strangers(store: zarr.abc.store.Store, url: str) -> None:
    """Refuse to replace the archive at ``url`` while its folder holds entries it did not
    write (:func:`strangers`): a replacement deletes everything there.

    Raises:
        ArchiveExistsError: naming them.
    """
    extra = sync(strangers(store))
    if extra:
        shown = ", ".join(repr(n) for n in extra[:5]) + (" ..." if len(extra) > 5 else "")
        raise ArchiveExistsError(
            f"The archive at {url!r} holds {shown}, which it did not write (a file of yours, "
            "or an archive recorded inside it); replacing the archive would delete "
            f"{'them' if len(extra) > 1 else 'it'}, and flyarchive never deletes files it "
            "did not write. Move them out of the folder first, or choose another URL. "
            "Nothing was changed.")


async def strangers(store: zarr.abc.store.Store) -> list[str]:
    """The entries at the top of an archive's location that it did not write: a file
    other than its ``zarr.json``, a folder that is no zarr node of it (no ``zarr.json``),
    or an archive of its own recorded inside it. Replacing the archive would delete them."""
    names = [n async for n in store.list_dir("") if not n.endswith(".partial")]
    found = []
    for name in names:
        if name in _OWN_ENTRIES:
            continue
        meta = await store.get(f"{name}/zarr.json", prototype=default_buffer_prototype())
        if meta is None:
            found.append(name)
            continue
        try:
            attributes = json.loads(meta.to_bytes()).get("attributes") or {}
        except (ValueError, AttributeError):
            continue  # an array of its own, damaged: the archive's to replace
        if isinstance(attributes, dict) and "flyarchive_schema" in attributes:
            found.append(name)
    return found


async def clear(store: zarr.abc.store.Store) -> None:
    """Delete everything at the location except the whole-archive claim; the root
    ``zarr.json`` first, so that readers see no archive rather than half of one."""
    names = [n async for n in store.list_dir("")]
    await store.delete("zarr.json")
    for name in names:
        keys = [f"claims/{n}" async for n in store.list_dir("claims")] if name == "claims" else [name]
        for key in keys:
            if key not in ("zarr.json", WRITER_KEY):
                try:
                    await store.delete_dir(key)
                except ValueError:  # LocalStore: a file
                    pass
                await store.delete(key)


def refusal(url: str, there: str) -> FlyarchiveError:
    if there == "damaged":
        return CorruptArchiveError(
            f"The archive at {url!r} holds recorded frames but no 'n_frames' array (its commit "
            "markers; n_frames/zarr.json is missing or its root zarr.json is): it is damaged, not "
            "an interrupted creation, and flyarchive never deletes recorded frames unless asked. "
            f"Run `flyarchive verify {url}`; restore the missing zarr.json from a backup, or pass "
            "mode='w' to replace the archive (its data is deleted)."
        )
    if there == "interrupted":
        return ArchiveExistsError(
            f"At {url!r} is an archive whose creation was interrupted (no frame was committed). "
            "Pass mode='a' to create it anew there, or mode='w' to replace it."
        )
    return foreign(url)


def foreign(url: str) -> ArchiveExistsError:
    """The refusal of a location that holds what flyarchive did not make: replaced by no
    mode and no ``--overwrite`` (a folder of a user's files, another program's zarr)."""
    return ArchiveExistsError(
        f"Something that is not a flyarchive archive is at {url!r} (files flyarchive did not "
        "write); flyarchive replaces only its own archives, never other files, even when asked "
        "to overwrite. Choose another URL (e.g. a new folder such as run.zarr), or move those "
        "files away first."
    )


def check_commits(group: zarr.Group, url: str, arrays: Mapping[str, zarr.Array],
                  state: list[str]) -> tuple[zarr.Array, np.ndarray]:
    """Refuse an archive whose commit markers cannot be trusted, before any write.

    Args:
        group: The archive's root group.
        url: For messages.
        arrays: Its arrays, opened: at least ``state``, ``time`` and ``world``.
        state: The names of its state arrays.

    Returns:
        The ``n_frames`` array, opened, and its values (``(world,)`` int).

    Raises:
        CorruptArchiveError: ``n_frames`` outside ``0..extent`` or unreadable, or the
            committed times not finite and increasing.
    """
    extent = min([int(arrays[n].shape[1]) for n in state] + [int(arrays["time"].shape[0])])
    fix = (f"Nothing was written. Run `flyarchive verify {url}` to see what is wrong; restore "
           "the archive from a backup, or pass mode='w' to replace it (its data is deleted).")
    try:
        marker = group["n_frames"]
        n_frames = np.asarray(marker[:])
        times = np.asarray(arrays["time"][: int(n_frames.clip(0, extent).max(initial=0))])
    except Exception as err:
        raise CorruptArchiveError(
            f"The commit markers of the archive at {url!r} are unreadable ({type(err).__name__}: "
            f"{err}). {fix}"
        ) from None
    n_worlds = int(arrays["world"].shape[0])
    if n_frames.shape != (n_worlds,) or n_frames.dtype.kind not in "iu" \
            or (n_frames < 0).any() or (n_frames > extent).any():
        shown = n_frames.tolist() if n_frames.size <= 8 else f"{n_frames[:8].tolist()}..."
        raise CorruptArchiveError(
            f"The archive at {url!r} has n_frames {shown}, outside 0..{extent} (the frames it "
            f"stores along time) for its {n_worlds} worlds: its commit markers are damaged. {fix}"
        )
    lost = lost_commit_markers(marker, n_frames, [arrays[n] for n in state])
    if lost:
        raise CorruptArchiveError(
            f"The archive at {url!r} is damaged: its commit markers' file {lost[0][0]} is "
            "missing, though frames of its worlds were recorded (they would be written "
            f"again over the recorded ones). {fix}")
    if not np.isfinite(times).all() or (np.diff(times) <= 0).any():
        raise CorruptArchiveError(
            f"The archive at {url!r} has committed times that are missing, not finite or not "
            f"increasing (frames 0..{len(times) - 1}): its time coordinate is damaged. {fix}"
        )
    return marker, n_frames


def check_against(group: zarr.Group, url: str, layout: ModelLayout, timing: Timing | None, *,
                  codec: str | None = None, dtype: Any = None) -> ModelLayout:
    """The archive's layout, after checking ``layout``, ``timing``, ``codec`` and ``dtype``
    against it (None: not checked).

    Raises:
        LayoutMismatchError: another layout.
        SchemaError: another timing, codec or state dtype than the archive's: one archive
            keeps one frame schedule, one codec and one dtype, so appending with others
            would mix them (or store the frames otherwise than asked, silently).
    """
    stored = ModelLayout.from_attrs(group.attrs["layout"])
    check_compatible(stored, layout)
    if timing is not None:
        have = Timing(*(group.attrs[k] for k in ("timestep", "output_fps", "playback_speed")))
        if have != timing:
            raise SchemaError(
                f"The archive at {url!r} was recorded with {have}; appending with {timing} "
                "would mix frame schedules. Use the same timestep, output_fps and playback_speed."
            )
    codec_attr = group.attrs.get("codec")
    # Archives from before the codec option have no codec attribute: they are lossless.
    have_codec = codec_attr.get("spec") if isinstance(codec_attr, dict) else "lossless"
    if codec is not None and codec != have_codec:
        raise SchemaError(
            f"The archive at {url!r} stores its state with codec {have_codec!r}; appending asks "
            f"for codec {codec!r}. One archive keeps one codec (its frames would be stored with "
            f"{have_codec!r} whatever was asked). Pass codec={have_codec!r} (--codec "
            f"{have_codec}) to append to it, or write into a new archive."
        )
    if dtype is not None and "qpos" in group and np.dtype(dtype) != group["qpos"].dtype:
        have_dtype = np.dtype(group["qpos"].dtype).name
        raise SchemaError(
            f"The archive at {url!r} stores its state as {have_dtype}; appending asks for "
            f"{np.dtype(dtype).name}. One archive keeps one dtype (frames would be cast to "
            f"{have_dtype}). Pass dtype={have_dtype!r} to append to it, or write into a new "
            "archive."
        )
    return stored


# ----------------------------------------------------------------------------- cleaning up
def tidy_local(root: Path | None, existed: bool) -> None:
    """Remove the empty folders a refused creation made at a local ``root`` (None: not local)."""
    if root is None:
        return
    for folder in (root / "claims", root):
        try:
            if folder != root or not existed:
                folder.rmdir()  # only if empty
        except OSError:
            pass


def undo(store: zarr.abc.store.Store, claim: tuple[list[str], str], ours: bool) -> None:
    """After a refused or failed creation: delete what it made (``ours``), release its claim."""
    try:
        if ours:
            sync(clear(store))
        release(store, *claim)
    except Exception:  # the storage failed too; the caller reports the first error
        pass


def release_quietly(store: zarr.abc.store.Store, keys: list[str], writer: str) -> None:
    """Release a claim at garbage collection, which may run on any thread, zarr's event
    loop included (where zarr's ``sync`` cannot run): then from a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        threading.Thread(target=release_quietly, args=(store, keys, writer),
                         name="flyarchive-release-claim", daemon=True).start()
        return
    try:
        release(store, keys, writer)
    except Exception:  # nobody to tell; a stale claim is taken over later
        pass


def refuse_existing(url: str, storage_options: Mapping[str, Any] | None = None) -> None:
    """Raise :class:`ArchiveExistsError` if anything is at ``url`` (what flyarchive did not
    write named as such: no mode replaces it)."""
    with storage_errors.translated(url, storage_options):  # interop: unreachable, no bucket...
        store = open_store(url, storage_options)
        exists = archive_exists(store)
        there = sync(inventory(store)) if exists else "empty"
    if exists:
        raise foreign(url) if there == "other" else exists_error(url)

"""Models kept by content beside an archive: ``models/<sha256>.mjb`` and ``models/<sha256>.mjz``.

The model an archive was recorded with is kept in two forms, each an object of its own
under the archive's URL, named by the SHA-256 of its bytes, inside the zarr group
``models`` (a group, so that zarr knows the folder when it lists the archive's members: a
plain folder makes zarr warn):

- its exact compiled form, the MJB of the MuJoCo release that recorded it (root attribute
  ``model``: ``{"sha256", "size", "mujoco", "path"}``); no other release can read it;
- its portable form, a MuJoCo spec zip of its MJCF and every file it references
  (:func:`flyarchive.models.portable_model`; root attribute ``portable_model``:
  ``{"sha256", "size", "path", "format", "mujoco", "exact", "bodies", "qpos0"}``, the last
  two what it compiles to, checked on every release). Its hash is the model's identity
  (:func:`flyarchive.models.model_identity`).

Attributes never hold the bytes (the attributes, the objects' keys and the model's
identity are :mod:`flyarchive.models.entries`'s). Replay on the recording release loads
the MJB (bit-exact with the live run); another release compiles the portable form, once
per release: the compiled MJB is kept in the user's cache
(:func:`~flyarchive.models.check.compiled_model`), and the model must fit the archive's
layout, bodies and ``qpos0``, or replay refuses naming the difference. An archive that
keeps only an MJB of another release is refused in one line that names both releases and
the fix, :func:`attach_model` (``flyarchive model attach``): it keeps a portable model
beside an archive after checking that it compiles to the recorded layout.

Commit order: the objects are written while the archive is created, before ``n_frames``,
the commit marker (:func:`flyarchive.store.nodes.create_arrays`): the root
attributes, written first with the group, already name them, but an archive whose
creation completed never names a model that is not there. A creation puts them with the
arrays' metadata (its location is empty and its claim held: nothing else can be there).
Otherwise writing is idempotent (:func:`write_model`): the same content always has the
same name, so an object already there whose bytes hash to its name is kept; a new one is
created with a conditional put where the storage offers one (local disk: a hard link; S3:
``If-None-Match``). :func:`attach_model` writes the object first, then the attribute that
names it. Every read checks the bytes against the name, and refuses them with
:class:`CorruptArchiveError` naming the object and both hashes. The bytes are read through
the archive's zarr store, so on local disk the guarded store
(:mod:`~flyarchive.store.localstore`) reads only a regular file inside the archive, of
bounded size.

Bytes that hash to their name are still untrusted (anyone may write an archive): they
are loaded into a long-lived process only after a short-lived child process loaded (or
compiled) them safely (:mod:`~flyarchive.models.check`; :func:`kept_model`,
:func:`load_kept_model`, and ``verify`` through :func:`model_problems`).

This module is of the store's floor (tests/test_layout_rules.py): it reads and writes
through the store's hardened zarr store, and ``verify`` uses it. The public entry point is
:func:`load_kept_model` (``flyarchive.load_kept_model``); :func:`load_archive_or_file` is
what the deprecated ``flyarchive.load_model`` does.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mujoco
import zarr
from flyarchive.zarr_internals import default_buffer_prototype

from flyarchive.errors import (
    CorruptArchiveError,
    LayoutMismatchError,
    ModelLoadError,
    OutputExistsError,
    SchemaError,
)
from flyarchive.layout import ModelLayout, details_difference, layout_difference, model_details
from flyarchive.models.cache import bytes_sha256
from flyarchive.models.check import check_model, compiled_model
from flyarchive.models.entries import (
    MODELS_GROUP,
    PORTABLE_MODEL_ATTR,
    models_metadata,
    portable_entry,
    stored_entry,
    stored_portable,
)
from flyarchive.models.files import load_model_file
from flyarchive.models.mjb import check_mjb, load_mjb, mjb_version, mujoco_release
from flyarchive.models.portable import geometry_difference, portable_model
from flyarchive.store.location import as_url, sync, write_faults


def write_model(group: zarr.Group, blob: bytes, entry: Mapping[str, Any]) -> None:
    """Put a model's bytes at ``entry["path"]`` under the archive's root ``group``, unless
    an object with those bytes is there already (content-addressed: same name, same bytes).

    An object of that name whose bytes do not hash to it (damaged) is replaced.

    Raises:
        OSError (and storage client errors): the storage failed; nothing names the model yet.
    """
    store = group.store
    root = group.path.strip("/")
    prefix = f"{root}/" if root else ""
    try:
        zarr.create_group(store, path=f"{prefix}{MODELS_GROUP}",
                          attributes=models_metadata().attributes)
    except zarr.errors.ContainsGroupError:
        pass  # made earlier, by this archive's creation or another writer
    key = f"{prefix}{entry['path']}"
    if _holds(store, key, entry["sha256"]):
        return
    if not _create(store, key, blob):  # there now: made between our look and our put
        if _holds(store, key, entry["sha256"]):
            return
    proto = default_buffer_prototype()
    sync(store.set(key, proto.buffer.from_bytes(blob)))  # a damaged object: replaced


def _holds(store: Any, key: str, sha256: str) -> bool:
    """True if the object at ``key`` exists and its bytes hash to ``sha256``."""
    try:
        got = sync(store.get(key, prototype=default_buffer_prototype()))
    except CorruptArchiveError:  # local: not a regular file, or too large: replaced
        return False
    return got is not None and hashlib.sha256(got.to_bytes()).hexdigest() == sha256


def _create(store: Any, key: str, blob: bytes) -> bool:
    """Create ``key`` holding ``blob`` unless it exists; False if it existed."""
    from zarr.storage import FsspecStore

    proto = default_buffer_prototype()
    if isinstance(store, FsspecStore):
        root = store.path.rstrip("/")
        try:
            sync(store.fs._pipe_file(f"{root}/{key}" if root else key, blob, mode="create"))
            return True
        except FileExistsError:
            return False
        except (TypeError, NotImplementedError):  # no conditional put: look, then put
            if sync(store.exists(key)):
                return False
            sync(store.set(key, proto.buffer.from_bytes(blob)))
            return True
    if sync(store.exists(key)):
        return False
    sync(store.set_if_not_exists(key, proto.buffer.from_bytes(blob)))  # local: atomic link
    return True


def read_model(group: zarr.Group, url: str) -> tuple[bytes, dict[str, Any]] | None:
    """The kept MJB's bytes and its entry, checked against its name; None when the archive
    keeps none.

    Args:
        group: The archive's root group (opened for reading).
        url: For messages.

    Raises:
        SchemaError: a malformed ``model`` attribute.
        CorruptArchiveError: the object is missing, of another size than recorded, or
            its bytes do not hash to its name (both hashes named); on local disk also a
            link, FIFO or other file that is not a regular file inside the archive.
        StorageError and storage client errors: the storage failed.
    """
    entry = stored_entry(group.attrs.asdict(), url)
    return None if entry is None else (_read_object(group, url, entry, "stored model"), entry)


def read_portable(group: zarr.Group, url: str) -> tuple[bytes, dict[str, Any]] | None:
    """The kept portable model's bytes (a spec zip) and its entry, checked against its name;
    None when the archive keeps none.

    Raises:
        SchemaError: a malformed ``portable_model`` attribute.
        CorruptArchiveError, StorageError: as :func:`read_model`.
    """
    entry = stored_portable(group.attrs.asdict(), url)
    return None if entry is None else (_read_object(group, url, entry, "portable model"), entry)


def _read_object(group: zarr.Group, url: str, entry: Mapping[str, Any], what: str) -> bytes:
    """The bytes of the kept object ``entry`` names, checked against its name and size."""
    root = group.path.strip("/")
    key = f"{root}/{entry['path']}" if root else entry["path"]
    where = f"{url.rstrip('/')}/{entry['path']}"
    fix = ("Restore the object from a backup, or pass the model yourself (model=..., "
           "--model); `flyarchive verify` checks the rest of the archive.")
    from zarr.storage import FsspecStore

    store = group.store
    missing = CorruptArchiveError(
        f"The archive at {url!r} names the {what} {entry['path']!r} (sha256 "
        f"{entry['sha256']}), but there is no object {where!r}. {fix}"
    )
    if isinstance(store, FsspecStore):  # bound what is read before reading it
        try:
            size = sync(store.getsize(key))
        except FileNotFoundError:
            raise missing from None
        if size > entry["size"]:
            raise CorruptArchiveError(
                f"The {what} {where!r} is {size:,} bytes, more than the {entry['size']:,} "
                f"the archive recorded; flyarchive did not read it. {fix}"
            )
    got = sync(store.get(key, prototype=default_buffer_prototype()))  # local: regular files only
    if got is None:
        raise missing
    blob = got.to_bytes()
    digest = bytes_sha256(blob)  # kept: the render that loads it asks again
    if digest != entry["sha256"] or len(blob) != entry["size"]:
        raise CorruptArchiveError(
            f"The {what} {where!r} does not hash to its name: its bytes ({len(blob):,}) "
            f"have sha256 {digest}; its name and the archive say sha256 {entry['sha256']} "
            f"({entry['size']:,} bytes). It is damaged or was replaced; flyarchive does not "
            f"replay with it. {fix}"
        )
    return blob


def model_problems(group: zarr.Group, url: str) -> list[str]:
    """What is wrong with the kept models, for ``verify`` (empty when sound or absent): a
    malformed attribute, a missing object, bytes that do not hash to their name, bytes that
    are no MJB at all; an MJB of this release that MuJoCo refuses or cannot load safely, a
    portable model that does not compile safely or does not fit the archive's layout (each
    checked in a child process, :mod:`~flyarchive.models.check`). An MJB of another release is checked against its
    name only: no other release can load it."""
    problems = []
    here = mujoco_release()
    try:
        stored = read_model(group, url)
        version = mjb_version(stored[0]) if stored is not None else None
        if stored is not None and version is None:  # not an MJB of any release
            check_mjb(stored[0], _where(url, stored[1]))
        if stored is not None and version == here:
            check_model(stored[0], _where(url, stored[1]), sha256=stored[1]["sha256"])
    except (CorruptArchiveError, SchemaError, ModelLoadError) as err:
        problems.append(f"Model: {err}")
    try:
        entry = stored_portable(group.attrs.asdict(), url)
        if entry is not None:
            blob = _read_object(group, url, entry, "portable model")
            _compiled_portable(group, url, entry, lambda: blob)
    except (CorruptArchiveError, SchemaError, ModelLoadError, LayoutMismatchError) as err:
        problems.append(f"Portable model: {err}")
    return problems


def _where(url: str, entry: Mapping[str, Any]) -> str:
    """The kept model's file: ``"<url>/models/<sha256>.mjb"`` (or ``.mjz``)."""
    return f"{url.rstrip('/')}/{entry['path']}"


def kept_model(url: str, storage_options: Mapping[str, Any] | None = None, *,
               group: zarr.Group | None = None) -> tuple[mujoco.MjModel, bytes]:
    """The model kept beside an archive, loaded into this process only once it is known to
    load safely; and its MJB bytes (what workers get).

    On the MuJoCo release that recorded it, its MJB (bit-exact with the live run). On
    another release, its portable form compiled by this release: once, in a child process,
    then from the cache (:func:`~flyarchive.models.check.compiled_model`); the model
    must fit the archive's layout, bodies and ``qpos0``. Bytes read from the archive are
    checked against their name first.

    Args:
        url: The archive (any fsspec URL or local path).
        storage_options: fsspec options for it.
        group: The archive's root group, opened already (a render's header's ``group``):
            the model is read through it; None: opened here.

    Raises:
        ArchiveNotFoundError: nothing at ``url``.
        ModelLoadError: the archive keeps no model; it keeps only an MJB of another MuJoCo
            release (one line naming both releases and ``flyarchive model attach``); or
            this MuJoCo refuses the model (a truncated MJB, an MJCF it cannot compile).
        UnsafeModelError: loading (or compiling) it crashed the child process, raised
            ``mujoco.FatalError``, or did not finish (the message names the file).
        LayoutMismatchError: the portable model, compiled here, does not fit the archive
            (the difference named).
        CorruptArchiveError, SchemaError: the object is missing, or its bytes or the
            attribute naming it were damaged.
    """
    if group is None:
        from flyarchive.store.opener import open_for_reading

        group = open_for_reading(url, storage_options, attributes_only=True)
    attrs = group.attrs.asdict()
    mjb, portable = stored_entry(attrs, url), stored_portable(attrs, url)
    if mjb is None and portable is None:
        raise ModelLoadError(
            f"The archive at {url!r} keeps no model (it was recorded or imported with "
            "store_model=False, or before flyarchive kept models). Pass the compiled model "
            "it was recorded with: model=... (an MjModel), or --model FILE (.mjb or .xml)."
        )
    here = mujoco_release()
    if mjb is not None and (portable is None or mjb["mujoco"] in (None, here)):
        blob, entry = read_model(group, url)  # type: ignore[misc]
        theirs = mjb_version(blob)
        if theirs == here or portable is None:
            if theirs is not None and theirs != here:
                raise ModelLoadError(_bound_elsewhere(url, theirs))
            where = _where(url, entry)
            check_model(blob, where, sha256=entry["sha256"])  # refuses what is not an MJB
            return load_mjb(blob, f"the model kept in the archive ({where})"), blob
    assert portable is not None
    return _compiled_portable(group, url, portable,
                              lambda: _read_object(group, url, portable, "portable model"))


def _bound_elsewhere(url: str, theirs: str) -> str:
    """The one line for an archive whose only model is an MJB of MuJoCo ``theirs``."""
    return (
        f"The archive at {url!r} keeps its model only as a compiled MJB of MuJoCo {theirs}, "
        f"which MuJoCo {mujoco_release()} cannot read (an MJB is bound to its release). Keep "
        f"its portable form beside it: flyarchive model attach {url} --model fly.xml (the MJCF "
        f"it was recorded with; API: flyarchive.attach_model), or install mujoco=={theirs} "
        "to replay it."
    )


def _compiled_portable(group: zarr.Group, url: str, entry: Mapping[str, Any],
                       read: Any) -> tuple[mujoco.MjModel, bytes]:
    """The kept portable model compiled by this release (cached), checked against the
    archive's layout and the bodies and ``qpos0`` recorded with it."""
    where = _where(url, entry)
    blob, _ = compiled_model(read, entry["sha256"], where)
    model = load_mjb(blob, f"the model compiled from {where}")
    difference = _misfit(group.attrs.asdict(), entry, model)
    if difference is not None:
        raise LayoutMismatchError(
            f"The portable model {where!r}, compiled by MuJoCo {mujoco_release()}, does not fit "
            f"the archive it is kept in: {difference}. Pass the model the archive was recorded "
            "with (model=..., --model), or keep the right one with flyarchive model attach "
            "--replace."
        )
    return model, blob


def _misfit(attrs: Mapping[str, Any], details: Mapping[str, Any], model: mujoco.MjModel
            ) -> str | None:
    """How ``model`` differs from the archive's layout (and the recorded ``details``:
    bodies, ``qpos0``), in words; None when it fits."""
    return layout_difference(ModelLayout.from_attrs(attrs["layout"]),
                             ModelLayout.from_model(model)) or details_difference(dict(details), model)


def attach_model(url: str, source: str | os.PathLike[str] | mujoco.MjSpec, *,
                 storage_options: Mapping[str, Any] | None = None, replace: bool = False,
                 takeover: bool = False) -> dict[str, Any]:
    """Keep a portable model beside an archive that has none (an archive recorded before
    flyarchive kept one, or from an MJB alone), so that any MuJoCo release can replay it.

    The model is made portable (:func:`flyarchive.models.portable_model`), compiled here
    and checked against the archive: its layout (joints, mocap bodies) and, where the
    archive keeps an MJB this release reads, the bodies, ``qpos0`` and geometry (where
    bodies, joints, geoms, sites and cameras are, the geoms' sizes) of that MJB. Then
    the zip is written (``models/<sha256>.mjz``) and the root attribute
    ``portable_model`` added: nothing else in the archive changes. The archive's writer
    claim is held meanwhile, so it refuses an archive that is being written.

    Args:
        url: The archive (a local path or any fsspec URL).
        source: The model the archive was recorded with: an MJCF ``.xml`` (with its files),
            a spec zip (``.mjz``/``.zip``) or a ``mujoco.MjSpec``.
        storage_options: Passed to fsspec.
        replace: Replace a portable model kept already (another one is refused otherwise);
            the replaced object is deleted once the attribute names the new one.
        takeover: Take over the writer claim of a writer that crashed on another host.

    Returns:
        The ``portable_model`` attribute now kept (the same one when the archive keeps this
        very model already: nothing is written).

    Raises:
        ModelLoadError: the source cannot be made portable (a missing file...).
        LayoutMismatchError: the model does not fit the archive (the difference named);
            nothing is written.
        OutputExistsError: the archive keeps another portable model and ``replace`` is False.
        ArchiveNotFoundError: no archive at ``url``.
        ArchiveInUseError: a writer holds the archive; nothing is written.
        StorageError: the storage failed; the archive names no model it does not hold.
    """
    url = as_url(url)
    with write_faults(url, storage_options, "Attaching a model to",
                      "The archive names a portable model only once it is written; run the "
                      "call again."):
        return _attach(url, source, storage_options, replace, takeover)


def _attach(url: str, source: Any, storage_options: Mapping[str, Any] | None, replace: bool,
            takeover: bool) -> dict[str, Any]:
    from flyarchive.store.claims import WRITER_KEY, claim_archive, release
    from flyarchive.store.opener import open_for_writing

    group = open_for_writing(url, storage_options)
    if "n_frames" not in group:
        raise SchemaError(
            f"The archive at {url!r} has no 'n_frames' array: its creation did not finish. A "
            "model is attached to recorded archives.")
    attrs = group.attrs.asdict()
    portable = portable_model(source)  # the user's own: compiled here
    compiled = load_mjb(compiled_model(lambda: portable.blob, portable.sha256,
                                       f"the portable form of {_shown(source)}")[0])
    details, recorded = _recorded(group, url, attrs)
    difference = _misfit(attrs, details, compiled)
    if difference is None and recorded is not None:  # where bodies and geoms are
        difference = geometry_difference(recorded, compiled, named="the kept MJB's model")
    if difference is not None:
        raise LayoutMismatchError(
            f"The model {_shown(source)} does not fit the archive at {url!r}: {difference}. "
            "Nothing was written. Attach the model the archive was recorded with."
        )
    entry = portable_entry(portable)
    if details:  # the recorded model's own bodies and qpos0, where known
        entry.update(bodies=list(details["bodies"]), qpos0=list(details["qpos0"]))
    kept = stored_portable(attrs, url)
    if kept is not None and kept["sha256"] == portable.sha256:
        return kept
    if kept is not None and not replace:
        raise OutputExistsError(
            f"The archive at {url!r} keeps a portable model already ({kept['path']}, sha256 "
            f"{kept['sha256'][:16]}...). Pass replace=True (--replace) to keep this one instead."
        )
    store = group.store
    writer = claim_archive(store, url, takeover=takeover)
    try:
        write_model(group, portable.blob, entry)  # the object first...
        _set_root_attribute(group, PORTABLE_MODEL_ATTR, entry)  # ...then what names it...
        if kept is not None:  # ...then the one it replaced, which nothing names now
            root = group.path.strip("/")
            sync(store.delete(f"{root}/{kept['path']}" if root else kept["path"]))
    finally:
        release(store, [WRITER_KEY], writer)
    return entry


def _shown(source: Any) -> str:
    return "(an MjSpec)" if isinstance(source, mujoco.MjSpec) else repr(os.fspath(source))


def _recorded(group: zarr.Group, url: str, attrs: Mapping[str, Any]
              ) -> tuple[dict[str, Any], mujoco.MjModel | None]:
    """The bodies and ``qpos0`` of the recorded model and the model, where this release can
    tell: from the kept MJB when it is this release's; else ``({}, None)``."""
    mjb = stored_entry(attrs, url)
    if mjb is None or mjb["mujoco"] not in (None, mujoco_release()):
        return {}, None
    blob, entry = read_model(group, url)  # type: ignore[misc]
    if mjb_version(blob) != mujoco_release():
        return {}, None
    check_model(blob, _where(url, entry), sha256=entry["sha256"])
    model = load_mjb(blob, _where(url, entry))
    return model_details(model), model


def _set_root_attribute(group: zarr.Group, name: str, value: Any) -> None:
    """Set one root attribute in the archive's ``zarr.json``, everything else kept as it is
    (the consolidated copy too, with the ``models`` group listed), in one put."""
    store = group.store
    root = group.path.strip("/")
    key = f"{root}/zarr.json" if root else "zarr.json"
    proto = default_buffer_prototype()
    raw = sync(store.get(key, prototype=proto))
    document = json.loads(raw.to_bytes())
    document.setdefault("attributes", {})[name] = value
    copy = document.get("consolidated_metadata")
    if isinstance(copy, dict) and isinstance(copy.get("metadata"), dict):
        copy["metadata"].setdefault(MODELS_GROUP, {
            **models_metadata().to_dict(),
            "consolidated_metadata": {"kind": "inline", "must_understand": False, "metadata": {}}})
    sync(store.set(key, proto.buffer.from_bytes(json.dumps(document, indent=2).encode())))


def load_kept_model(url: str | os.PathLike[str],
                    storage_options: Mapping[str, Any] | None = None) -> mujoco.MjModel:
    """The model an archive keeps, compiled for this MuJoCo (``flyarchive.load_kept_model``).

    On the release that recorded the archive, its MJB (``models/<sha256>.mjb``, bit-exact
    with the live run); on another, its portable form (``models/<sha256>.mjz``) compiled
    once per release and checked against the archive (:func:`kept_model`). It is untrusted
    input: its bytes are checked against their name, then loaded (or compiled) first in a
    short-lived child process (MuJoCo's loader is not memory-safe on crafted files), whose
    verdict (and compiled model) is kept by hash in the cache folder
    (``FLYARCHIVE_CACHE_DIR``, else ``$XDG_CACHE_HOME/flyarchive``; trusted only when only
    this user can write it), so later loads of the same model skip it. A model file you
    trust is loaded by :func:`flyarchive.models.load_model_file`.

    Args:
        url: The archive: a local folder, ``file://``, ``s3://``... any fsspec URL.
        storage_options: fsspec options for it (e.g. S3 credentials).

    Returns:
        The compiled model (host memory).

    Raises:
        ModelLoadError: the archive keeps no model, or only an MJB of another release (the
            message names both and ``flyarchive model attach``), or MuJoCo refuses the
            model (a damaged file); ``url`` is a local file, not an archive (the message
            names ``load_model_file``).
        UnsafeModelError: the archive's model crashed the child process that loaded it,
            raised ``mujoco.FatalError``, or did not finish; the message names the file.
            Pass a model you trust instead (``model=``, ``--model``).
        LayoutMismatchError: the portable model compiled here does not fit the archive.
        ArchiveNotFoundError: nothing at ``url``.
        CorruptArchiveError, SchemaError: the kept model is missing or damaged.
    """
    text = os.fspath(url)
    if _local_file(text, by_suffix=False) is not None:
        raise ModelLoadError(
            f"{text!r} is a file, not an archive. Load a model file you trust with "
            f"flyarchive.load_model_file({text!r}); load_kept_model takes an archive's URL."
        )
    return kept_model(text, storage_options)[0]


def load_archive_or_file(source: str | os.PathLike[str],
                         storage_options: Mapping[str, Any] | None = None) -> mujoco.MjModel:
    """What ``flyarchive.load_model`` (deprecated since flyarchive 0.2) does: the model an
    archive keeps (:func:`load_kept_model`), or a local model file you trust: a ``.xml`` or
    ``.mjb`` path, or any local file (:func:`flyarchive.models.load_model_file`).

    Raises:
        As :func:`load_kept_model` and :func:`flyarchive.models.load_model_file`.
    """
    text = os.fspath(source)
    path = _local_file(text, by_suffix=True)
    if path is not None:
        return load_model_file(path)
    return kept_model(text, storage_options)[0]


def _local_file(text: str, *, by_suffix: bool) -> Path | None:
    """The local file ``text`` names (a local path or ``file://`` URL of a file, or with
    ``by_suffix`` of a path ending in ``.xml`` or ``.mjb``, there or not); None when it
    names an archive (or nothing)."""
    if "://" in text and not text.startswith("file://"):
        return None
    path = Path(text.removeprefix("file://")).expanduser()
    named = by_suffix and path.suffix.lower() in (".xml", ".mjb")
    return path if named or path.is_file() else None

"""Compiled models kept by content beside an archive: ``models/<sha256>.mjb``.

The model an archive was recorded with (its exact MJB bytes) is an object of its own
under the archive's URL, named by the SHA-256 of its bytes, inside the zarr group
``models`` (a group, so that zarr knows the folder when it lists the archive's
members: a plain folder makes zarr warn). The root attribute ``model`` holds only
``{"sha256", "size", "mujoco", "path"}``; attributes never hold the bytes.

Commit order: the object is written while the archive is created, before ``n_frames``,
the commit marker (:func:`flyarchive.store.new_archive.create_arrays`): the root
attributes, written first with the group, already name it, but an archive whose
creation completed never names a model that is not there. A creation puts it with the
arrays' metadata (its location is empty and its claim held: nothing else can be
there). Otherwise writing is idempotent (:func:`write_model`): the same content always
has the same name, so an object already there whose bytes hash to its name is kept; a
new one is created with a conditional put where the storage offers one (local disk: a
hard link; S3: ``If-None-Match``). Every read checks
the bytes against the name, and refuses them with :class:`CorruptArchiveError` naming
the object and both hashes. The model bytes are read through the archive's zarr store,
so on local disk the guarded store (:mod:`~flyarchive.store.localstore`) reads only a
regular file inside the archive, of bounded size.

Bytes that hash to their name are still untrusted (anyone may write an archive): they
are loaded into a long-lived process only after a short-lived child process loaded them
safely (:mod:`~flyarchive.store.model_check`; :func:`kept_model`, :func:`load_model`,
and ``verify`` through :func:`model_problems`).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mujoco
import zarr
from zarr.core.buffer import default_buffer_prototype
from zarr.core.group import GroupMetadata

from flyarchive.errors import CorruptArchiveError, ModelLoadError, SchemaError
from flyarchive.models import MODEL_ATTR, load_mjb, mjb_version
from flyarchive.models import load_model as load_model_file
from flyarchive.store.location import sync
from flyarchive.store.model_check import check_model

#: The zarr group holding the models, under the archive's root.
MODELS_GROUP = "models"
#: Largest model object read or written, bytes (NeuroMechFly's MJB is 23 MB).
MAX_MODEL_BYTES = 1 << 30
_SHA256 = re.compile(r"[0-9a-f]{64}")


def model_key(sha256: str) -> str:
    """The object's key in the archive: ``"models/<sha256>.mjb"``."""
    return f"{MODELS_GROUP}/{sha256}.mjb"


def model_entry(blob: bytes) -> dict[str, Any]:
    """The root attribute ``model`` for MJB bytes: sha256 (hex), size (bytes), the MuJoCo
    release that wrote them (from the MJB header) and the object's key.

    Raises:
        SchemaError: more than :data:`MAX_MODEL_BYTES` bytes.
    """
    if len(blob) > MAX_MODEL_BYTES:
        raise SchemaError(
            f"The compiled model is {len(blob):,} bytes; an archive keeps models of at most "
            f"{MAX_MODEL_BYTES:,}. Pass store_model=False and keep the model yourself."
        )
    digest = hashlib.sha256(blob).hexdigest()
    return {"sha256": digest, "size": len(blob), "mujoco": mjb_version(blob),
            "path": model_key(digest)}


def write_model(group: zarr.Group, blob: bytes, entry: Mapping[str, Any]) -> None:
    """Put MJB bytes at ``entry["path"]`` under the archive's root ``group``, unless an
    object with those bytes is there already (content-addressed: same name, same bytes).

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


def models_metadata() -> GroupMetadata:
    """The metadata of the ``models`` group."""
    return GroupMetadata(attributes={
        "description": "compiled MuJoCo models (MJB), named models/<sha256>.mjb"})


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


def stored_entry(attrs: Mapping[str, Any], url: str) -> dict[str, Any] | None:
    """The archive's ``model`` attribute, checked; None when no model is stored.

    Raises:
        SchemaError: an attribute that is not ``{"sha256": 64 hex digits, "size": bytes,
            ...}`` (edited or damaged).
    """
    entry = attrs.get(MODEL_ATTR)
    if entry is None:
        return None
    sha = entry.get("sha256") if isinstance(entry, Mapping) else None
    size = entry.get("size") if isinstance(entry, Mapping) else None
    if not isinstance(sha, str) or not _SHA256.fullmatch(sha) or not isinstance(size, int) \
            or isinstance(size, bool) or not 0 < size <= MAX_MODEL_BYTES:
        raise SchemaError(
            f"The archive at {url!r} has the attribute {MODEL_ATTR!r} = {str(entry)[:160]!r}; "
            "it must be an object with 'sha256' (64 lowercase hex digits) and 'size' (bytes, "
            f"1 to {MAX_MODEL_BYTES:,}). The archive's metadata was edited or damaged; restore "
            "its zarr.json, or pass the model yourself (model=..., --model)."
        )
    mujoco = entry.get("mujoco")
    return {"sha256": sha, "size": size, "mujoco": mujoco if isinstance(mujoco, str) else None,
            "path": model_key(sha)}


def read_model(group: zarr.Group, url: str) -> tuple[bytes, dict[str, Any]] | None:
    """The stored model's MJB bytes and its entry, checked against its name; None when
    the archive stores none.

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
    if entry is None:
        return None
    root = group.path.strip("/")
    key = f"{root}/{entry['path']}" if root else entry["path"]
    where = f"{url.rstrip('/')}/{entry['path']}"
    fix = ("Restore the object from a backup, or pass the model yourself (model=..., "
           "--model); `flyarchive verify` checks the rest of the archive.")
    from zarr.storage import FsspecStore

    store = group.store
    missing = CorruptArchiveError(
        f"The archive at {url!r} names the stored model {entry['path']!r} (sha256 "
        f"{entry['sha256']}), but there is no object {where!r}. {fix}"
    )
    if isinstance(store, FsspecStore):  # bound what is read before reading it
        try:
            size = sync(store.getsize(key))
        except FileNotFoundError:
            raise missing from None
        if size > entry["size"]:
            raise CorruptArchiveError(
                f"The stored model {where!r} is {size:,} bytes, more than the {entry['size']:,} "
                f"the archive recorded; flyarchive did not read it. {fix}"
            )
    got = sync(store.get(key, prototype=default_buffer_prototype()))  # local: regular files only
    if got is None:
        raise missing
    blob = got.to_bytes()
    digest = hashlib.sha256(blob).hexdigest()
    if digest != entry["sha256"] or len(blob) != entry["size"]:
        raise CorruptArchiveError(
            f"The stored model {where!r} does not hash to its name: its bytes ({len(blob):,}) "
            f"have sha256 {digest}; its name and the archive say sha256 {entry['sha256']} "
            f"({entry['size']:,} bytes). It is damaged or was replaced; flyarchive does not "
            f"replay with it. {fix}"
        )
    return blob, entry


def model_problems(group: zarr.Group, url: str) -> list[str]:
    """What is wrong with the stored model, for ``verify`` (empty when sound or absent):
    a malformed attribute, a missing object, bytes that do not hash to its name, or bytes
    that this MuJoCo refuses or cannot load safely (checked in a child process,
    :func:`~flyarchive.store.model_check.check_model`)."""
    try:
        stored = read_model(group, url)
        if stored is not None:
            check_model(stored[0], _where(url, stored[1]), sha256=stored[1]["sha256"])
    except (CorruptArchiveError, SchemaError, ModelLoadError) as err:
        return [f"Model: {err}"]
    return []


def _where(url: str, entry: Mapping[str, Any]) -> str:
    """The kept model's file: ``"<url>/models/<sha256>.mjb"``."""
    return f"{url.rstrip('/')}/{entry['path']}"


def kept_model(url: str, storage_options: Mapping[str, Any] | None = None, *,
               group: zarr.Group | None = None) -> tuple[mujoco.MjModel, bytes]:
    """The model kept beside an archive, loaded into this process only once it is known to
    load safely; and its MJB bytes (what workers get).

    The bytes are checked against their name (:func:`read_model`), then loaded in a
    short-lived child process unless a verdict for them is kept
    (:func:`~flyarchive.store.model_check.check_model`), then here.

    Args:
        url: The archive (any fsspec URL or local path).
        storage_options: fsspec options for it.
        group: The archive's root group, opened already (a render's header's ``group``):
            the model is read through it; None: opened here.

    Raises:
        ArchiveNotFoundError: nothing at ``url``.
        ModelLoadError: the archive keeps no model, or this MuJoCo refuses it (another
            release, truncated...).
        UnsafeModelError: loading it crashed the child process, raised
            ``mujoco.FatalError``, or did not finish (the message names the file).
        CorruptArchiveError, SchemaError: the object is missing, or its bytes or the
            attribute naming it were damaged.
    """
    if group is None:
        from flyarchive.store.reader import open_group

        group = open_group(url, storage_options)
    stored = read_model(group, url)
    if stored is None:
        raise ModelLoadError(
            f"The archive at {url!r} keeps no model (it was recorded or imported with "
            "store_model=False, or before flyarchive kept models). Pass the compiled model "
            "it was recorded with: model=... (an MjModel), or --model FILE (.mjb or .xml)."
        )
    blob, entry = stored
    where = _where(url, entry)
    check_model(blob, where, sha256=entry["sha256"])
    return load_mjb(blob, f"the model kept in the archive ({where})"), blob


def load_model(source: str | os.PathLike[str],
               storage_options: Mapping[str, Any] | None = None) -> mujoco.MjModel:
    """The compiled model of an archive, or of a model file (``flyarchive.load_model``).

    - An archive (a local folder, ``file://``, ``s3://``... any fsspec URL): the model
      kept beside it, ``models/<sha256>.mjb``. It is untrusted input: its bytes are
      checked against their name, then loaded first in a short-lived child process
      (MuJoCo's loader is not memory-safe on crafted files), whose verdict is kept by
      hash in the cache folder (``FLYARCHIVE_CACHE_DIR``, else
      ``$XDG_CACHE_HOME/flyarchive``), so later loads of the same model skip it.
    - A local ``.xml`` (MJCF, with its assets beside it) or ``.mjb`` file: a model you
      trust, loaded in this process as :func:`flyarchive.models.load_model` does.

    Args:
        source: An archive's URL or path, or a model file's path.
        storage_options: fsspec options for an archive (e.g. S3 credentials).

    Returns:
        The compiled model (host memory).

    Raises:
        ModelLoadError: the archive keeps no model, or MuJoCo refuses the model (another
            release, a damaged file); a model file that is missing or of another suffix.
        UnsafeModelError: the archive's model crashed the child process that loaded it,
            raised ``mujoco.FatalError``, or did not finish; the message names the file.
            Pass a model you trust instead (``model=``, ``--model``).
        ArchiveNotFoundError: nothing at the archive's URL.
        CorruptArchiveError, SchemaError: the kept model is missing or damaged.
    """
    text = os.fspath(source)
    local = "://" not in text or text.startswith("file://")
    path = Path(text.removeprefix("file://")).expanduser()
    if local and (path.suffix.lower() in (".xml", ".mjb") or path.is_file()):
        return load_model_file(path)
    return kept_model(text, storage_options)[0]

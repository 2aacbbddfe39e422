"""How an archive names the models it keeps: the root attributes that point at its kept
forms (``model``, ``portable_model``), the objects' keys (``models/<sha256>.mjb``,
``models/<sha256>.mjz``), the entries written and read back checked, and the model's
identity (the hash that names it on every MuJoCo release).

The attributes hold hashes and sizes, never the bytes; the objects they name are read,
written and checked by :mod:`flyarchive.models.kept`. Everything here works on attributes
alone (a creation writes them, ``flyarchive info`` shows them), without the store.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from flyarchive.errors import SchemaError
from flyarchive.models.mjb import mjb_version
from flyarchive.models.portable import PortableModel

if TYPE_CHECKING:
    from flyarchive.zarr_internals import GroupMetadata

#: The archive's root attribute naming its kept MJB: ``{"sha256", "size", "mujoco", "path"}``.
MODEL_ATTR = "model"
#: The archive's root attribute naming its kept portable model (a MuJoCo spec zip, the same
#: on every MuJoCo release): ``{"sha256", "size", "path", "format", ...}``.
PORTABLE_MODEL_ATTR = "portable_model"
#: The ``format`` of a kept portable model: a zip that ``mujoco.MjSpec.from_zip`` reads.
SPEC_ZIP_FORMAT = "mujoco-spec-zip"
#: The zarr group holding the models, under the archive's root.
MODELS_GROUP = "models"
#: Largest model object read or written, bytes (NeuroMechFly's MJB is 23 MB, its spec zip
#: 1.6 MB).
MAX_MODEL_BYTES = 1 << 30
_SHA256 = re.compile(r"[0-9a-f]{64}")


def model_identity(attrs: Mapping[str, Any]) -> str | None:
    """The identity of the model an archive keeps: the SHA-256 (hex) of its portable form
    when it keeps one (the same on every MuJoCo release), else of its MJB (tied to the
    release that wrote it); None when it keeps no model.

    Args:
        attrs: The archive's root attributes (``ds.attrs``, or its zarr group's).

    Derived data (positions kept beside an archive) and caches of compiled models name
    their model by this. An entry that is not an object with a 64-hex-digit ``sha256``
    (edited or damaged) counts as absent here; :func:`flyarchive.verify` reports it.
    """
    for name in (PORTABLE_MODEL_ATTR, MODEL_ATTR):
        entry = attrs.get(name)
        sha = entry.get("sha256") if isinstance(entry, Mapping) else None
        if isinstance(sha, str) and _SHA256.fullmatch(sha):
            return sha
    return None


def model_key(sha256: str) -> str:
    """The MJB's key in the archive: ``"models/<sha256>.mjb"``."""
    return f"{MODELS_GROUP}/{sha256}.mjb"


def portable_key(sha256: str) -> str:
    """The portable model's key in the archive: ``"models/<sha256>.mjz"``."""
    return f"{MODELS_GROUP}/{sha256}.mjz"


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


def portable_entry(portable: PortableModel) -> dict[str, Any]:
    """The root attribute ``portable_model`` for a portable form: sha256 (hex), size
    (bytes), the object's key, its format, the MuJoCo release that wrote it, whether its
    XML is the source's own (``exact``), and the bodies and ``qpos0`` it compiles to.

    Raises:
        SchemaError: more than :data:`MAX_MODEL_BYTES` bytes.
    """
    if len(portable.blob) > MAX_MODEL_BYTES:
        raise SchemaError(
            f"The portable model is {len(portable.blob):,} bytes; an archive keeps models of at "
            f"most {MAX_MODEL_BYTES:,}. Record without model_source, and keep the model yourself."
        )
    return {"sha256": portable.sha256, "size": len(portable.blob),
            "path": portable_key(portable.sha256), "format": SPEC_ZIP_FORMAT,
            "mujoco": portable.mujoco, "exact": portable.exact,
            "bodies": list(portable.details["bodies"]), "qpos0": list(portable.details["qpos0"])}


def models_metadata() -> GroupMetadata:
    """The metadata of the ``models`` group."""
    from flyarchive.zarr_internals import GroupMetadata  # zarr only where a group is made

    return GroupMetadata(attributes={
        "description": "models kept by content: compiled (MJB of one MuJoCo release), "
                       "models/<sha256>.mjb; portable (MuJoCo spec zip), models/<sha256>.mjz"})


def stored_entry(attrs: Mapping[str, Any], url: str) -> dict[str, Any] | None:
    """The archive's ``model`` attribute (its MJB), checked; None when no MJB is kept.

    Raises:
        SchemaError: an attribute that is not ``{"sha256": 64 hex digits, "size": bytes,
            ...}`` (edited or damaged).
    """
    entry = _checked(attrs, MODEL_ATTR, url)
    if entry is None:
        return None
    mujoco = entry.get("mujoco")
    return {"sha256": entry["sha256"], "size": entry["size"],
            "mujoco": mujoco if isinstance(mujoco, str) else None,
            "path": model_key(entry["sha256"])}


def stored_portable(attrs: Mapping[str, Any], url: str) -> dict[str, Any] | None:
    """The archive's ``portable_model`` attribute, checked; None when no portable model is
    kept. ``bodies`` and ``qpos0`` are kept only when they are lists.

    Raises:
        SchemaError: an attribute that is not ``{"sha256": 64 hex digits, "size": bytes,
            "format": "mujoco-spec-zip", ...}`` (edited or damaged, or a format this
            flyarchive does not know).
    """
    entry = _checked(attrs, PORTABLE_MODEL_ATTR, url)
    if entry is None:
        return None
    if entry.get("format") != SPEC_ZIP_FORMAT:
        raise SchemaError(
            f"The archive at {url!r} keeps a portable model of format {entry.get('format')!r}; "
            f"this flyarchive reads {SPEC_ZIP_FORMAT!r}. Upgrade flyarchive, or pass the model "
            "yourself (model=..., --model)."
        )
    out = {"sha256": entry["sha256"], "size": entry["size"], "path": portable_key(entry["sha256"]),
           "format": SPEC_ZIP_FORMAT, "mujoco": entry.get("mujoco")
           if isinstance(entry.get("mujoco"), str) else None, "exact": entry.get("exact") is True}
    for name in ("bodies", "qpos0"):
        if isinstance(entry.get(name), list):
            out[name] = entry[name]
    return out


def _checked(attrs: Mapping[str, Any], name: str, url: str) -> Mapping[str, Any] | None:
    """The root attribute ``name`` naming a kept model, if it is well formed; None if absent."""
    entry = attrs.get(name)
    if entry is None:
        return None
    sha = entry.get("sha256") if isinstance(entry, Mapping) else None
    size = entry.get("size") if isinstance(entry, Mapping) else None
    if not isinstance(sha, str) or not _SHA256.fullmatch(sha) or not isinstance(size, int) \
            or isinstance(size, bool) or not 0 < size <= MAX_MODEL_BYTES:
        raise SchemaError(
            f"The archive at {url!r} has the attribute {name!r} = {str(entry)[:160]!r}; "
            "it must be an object with 'sha256' (64 lowercase hex digits) and 'size' (bytes, "
            f"1 to {MAX_MODEL_BYTES:,}). The archive's metadata was edited or damaged; restore "
            "its zarr.json, or pass the model yourself (model=..., --model)."
        )
    return entry


def readable_on(attrs: Mapping[str, Any], url: str = "") -> str:
    """Which MuJoCo releases can read the model an archive keeps, in words (``"any MuJoCo
    release (...)"``, ``"MuJoCo 3.16.0 only (...)"``, ``"none: no model is kept (...)"``).

    Raises:
        SchemaError: a malformed model attribute.
    """
    mjb, portable = stored_entry(attrs, url), stored_portable(attrs, url)
    if portable is not None:
        exact = f"; its MJB is exact on MuJoCo {mjb['mujoco']}" if mjb and mjb["mujoco"] else ""
        return f"any MuJoCo release (the portable model, compiled once per release{exact})"
    if mjb is not None:
        return f"MuJoCo {mjb['mujoco'] or 'of the MJB'} only (an MJB is bound to its release)"
    return "none: no model is kept (render needs --model)"

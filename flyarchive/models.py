"""The compiled MuJoCo model that replay and import need: load, save, and as bytes.

The archive's attributes never hold the model; a model travels to workers, and is
kept beside an archive (:mod:`flyarchive.store.kept_models`), as its exact compiled form
(MJB bytes). An MJB is tied to the MuJoCo release that wrote it: its header is checked
before MuJoCo reads it, and MuJoCo's own reason for refusing one (which it would
otherwise append to ``MUJOCO_LOG.TXT`` in the working folder) goes into the error.
"""

from __future__ import annotations

import functools
import hashlib
import re
import struct
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import mujoco
import numpy as np

from flyarchive.errors import CameraNotFoundError, ModelLoadError

__all__ = ["load_model", "save_mjb", "model_bytes", "model_from_bytes", "load_mjb", "check_mjb",
           "check_data", "mjb_version", "camera_names", "camera_ids", "MJB_ID", "MODEL_ATTR",
           "PORTABLE_MODEL_ATTR", "model_identity"]

#: The first int32 of every MJB file (MuJoCo's ``ID`` in ``engine_io.c``).
MJB_ID = 54321
#: The archive's root attribute naming its kept MJB: ``{"sha256", "size", "mujoco", "path"}``.
MODEL_ATTR = "model"
#: The archive's root attribute naming its kept portable model (a MuJoCo spec zip, the same
#: on every MuJoCo release): ``{"sha256", "size", "path", "format", ...}``.
PORTABLE_MODEL_ATTR = "portable_model"
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


def load_model(path: str | Path) -> mujoco.MjModel:
    """Load an MJCF ``.xml`` (with its assets beside it) or a compiled ``.mjb``.

    The file is one you trust: it is loaded in this process. A model kept in an archive
    is loaded by :func:`flyarchive.load_model` (checked in a child process first).

    Raises:
        ModelLoadError: no such file, an unknown suffix, or MuJoCo refuses the model
            (also with ``mujoco.FatalError``, loading it or making its data:
            :func:`check_data`).
    """
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"No model file at {str(path)!r}. Pass an MJCF .xml or a compiled .mjb.")
    suffix = path.suffix.lower()
    if suffix == ".mjb":
        try:
            blob = path.read_bytes()
        except OSError as err:
            raise ModelLoadError(f"Cannot read the model file {str(path)!r} ({err}).") from None
        model = load_mjb(blob, repr(str(path)))
    elif suffix == ".xml":
        try:
            model = mujoco.MjModel.from_xml_path(str(path))
        except (ValueError, RuntimeError, mujoco.FatalError) as err:
            raise ModelLoadError(f"MuJoCo could not load {str(path)!r}: {err}") from None
    else:
        raise ModelLoadError(
            f"{str(path)!r} has suffix {suffix!r}; the model must be an MJCF .xml or a compiled "
            ".mjb."
        )
    check_data(model, repr(str(path)))
    return model


def check_data(model: mujoco.MjModel, where: str = "the model") -> None:
    """Make the model's ``MjData`` once: MuJoCo checks a compiled model's sparse matrices
    and sizes there, and raises ``mujoco.FatalError`` on a damaged one; here that is a
    :class:`ModelLoadError` (NeuroMechFly: a few milliseconds).

    Raises:
        ModelLoadError: MuJoCo cannot make the model's data, with its reason.
    """
    try:
        mujoco.MjData(model)
    except (mujoco.FatalError, MemoryError) as err:
        raise ModelLoadError(
            f"MuJoCo cannot use {where}: making its MjData raised {type(err).__name__}: {err}. "
            "The model is damaged; compile it again from its XML."
        ) from None


def save_mjb(model: mujoco.MjModel, path: str | Path) -> Path:
    """Write ``model`` as a compiled ``.mjb`` (exact; tied to this MuJoCo version).

    XML would round numbers to 6 significant digits, which moves replayed pixels.

    Returns:
        The path written (missing parent folders are created).
    """
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    mujoco.mj_saveModel(model, str(path), None)
    return path


def model_bytes(model: mujoco.MjModel) -> bytes:
    """The compiled model as MJB bytes (exact; how a model travels to workers)."""
    buffer = np.empty(mujoco.mj_sizeModel(model), dtype=np.uint8)
    mujoco.mj_saveModel(model, None, buffer)
    return buffer.tobytes()


def model_from_bytes(blob: bytes) -> mujoco.MjModel:
    """The model from its MJB bytes (see :func:`model_bytes`), cached by content.

    Raises:
        ModelLoadError: the bytes are not an MJB this MuJoCo can load.
    """
    return _model_from_bytes(hashlib.sha256(blob).hexdigest(), blob)


@functools.lru_cache(maxsize=8)
def _model_from_bytes(digest: str, blob: bytes) -> mujoco.MjModel:
    return load_mjb(blob, f"the model bytes (sha256 {digest[:12]}...)")


def _version_text(header: int) -> str:
    """``3016000`` -> ``"3.16.0"``."""
    return f"{header // 1_000_000}.{header // 1000 % 1000}.{header % 1000}"


def mjb_version(blob: bytes) -> str | None:
    """The MuJoCo release that wrote an MJB (e.g. ``"3.16.0"``), from its header; None
    when ``blob`` does not start with an MJB header."""
    if len(blob) < 16:
        return None
    ident, _, _, version = struct.unpack("<4i", blob[:16])
    return _version_text(version) if ident == MJB_ID else None


def check_mjb(blob: bytes, where: str) -> None:
    """Check the header of MJB bytes against this MuJoCo, before MuJoCo reads them.

    The header is four little-endian int32: the MJB id 54321, ``sizeof(mjtNum)``, the
    number of size fields of ``mjModel``, and ``mjVERSION_HEADER`` (e.g. 3016000);
    MuJoCo loads only its own release's MJB.

    Args:
        blob: The bytes.
        where: What they are, for messages (a path, or an archive's object).

    Raises:
        ModelLoadError: not an MJB (too short, or another first number: e.g. an XML
            file), or an MJB of another MuJoCo release or build.
    """
    if len(blob) < 16 or struct.unpack("<i", blob[:4])[0] != MJB_ID:
        start = blob[:16]
        hint = " (it looks like MJCF XML: load it with load_model('x.xml'))" \
            if blob.lstrip()[:1] == b"<" else ""
        raise ModelLoadError(
            f"{where} is not a compiled MuJoCo model (.mjb): it does not start with the MJB "
            f"id {MJB_ID} (it starts with {start!r}){hint}. Pass an .mjb written by "
            "mujoco.mj_saveModel or flyarchive.models.save_mjb."
        )
    _, real, _, version = struct.unpack("<4i", blob[:16])
    if version != mujoco.mjVERSION_HEADER:
        theirs = _version_text(version)
        raise ModelLoadError(
            f"{where} was compiled by MuJoCo {theirs}; this is MuJoCo {mujoco.__version__}, "
            "which reads only the .mjb of its own release. Recompile the model from its XML "
            f"with this MuJoCo, or install mujoco=={theirs} to replay it."
        )
    if real != 8:
        raise ModelLoadError(
            f"{where} was compiled with {real}-byte floating point numbers (mjtNum); this "
            "MuJoCo uses 8-byte ones. Recompile the model from its XML with this MuJoCo."
        )


_WARNING_LOCK = threading.Lock()  # MuJoCo's warning handler is process-wide


def load_mjb(blob: bytes, where: str = "the model") -> mujoco.MjModel:
    """Load a model from MJB bytes, in memory (no file is written, not even MuJoCo's log).

    The header is checked first (:func:`check_mjb`). While MuJoCo reads the bytes, its
    warning handler is replaced, so that its reason for refusing them (truncated
    data, sizes that differ...) goes into the error instead of ``MUJOCO_LOG.TXT`` in
    the working folder.

    Args:
        blob: The MJB bytes.
        where: What they are, for messages.

    Only for bytes you trust: MuJoCo's loader is not memory-safe on crafted bytes (an
    archive's kept model goes through :mod:`flyarchive.store.model_check` first).

    Raises:
        ModelLoadError: bytes that are not an MJB this MuJoCo can load, with MuJoCo's
            reason (also when MuJoCo raises ``mujoco.FatalError``).
    """
    check_mjb(blob, where)
    name = "model.mjb"  # read from MuJoCo's asset map: no file
    messages: list[str] = []
    with _WARNING_LOCK:
        previous = mujoco.get_mju_user_warning()
        mujoco.set_mju_user_warning(messages.append)
        try:
            return mujoco.MjModel.from_binary_path(name, assets={name: blob})
        except (ValueError, RuntimeError, mujoco.FatalError) as err:
            reason = "; ".join(m.strip() for m in messages) or str(err)
            raise ModelLoadError(
                f"MuJoCo {mujoco.__version__} could not load {where}: {reason}. The file is "
                "damaged or truncated; write it again from the model (save_mjb), or recompile "
                "it from its XML."
            ) from None
        finally:
            mujoco.set_mju_user_warning(previous)


def camera_names(model: mujoco.MjModel) -> tuple[str, ...]:
    """The names of the model's cameras, in id order (unnamed ones as ``camera{i}``)."""
    return tuple(
        mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_CAMERA, i) or f"camera{i}"
        for i in range(model.ncam)
    )


def camera_ids(model: mujoco.MjModel, cameras: str | Sequence[str]) -> tuple[int, ...]:
    """The ids of named cameras, in the order asked.

    Raises:
        CameraNotFoundError: no camera asked for, an unknown name (the message lists the
            model's cameras), or a camera named twice.
    """
    names = (cameras,) if isinstance(cameras, str) else tuple(cameras)
    existing = camera_names(model)
    listing = ", ".join(map(repr, existing)) or "none"
    if not names:
        raise CameraNotFoundError(
            f"No camera was asked for. Cameras: {listing}. Pass at least one camera name."
        )
    for name in names:
        if not isinstance(name, str) or name not in existing:
            raise CameraNotFoundError(
                f"No camera {name!r} in the model. Cameras: {listing}. "
                "Pass one of them, or add a camera to the model before compiling it."
            )
    if len(set(names)) != len(names):
        raise CameraNotFoundError(f"Cameras {names!r} name one camera twice. Pass each camera once.")
    return tuple(existing.index(name) for name in names)

"""The MuJoCo model that replay and import need: load, save, as bytes, and in its portable form.

The archive's attributes never hold the model; a model travels to workers as its exact
compiled form (MJB bytes), and is kept beside an archive
(:mod:`flyarchive.store.kept_models`) in two forms: that MJB, and a portable one
(:func:`portable_model`: a MuJoCo spec zip of its MJCF and every file it references,
:mod:`flyarchive.spec_zip`). An MJB is tied to the MuJoCo release that wrote it: its
header is checked before MuJoCo reads it, and MuJoCo's own reason for refusing one (which
it would otherwise append to ``MUJOCO_LOG.TXT`` in the working folder) goes into the
error. The portable form compiles on any release; its SHA-256 is the model's identity
(:func:`model_identity`).
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import stat
import struct
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import mujoco
import numpy as np

from flyarchive.errors import CameraNotFoundError, LayoutMismatchError, ModelLoadError
from flyarchive.layout import ModelLayout, details_difference, layout_difference, model_details
from flyarchive.lru import LRUCache
from flyarchive.spec_zip import (
    FILE_ATTRIBUTES,
    MAX_FILE_BYTES,
    MAX_TOTAL_BYTES,
    PATH_ATTRIBUTES,
    XML_NAME,
    check_closed,
    name_problem,
    read_spec_zip,
    write_spec_zip,
)

__all__ = ["load_model", "save_mjb", "model_bytes", "model_from_bytes", "load_mjb", "check_mjb",
           "check_data", "mjb_version", "camera_names", "camera_ids", "MJB_ID", "MODEL_ATTR",
           "PORTABLE_MODEL_ATTR", "model_identity", "PortableModel", "portable_model",
           "compile_spec_zip", "mujoco_release", "SPEC_ZIP_FORMAT"]

#: The first int32 of every MJB file (MuJoCo's ``ID`` in ``engine_io.c``).
MJB_ID = 54321
#: The archive's root attribute naming its kept MJB: ``{"sha256", "size", "mujoco", "path"}``.
MODEL_ATTR = "model"
#: The archive's root attribute naming its kept portable model (a MuJoCo spec zip, the same
#: on every MuJoCo release): ``{"sha256", "size", "path", "format", ...}``.
PORTABLE_MODEL_ATTR = "portable_model"
#: The ``format`` of a kept portable model: a zip that ``mujoco.MjSpec.from_zip`` reads.
SPEC_ZIP_FORMAT = "mujoco-spec-zip"
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
    """Load an MJCF ``.xml`` (with its assets beside it), a spec zip (``.mjz``/``.zip``:
    an MJCF and its files, :mod:`flyarchive.spec_zip`) or a compiled ``.mjb``.

    The file is one you trust: it is loaded in this process. A model kept in an archive
    is loaded by :func:`flyarchive.load_model` (checked in a child process first).

    Raises:
        ModelLoadError: no such file, an unknown suffix, a spec zip that is refused, or
            MuJoCo refuses the model (also with ``mujoco.FatalError``, loading it or making
            its data: :func:`check_data`).
    """
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"No model file at {str(path)!r}. Pass an MJCF .xml, a spec zip "
                             "(.mjz) or a compiled .mjb.")
    suffix = path.suffix.lower()
    if suffix in (".mjb", ".mjz", ".zip"):
        try:
            blob = path.read_bytes()
        except OSError as err:
            raise ModelLoadError(f"Cannot read the model file {str(path)!r} ({err}).") from None
        model = load_mjb(blob, repr(str(path))) if suffix == ".mjb" else \
            compile_spec_zip(blob, f"the spec zip {str(path)!r}", closed=False)
    elif suffix == ".xml":
        try:
            model = mujoco.MjModel.from_xml_path(str(path))
        except (ValueError, RuntimeError, mujoco.FatalError) as err:
            raise ModelLoadError(f"MuJoCo could not load {str(path)!r}: {err}") from None
    else:
        raise ModelLoadError(
            f"{str(path)!r} has suffix {suffix!r}; the model must be an MJCF .xml, a spec zip "
            "(.mjz, .zip) or a compiled .mjb."
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
    """The model from its MJB bytes (see :func:`model_bytes`), cached by content: the
    same model object for the same bytes, shared by this process's renderers (do not
    modify it).

    Raises:
        ModelLoadError: the bytes are not an MJB this MuJoCo can load.
    """
    digest = bytes_sha256(blob)
    return _MODELS.get(digest, lambda: load_mjb(blob, f"the model bytes (sha256 {digest[:12]}...)"))


def keep_loaded(blob: bytes, model: mujoco.MjModel) -> None:
    """Let :func:`model_from_bytes` of ``blob`` answer ``model``: the model this process
    loaded from exactly those bytes already (a kept model, checked and loaded once for a
    render's planning), so that its renderers do not load them again. ``model`` must not
    be modified afterwards."""
    _MODELS.get(bytes_sha256(blob), lambda: model)


def bytes_sha256(blob: bytes) -> str:
    """The SHA-256 (hex) of ``blob``, computed once per bytes object that this process
    holds (a render asks for its model's 23 MB once per renderer and segment): kept for
    the last few objects, by identity."""
    with _DIGESTS_LOCK:
        kept = _DIGESTS.get(id(blob))
    if kept is not None and kept[0] is blob:
        return kept[1]
    digest = hashlib.sha256(blob).hexdigest()
    with _DIGESTS_LOCK:
        _DIGESTS[id(blob)] = (blob, digest)
        while len(_DIGESTS) > 4:
            del _DIGESTS[next(iter(_DIGESTS))]
    return digest


#: Models loaded from MJB bytes, by the bytes' SHA-256 (:func:`model_from_bytes`).
_MODELS: LRUCache[str, mujoco.MjModel] = LRUCache(8, name="models from MJB bytes")
#: The SHA-256 of the last bytes objects hashed, by ``id`` (the object kept alive with it).
_DIGESTS: dict[int, tuple[bytes, str]] = {}
_DIGESTS_LOCK = threading.Lock()


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


# ----------------------------------------------------------------------------- portable form
def mujoco_release() -> str:
    """This MuJoCo's release, as its MJB headers name it (e.g. ``"3.16.0"``)."""
    return _version_text(mujoco.mjVERSION_HEADER)


@dataclass(frozen=True)
class PortableModel:
    """A model's portable form, as an archive keeps it (``models/<sha256>.mjz``).

    Attributes:
        blob: A MuJoCo spec zip (``mujoco.MjSpec.from_zip`` reads it): ``model.xml`` and
            every file it references, under relative names, written deterministically
            (:func:`flyarchive.spec_zip.write_spec_zip`).
        sha256: The SHA-256 of ``blob`` (hex): the model's identity on every release.
        files: The names of the zip's files, sorted.
        details: What the model compiles to besides its layout, to check a compile on
            another release against: ``bodies`` and ``qpos0``
            (:func:`flyarchive.layout.model_details`).
        mujoco: The MuJoCo release that wrote it (e.g. ``"3.16.0"``).
        exact: Whether its XML is the source's own text (an MJCF file or spec zip: it
            compiles to the very model of the source), or MuJoCo's XML of an ``MjSpec``
            (``MjSpec.to_xml``, which writes numbers with 6 significant digits).
    """

    blob: bytes = field(repr=False)
    sha256: str
    files: tuple[str, ...]
    details: Mapping[str, Any] = field(repr=False)
    mujoco: str
    exact: bool


#: MJCF elements that name files, with the spec's folder they are looked up in.
_FILE_FOLDERS = {"mesh": "meshdir", "hfield": "meshdir", "skin": "meshdir", "flexcomp": "meshdir",
                 "texture": "texturedir"}
#: The folder of the zip each element's files go to.
_ZIP_FOLDERS = {"mesh": "meshes", "hfield": "hfields", "skin": "skins", "flexcomp": "meshes",
                "texture": "textures"}
#: Model arrays that name the files a model was compiled from, not the model.
_PATH_ARRAYS = frozenset({"paths", "mesh_pathadr", "skin_pathadr", "hfield_pathadr", "tex_pathadr"})


def portable_model(source: str | os.PathLike[str] | mujoco.MjSpec, *,
                   model: mujoco.MjModel | None = None) -> PortableModel:
    """The portable form of a model: its MJCF and every file it references, in one spec zip.

    Every file the model references (meshes, textures, height fields, skins) is read where
    MuJoCo finds it (an absolute path; a path under the MJCF file's folder and its
    ``meshdir``/``texturedir``; the spec's own assets) and kept under a relative name
    (``meshes/<file>``, ``textures/<file>``...), the references rewritten to those names.

    - An MJCF file or a spec zip keeps its own XML text (includes written in, comments
      dropped): the zip compiles to the very model the source compiles to, on this
      release and on any other that compiles the source alike.
    - An ``MjSpec`` is written out by MuJoCo (``MjSpec.to_xml``), which writes numbers with
      6 significant digits: the zip compiles to the model within about 1e-6 relative
      (NeuroMechFly: geoms within 8.3e-7 mm, bodies exact). The archive's MJB stays the
      exact form on the release that recorded it.

    The zip is then compiled here, as a reader compiles it, and checked.

    Args:
        source: A model you trust: an MJCF ``.xml`` file (with its files where it names
            them), a ``mujoco.MjSpec`` (not changed: a copy is written out; flygym worlds
            have theirs as ``world.mjcf_root``), or a spec zip (``.mjz``/``.zip``, as
            ``MjSpec.to_zip`` writes it).
        model: The compiled model being recorded: the zip must compile to its layout
            (joints and mocap bodies), its bodies and its ``qpos0``; an ``MjSpec`` also
            gets its timestep. None: the zip's own compile is the reference.

    Returns:
        The portable form.

    Raises:
        ModelLoadError: no such file; a suffix that is not ``.xml``, ``.mjz`` or ``.zip``
            (an ``.mjb`` is bound to its release); a file the model references that is
            missing or not a regular file; more than
            :data:`~flyarchive.spec_zip.MAX_TOTAL_BYTES` of files; a zip that
            :func:`~flyarchive.spec_zip.read_spec_zip` refuses; MuJoCo refuses the model;
            or the zip does not compile to the model of its MJCF source.
        LayoutMismatchError: the source does not compile to ``model`` (names the first
            difference).
    """
    if isinstance(source, mujoco.MjSpec):
        where = "the MjSpec given"
        spec = source.copy()
        if model is not None:
            spec.option.timestep = float(model.opt.timestep)
        xml, assets = _spec_files(spec, where)
        exact = None
    else:
        xml, assets, exact, where = _source_files(source)
    blob = write_spec_zip(xml, assets)
    compiled = compile_spec_zip(blob, f"the portable form of {where}")
    if exact is not None:
        difference = _arrays_difference(exact, compiled)
        if difference is not None:
            raise ModelLoadError(
                f"The portable form of {where} does not compile to the model {where} compiles "
                f"to ({difference} differs). flyarchive could not keep it; pass the model's "
                "MjSpec instead (mujoco.MjSpec.from_file(path)), or keep the MJB only."
            )
    reference = model if model is not None else compiled
    difference = _difference(ModelLayout.from_model(reference), model_details(reference), compiled)
    if difference is not None:
        raise LayoutMismatchError(
            f"{where[0].upper()}{where[1:]} does not compile to the model being recorded: "
            f"{difference}. Pass the source of that very model (the MJCF it was compiled "
            "from, or its MjSpec)."
        )
    return PortableModel(blob, hashlib.sha256(blob).hexdigest(), tuple(sorted([*assets, XML_NAME])),
                         model_details(reference), mujoco_release(), exact is not None)


def _difference(layout: ModelLayout, details: Mapping[str, Any], model: mujoco.MjModel) -> str | None:
    """How ``model`` differs from a recorded layout and details, in words; None if it does not."""
    return layout_difference(layout, ModelLayout.from_model(model)) or \
        details_difference(dict(details), model)


def _arrays_difference(a: mujoco.MjModel, b: mujoco.MjModel) -> str | None:
    """The first array of ``a`` that differs from ``b``'s (the names of files aside), or None."""
    for name in dir(a):
        if name.startswith("_") or name in _PATH_ARRAYS:
            continue
        x = getattr(a, name, None)
        if isinstance(x, np.ndarray):
            y = getattr(b, name, None)
            if not isinstance(y, np.ndarray) or x.shape != y.shape \
                    or not np.array_equal(x, y, equal_nan=x.dtype.kind == "f"):
                return f"model.{name}"
    return None


def compile_spec_zip(blob: bytes, where: str = "the spec zip", *, closed: bool = True
                     ) -> mujoco.MjModel:
    """Compile a spec zip you trust, in this process (an archive's kept zip is compiled in a
    child process first: :mod:`flyarchive.store.model_check`).

    The zip is read with bounds (:func:`flyarchive.spec_zip.read_spec_zip`); its assets are
    named relative to its MJCF file, as ``mujoco.MjSpec.from_zip`` names them.

    Args:
        blob: The zip's bytes.
        where: What it is, for messages.
        closed: Check, as for a kept one, that its MJCF names only files it holds, by their
            names in it (:func:`flyarchive.spec_zip.check_closed`). False: MuJoCo resolves
            them as ``MjSpec.from_zip`` does (``meshdir`` and the like apply).

    Raises:
        ModelLoadError: a zip that is refused (the reason named), or MuJoCo refuses the model.
    """
    try:
        files = read_spec_zip(blob)
        if closed:
            check_closed(files)
    except ValueError as err:
        raise ModelLoadError(f"{where[0].upper()}{where[1:]} cannot be used. {err}") from None
    try:
        model = mujoco.MjSpec.from_string(files.xml.decode("utf-8"), assets=files.assets).compile()
    except (ValueError, RuntimeError, UnicodeDecodeError, mujoco.FatalError) as err:
        raise ModelLoadError(f"MuJoCo {mujoco.__version__} could not compile {where}: {err}") \
            from None
    check_data(model, where)
    return model


def _source_files(source: str | os.PathLike[str]
                  ) -> tuple[bytes, dict[str, bytes], mujoco.MjModel, str]:
    """The XML and files of an MJCF file or a spec zip, for the zip; the model the source
    compiles to; and the source in words."""
    try:
        path = Path(os.fspath(source)).expanduser()
    except TypeError:
        raise ModelLoadError(
            f"A model source must be an MJCF .xml path, a spec zip (.mjz, .zip) or a "
            f"mujoco.MjSpec, got {type(source).__name__}."
        ) from None
    where = repr(str(path))
    suffix = path.suffix.lower()
    if suffix not in (".xml", ".mjz", ".zip"):
        hint = (" An .mjb is bound to the MuJoCo release that wrote it; pass the MJCF it was "
                "compiled from.") if suffix == ".mjb" else ""
        raise ModelLoadError(
            f"{where} has suffix {suffix!r}; a model source is an MJCF .xml (with its files), "
            f"a spec zip (.mjz, .zip) or a mujoco.MjSpec.{hint}"
        )
    if not path.is_file():
        raise ModelLoadError(f"No model file at {where}. Pass an MJCF .xml or a spec zip.")
    vfs: dict[str, bytes] | None = None
    try:
        text = path.read_bytes() if suffix == ".xml" or path.stat().st_size <= MAX_TOTAL_BYTES \
            else None
    except OSError as err:
        raise ModelLoadError(f"Cannot read the model file {where} ({err}).") from None
    if text is None:
        raise ModelLoadError(f"{where} is {path.stat().st_size:,} bytes; a spec zip of at most "
                             f"{MAX_TOTAL_BYTES:,} is read.")
    if suffix != ".xml":
        try:
            files = read_spec_zip(text)
        except ValueError as err:
            raise ModelLoadError(f"The spec zip {where} cannot be used. {err} Write it again "
                                 "(mujoco.MjSpec.to_zip), or pass its MJCF file.") from None
        text, vfs = files.xml, files.assets
    try:
        spec = mujoco.MjSpec.from_file(str(path)) if vfs is None else \
            mujoco.MjSpec.from_string(text.decode("utf-8"), assets=vfs)
    except (ValueError, RuntimeError, mujoco.FatalError) as err:
        raise ModelLoadError(f"MuJoCo {mujoco.__version__} could not read {where}: {err}") \
            from None
    root = _parse_xml(text, where)
    if vfs is None:
        _write_in_includes(root, path.parent, {path.resolve()}, where)
    elif any(element.tag == "include" for element in root.iter()):
        raise ModelLoadError(f"{where} has an MJCF with <include>; a spec zip holds one MJCF "
                             "file (MuJoCo's MjSpec.to_zip writes includes in).")
    assets: dict[str, bytes] = {}
    total = 0
    for element in root.iter():
        for key in [k for k in element.attrib if k in FILE_ATTRIBUTES]:
            value = element.attrib[key]
            if element.tag not in _FILE_FOLDERS:
                raise ModelLoadError(
                    f"{where} names the file {value!r} in <{element.tag} {key}>, which flyarchive "
                    "cannot keep (it keeps the files of meshes, textures, height fields, skins "
                    "and flexcomps). Pass the model's MjSpec instead, or keep the MJB only.")
            directory = str(getattr(spec, _FILE_FOLDERS[element.tag]) or "")
            data = _asset_bytes(spec, vfs, directory, value, element.tag,
                                element.get("name", ""), where)
            total += len(data)
            if total > MAX_TOTAL_BYTES:
                raise ModelLoadError(f"The files {where} references hold more than "
                                     f"{MAX_TOTAL_BYTES:,} bytes; flyarchive keeps less.")
            element.set(key, _asset_name(assets, _ZIP_FOLDERS[element.tag], value, data))
        if element.tag == "compiler":
            for key in (*PATH_ATTRIBUTES, "strippath"):
                element.attrib.pop(key, None)
    try:
        exact = spec.compile()
    except (ValueError, RuntimeError, mujoco.FatalError) as err:
        raise ModelLoadError(f"MuJoCo {mujoco.__version__} could not compile {where}: {err}") \
            from None
    return ElementTree.tostring(root, encoding="utf-8"), assets, exact, where


def _parse_xml(text: bytes, where: str) -> ElementTree.Element:
    try:
        return ElementTree.fromstring(text)
    except ElementTree.ParseError as err:
        raise ModelLoadError(
            f"{where} cannot be read as XML by Python ({err}). Pass its MjSpec instead "
            "(mujoco.MjSpec.from_file(path)): MuJoCo's own XML of it is kept."
        ) from None


def _write_in_includes(parent: ElementTree.Element, folder: Path, seen: set[Path],
                       where: str) -> None:
    """Replace every ``<include file>`` under ``parent`` by the children of the included
    file's ``<mujoco>`` (files named relative to the main MJCF file's ``folder``), as MuJoCo does."""
    for index, child in reversed(list(enumerate(parent))):
        if child.tag != "include":
            _write_in_includes(child, folder, seen, where)
            continue
        path = (folder / child.get("file", "")).resolve()
        if path in seen:
            raise ModelLoadError(f"{where} includes {str(path)!r} twice (or within itself).")
        try:
            included = _parse_xml(path.read_bytes(), repr(str(path)))
        except OSError as err:
            raise ModelLoadError(f"Cannot read {str(path)!r}, which {where} includes ({err}).") \
                from None
        _write_in_includes(included, folder, seen | {path}, where)
        parent.remove(child)
        for offset, element in enumerate(list(included)):
            parent.insert(index + offset, element)


def _spec_files(spec: mujoco.MjSpec, where: str) -> tuple[bytes, dict[str, bytes]]:
    """MuJoCo's XML of ``spec`` and the files it references, by their names in the zip
    (the spec's references rewritten to those names; its asset folders cleared)."""
    assets: dict[str, bytes] = {}
    total = 0
    for collection, tag in (("meshes", "mesh"), ("hfields", "hfield"), ("skins", "skin"),
                            ("textures", "texture")):
        directory = str(getattr(spec, _FILE_FOLDERS[tag]) or "")
        for element in getattr(spec, collection):
            values = [element.file] + (list(element.cubefiles) if tag == "texture" else [])
            names = []
            for value in values:
                if value:
                    data = _asset_bytes(spec, None, directory, str(value), tag, element.name,
                                        where)
                    total += len(data)
                    if total > MAX_TOTAL_BYTES:
                        raise ModelLoadError(f"The files {where} references hold more than "
                                             f"{MAX_TOTAL_BYTES:,} bytes; flyarchive keeps less.")
                    value = _asset_name(assets, _ZIP_FOLDERS[tag], str(value), data)
                names.append(value)
            element.file = names[0]
            if tag == "texture":
                element.cubefiles = names[1:]
    spec.meshdir = ""
    spec.texturedir = ""
    spec.strippath = False
    spec.assets = assets
    try:
        xml = spec.to_xml()
    except (ValueError, RuntimeError, mujoco.FatalError) as err:
        raise ModelLoadError(f"MuJoCo {mujoco.__version__} could not write {where} as XML: "
                             f"{err}") from None
    return xml.encode("utf-8"), assets


def _asset_bytes(spec: mujoco.MjSpec, vfs: Mapping[str, bytes] | None, directory: str,
                 value: str, kind: str, name: str, where: str) -> bytes:
    """The bytes of the file ``value`` that an element of ``spec`` references, found as
    MuJoCo finds it: in the spec's assets (``vfs``: also the files of a spec zip, the only
    place looked in when a zip is the source), else (its path stripped with ``strippath``)
    at an absolute path, under an absolute asset folder, or under the MJCF file's folder
    and its asset folder."""
    what = f"the {kind} {name!r} of {where}" if name else f"a {kind} of {where}"
    known = dict(spec.assets) if vfs is None else vfs
    for key in (posixpath.join(directory, value) if directory else value, value):
        if key in known:
            return bytes(known[key])
    if vfs is not None:
        raise ModelLoadError(f"{what[0].upper()}{what[1:]} names the file {value!r}, which the "
                             "zip does not hold. Put the file in the zip beside the MJCF file.")
    file = os.path.basename(value) if spec.strippath else value
    if os.path.isabs(file):
        path = Path(file)
    elif os.path.isabs(directory):
        path = Path(directory, file)
    else:
        path = Path(spec.modelfiledir or "", directory, file)
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise ModelLoadError(f"{what[0].upper()}{what[1:]} names the file {value!r}, and "
                                 f"{str(path)!r} is not a regular file. Point it at the file.")
        if st.st_size > MAX_FILE_BYTES:
            raise ModelLoadError(f"{what[0].upper()}{what[1:]} names the file {str(path)!r} of "
                                 f"{st.st_size:,} bytes; flyarchive keeps files of at most "
                                 f"{MAX_FILE_BYTES:,}.")
        return path.read_bytes()
    except FileNotFoundError:
        raise ModelLoadError(
            f"{what[0].upper()}{what[1:]} names the file {value!r}, which is not at "
            f"{str(path)!r}. Put the file there, or correct the path in the model.") from None
    except OSError as err:
        raise ModelLoadError(f"Cannot read the file {str(path)!r} that {what} names ({err}).") \
            from None


def _asset_name(assets: dict[str, bytes], folder: str, value: str, data: bytes) -> str:
    """The name in the zip of a file with bytes ``data`` that the model calls ``value``:
    ``<folder>/<its file name>``, or the name the same file has already; another file of
    the same name goes one folder down, named by part of its hash, so that its file name
    (which names an unnamed mesh or texture) stays. Added to ``assets``."""
    base = posixpath.basename(value.replace("\\", "/"))
    if name_problem(base) is not None or base.startswith(".") or base.lower().endswith(".xml"):
        ext = posixpath.splitext(base)[1][:16]
        base = "file" + (ext if ext.lower() != ".xml" and name_problem(f"f{ext}") is None else "")
    name = f"{folder}/{base}"
    if assets.get(name, data) != data:
        name = f"{folder}/{hashlib.sha256(data).hexdigest()[:16]}/{base}"
    assets[name] = data
    return name

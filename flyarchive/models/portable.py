"""A model's portable form: its MJCF and every file it references, in one MuJoCo spec zip
(:func:`portable_model`), and a spec zip you trust compiled (:func:`compile_spec_zip`).

The MJB of a model is exact but bound to the MuJoCo release that wrote it
(:mod:`flyarchive.models.mjb`); the portable form compiles on any release, so an archive
keeps both (:mod:`flyarchive.models.kept`), and the portable form's SHA-256 is the
model's identity (:func:`flyarchive.models.model_identity`). The zip is written
deterministically and read with bounds (:mod:`flyarchive.models.spec_zip`); it is checked
to compile to the model it was made from before it is kept.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import mujoco
import numpy as np

from flyarchive.errors import LayoutMismatchError, ModelLoadError
from flyarchive.layout import ModelLayout, details_difference, layout_difference, model_details
from flyarchive.models.mjb import check_data, mujoco_release
from flyarchive.models.spec_zip import (
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


@dataclass(frozen=True)
class PortableModel:
    """A model's portable form, as an archive keeps it (``models/<sha256>.mjz``).

    Attributes:
        blob: A MuJoCo spec zip (``mujoco.MjSpec.from_zip`` reads it): ``model.xml`` and
            every file it references, under relative names, written deterministically
            (:func:`flyarchive.models.spec_zip.write_spec_zip`).
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
            :data:`~flyarchive.models.spec_zip.MAX_TOTAL_BYTES` of files; a zip that
            :func:`~flyarchive.models.spec_zip.read_spec_zip` refuses; MuJoCo refuses the model;
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
    if difference is None and model is not None:
        difference = geometry_difference(model, compiled)
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


#: Arrays of the model being recorded that its source must compile to (to
#: :data:`GEOMETRY_TOLERANCE`): where bodies, joints, geoms, sites and cameras are and
#: what shape the geoms have; what replay, positions and renders depend on.
GEOMETRY_ARRAYS = ("body_pos", "body_quat", "jnt_pos", "jnt_axis", "geom_type", "geom_size",
                   "geom_pos", "geom_quat", "site_pos", "site_quat", "cam_pos", "cam_quat")
#: Largest difference allowed in :data:`GEOMETRY_ARRAYS`, relative to max(1, |value|): an
#: MjSpec's XML keeps 6 significant digits (about 5e-7 relative).
GEOMETRY_TOLERANCE = 1e-5


def geometry_difference(model: mujoco.MjModel, compiled: mujoco.MjModel, *,
                        named: str = "model") -> str | None:
    """The first of :data:`GEOMETRY_ARRAYS` where ``compiled`` differs from ``model``
    (a model changed in memory after compiling, or the source of another model of the
    same joints), in words (``model`` called ``named``); None if none does."""
    for name in GEOMETRY_ARRAYS:
        want = np.asarray(getattr(model, name), dtype=np.float64)
        got = np.asarray(getattr(compiled, name), dtype=np.float64)
        if want.shape != got.shape:
            return f"{named}.{name} has shape {want.shape}, the source's {got.shape}"
        gap = np.abs(want - got) / np.maximum(1.0, np.abs(want))
        gap[np.isnan(gap)] = np.inf
        if gap.size and not (gap <= GEOMETRY_TOLERANCE).all():
            at = np.unravel_index(int(np.argmax(gap)), gap.shape)
            row = int(at[0])
            return (f"{named}.{name}[{row}] is {want[row].tolist()}, the source compiles to "
                    f"{got[row].tolist()}")
    return None


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
    child process first: :mod:`flyarchive.models.check`).

    The zip is read with bounds (:func:`flyarchive.models.spec_zip.read_spec_zip`); its assets are
    named relative to its MJCF file, as ``mujoco.MjSpec.from_zip`` names them.

    Args:
        blob: The zip's bytes.
        where: What it is, for messages.
        closed: Check, as for a kept one, that its MJCF names only files it holds, by their
            names in it (:func:`flyarchive.models.spec_zip.check_closed`). False: MuJoCo resolves
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

"""MuJoCo spec zips: a model's portable form, written byte for byte the same and read with bounds.

A spec zip holds one MJCF file and every file it references (meshes, textures, height
fields, skins), under relative names: what ``mujoco.MjSpec.to_zip`` writes and
``mujoco.MjSpec.from_zip`` reads. An archive keeps its model in this form beside the
compiled MJB (:mod:`flyarchive.models.kept`): any MuJoCo release can compile it,
and its SHA-256 names the model on every release.

:func:`write_spec_zip` writes one deterministically (entries sorted by name, a fixed
timestamp and mode, one compression level): the same XML and files give the same bytes.
:func:`read_spec_zip` reads one that may be hostile, with bounds checked before anything
is decompressed: at most :data:`MAX_FILES` entries, :data:`MAX_FILE_BYTES` per file and
:data:`MAX_TOTAL_BYTES` in all, as the zip's directory declares them (a zip bomb
declares what it holds, or is cut off where it lies: Python's ``zipfile`` never yields
more than an entry's declared size, and checks its CRC); names that lead out of the zip
(``..``, absolute, a drive), links and other files that are not regular, duplicates and
encrypted entries are refused. :func:`check_closed` checks that an XML names only files
the zip holds, so that MuJoCo, compiling it from memory, never falls back to the disk of
the machine that reads it.

Standard library only: the child process that compiles a kept model
(``flyarchive/models/child.py``) loads this file by its path, and imports nothing
else of flyarchive. Every refusal is a ``ValueError`` whose message is one sentence or two,
without the file's name (the caller adds where it is): the functions here raise no other.
"""

from __future__ import annotations

import io
import posixpath
import stat
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from xml.etree import ElementTree

#: The name of the MJCF file in the zips flyarchive writes.
XML_NAME = "model.xml"
#: Most entries read from a zip.
MAX_FILES = 4096
#: Largest file read from a zip, bytes (uncompressed).
MAX_FILE_BYTES = 512 << 20
#: Largest total of the files read from a zip, bytes (uncompressed).
MAX_TOTAL_BYTES = 1 << 30
#: Longest entry name, characters.
MAX_NAME = 1024
#: The timestamp of every entry written (the earliest a zip can hold).
TIMESTAMP = (1980, 1, 1, 0, 0, 0)
#: Compression of every entry written (zlib level 6).
COMPRESSLEVEL = 6
#: MJCF attributes whose values are file names (``file``, and a cube texture's six faces).
FILE_ATTRIBUTES = frozenset({"file", "fileright", "fileleft", "fileup", "filedown", "filefront",
                             "fileback"})
#: ``<compiler>`` attributes that move where files are looked up: a kept model sets none.
PATH_ATTRIBUTES = ("meshdir", "texturedir", "assetdir")


@dataclass(frozen=True)
class SpecFiles:
    """The files of a spec zip, read.

    Attributes:
        xml_name: The MJCF file's name in the zip.
        xml: Its bytes.
        assets: Every other file, by its name relative to the MJCF file's folder (as
            ``MjSpec.from_zip`` names them), bytes.
    """

    xml_name: str
    xml: bytes
    assets: dict[str, bytes]

    @property
    def total_bytes(self) -> int:
        """The files' size, bytes."""
        return len(self.xml) + sum(len(b) for b in self.assets.values())


def name_problem(name: str) -> str | None:
    """What is wrong with ``name`` as a file's name in a spec zip (a relative POSIX path
    that stays inside the zip), in words; None when nothing is."""
    if not name or len(name) > MAX_NAME:
        return f"has {len(name)} characters (1 to {MAX_NAME} allowed)"
    if "\\" in name or "\x00" in name or any(ord(c) < 32 for c in name):
        return "holds a backslash or a control character"
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        return "is an absolute path"
    parts = name.rstrip("/").split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "holds an empty, '.' or '..' part: it could lead out of the zip"
    return None


def write_spec_zip(xml: bytes, assets: Mapping[str, bytes], *, xml_name: str = XML_NAME) -> bytes:
    """A spec zip of ``xml`` (saved as ``xml_name``) and ``assets``, deterministically:
    entries sorted by name, each with :data:`TIMESTAMP`, mode 0644, deflated at level
    :data:`COMPRESSLEVEL`.

    Raises:
        ValueError: a name that :func:`name_problem` refuses, an asset named like the
            XML, or an asset whose name ends in ``.xml`` (a spec zip holds one MJCF file).
    """
    files = dict(assets)
    if xml_name in files:
        raise ValueError(f"An asset is named {xml_name!r}, like the MJCF file.")
    files[xml_name] = xml
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name in sorted(files):
            problem = name_problem(name)
            if problem is not None:
                raise ValueError(f"The file name {name!r} {problem}.")
            if name != xml_name and name.lower().endswith(".xml"):
                raise ValueError(f"The asset {name!r} is an XML file; a spec zip holds one.")
            info = zipfile.ZipInfo(name, date_time=TIMESTAMP)
            info.create_system = 3  # Unix: the mode below is read as one
            info.external_attr = (stat.S_IFREG | 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, files[name], compresslevel=COMPRESSLEVEL)
    return buffer.getvalue()


def read_spec_zip(blob: bytes, *, max_files: int = MAX_FILES, max_file_bytes: int = MAX_FILE_BYTES,
                  max_total_bytes: int = MAX_TOTAL_BYTES) -> SpecFiles:
    """The files of the spec zip ``blob``, which may be hostile (see the module's docstring).

    Args:
        blob: The zip's bytes.
        max_files, max_file_bytes, max_total_bytes: The bounds (entries; bytes of one
            file and of all, uncompressed, as declared: a file that holds more than it
            declares is refused when read).

    Returns:
        The MJCF file and the assets, named relative to its folder.

    Raises:
        ValueError: not a zip; more entries or bytes than the bounds; a name that leads
            out of the zip, a link or another file that is not regular, a name twice,
            an encrypted entry or an unknown compression; not exactly one ``.xml`` file;
            an asset outside the MJCF file's folder; a file whose bytes do not match its
            declared size or CRC.
    """
    try:
        archive = zipfile.ZipFile(io.BytesIO(blob))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as err:
        raise ValueError(f"It is not a readable zip ({err}).") from None
    with archive:
        infos = archive.infolist()
        if len(infos) > max_files:
            raise ValueError(f"It holds {len(infos):,} entries; at most {max_files:,} are read.")
        files = list(_regular_files(infos, max_file_bytes, max_total_bytes))
        xmls = [info for info in files if info.filename.lower().endswith(".xml")]
        if len(xmls) != 1:
            listed = ", ".join(repr(i.filename) for i in xmls[:5]) or "none"
            raise ValueError(
                f"It holds {len(xmls)} MJCF (.xml) files ({listed}); a spec zip holds exactly "
                "one, with every file it references (as mujoco.MjSpec.to_zip writes it).")
        folder = posixpath.dirname(xmls[0].filename)
        assets: dict[str, bytes] = {}
        xml = b""
        for info in files:
            data = _read(archive, info)
            if info is xmls[0]:
                xml = data
                continue
            if folder and not info.filename.startswith(f"{folder}/"):
                raise ValueError(
                    f"The file {info.filename!r} lies outside the folder {folder!r} of the MJCF "
                    f"file {xmls[0].filename!r}; a spec zip keeps its files beside or below it.")
            assets[info.filename[len(folder) + 1:] if folder else info.filename] = data
    return SpecFiles(xmls[0].filename, xml, assets)


def declared_bytes(blob: bytes) -> int:
    """The uncompressed size the zip ``blob`` declares for its files, bytes (at most
    :data:`MAX_TOTAL_BYTES` + 1; 0 for bytes that are not a readable zip): what compiling
    it may need, known before anything is inflated."""
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as archive:
            infos = archive.infolist()[:MAX_FILES + 1]
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError):
        return 0
    return min(sum(info.file_size for info in infos), MAX_TOTAL_BYTES + 1)


def _regular_files(infos: list[zipfile.ZipInfo], max_file_bytes: int,
                   max_total_bytes: int) -> Iterator[zipfile.ZipInfo]:
    """The entries that are files (not folders), each checked, with the bounds."""
    seen: set[str] = set()
    total = 0
    for info in infos:
        name = info.filename
        problem = name_problem(name)
        if problem is not None:
            raise ValueError(f"It holds the entry {name!r}, whose name {problem}.")
        if name.rstrip("/") in seen:
            raise ValueError(f"It holds the entry {name!r} twice.")
        seen.add(name.rstrip("/"))
        kind = stat.S_IFMT(info.external_attr >> 16) if info.create_system == 3 else 0
        if kind == stat.S_IFLNK:
            raise ValueError(f"Its entry {name!r} is a symbolic link; a spec zip holds files.")
        if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
            raise ValueError(f"Its entry {name!r} is not a regular file (mode {kind:o}).")
        if info.is_dir() or kind == stat.S_IFDIR:
            continue
        if info.flag_bits & 0x1:
            raise ValueError(f"Its entry {name!r} is encrypted.")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise ValueError(
                f"Its entry {name!r} uses compression method {info.compress_type}; only stored "
                "and deflated entries are read.")
        if info.file_size > max_file_bytes:
            raise ValueError(
                f"Its file {name!r} is {info.file_size:,} bytes uncompressed; at most "
                f"{max_file_bytes:,} are read per file.")
        total += info.file_size
        if total > max_total_bytes:
            raise ValueError(
                f"Its files hold more than {max_total_bytes:,} bytes uncompressed (at "
                f"{name!r}); that is more than a model needs.")
        yield info


def _read(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    """One entry's bytes: never more than its declared size; its CRC checked."""
    try:
        with archive.open(info) as f:
            data = f.read(info.file_size + 1)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, RuntimeError) as err:
        raise ValueError(f"Its file {info.filename!r} cannot be read ({err}).") from None
    if len(data) != info.file_size:
        raise ValueError(
            f"Its file {info.filename!r} holds {len(data):,} bytes; its entry declares "
            f"{info.file_size:,}.")
    return data


def check_closed(files: SpecFiles) -> None:
    """Check that the MJCF of ``files`` names only files the zip holds, by their names in
    it, so that compiling it from memory reads nothing else: no ``<include>``, no
    ``meshdir``, ``texturedir``, ``assetdir`` or ``strippath`` on ``<compiler>`` (a kept
    model names its files from its own folder), every ``file`` attribute one of the
    zip's files.

    Raises:
        ValueError: naming the first element that breaks the rule.
    """
    try:
        root = ElementTree.fromstring(files.xml)
    except (ElementTree.ParseError, ValueError) as err:
        raise ValueError(f"Its MJCF is not well-formed XML ({err}).") from None
    if root.tag != "mujoco":
        raise ValueError(f"Its MJCF's root element is <{root.tag[:40]}>, not <mujoco>.")
    for element in root.iter():
        if element.tag == "include":
            raise ValueError(
                f"Its MJCF has <include file={element.get('file', '')[:200]!r}>; a kept model "
                "is one MJCF file (MuJoCo's to_xml writes includes out).")
        if element.tag == "compiler":
            for key in PATH_ATTRIBUTES:
                if element.get(key):
                    raise ValueError(
                        f"Its MJCF sets <compiler {key}={element.get(key, '')[:200]!r}>; a kept "
                        "model names its files from its own folder.")
            if element.get("strippath", "false").lower() == "true":
                raise ValueError("Its MJCF sets <compiler strippath='true'>; a kept model "
                                   "names its files by their names in the zip.")
        for key, value in element.attrib.items():
            if key not in FILE_ATTRIBUTES:
                continue
            problem = name_problem(value)
            if problem is not None:
                raise ValueError(
                    f"Its MJCF's <{element.tag} {key}={value[:200]!r}> names a file whose name "
                    f"{problem}; a kept model names only files of its zip.")
            if value not in files.assets:
                raise ValueError(
                    f"Its MJCF's <{element.tag} {key}={value[:200]!r}> names a file the zip "
                    "does not hold; a kept model holds every file it names.")

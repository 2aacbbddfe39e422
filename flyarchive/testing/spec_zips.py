"""Portable models for tests: hostile spec zips, and archives whose kept models are edited.

:func:`zip_of` writes any entries (names that leave the zip, links, several MJCF files),
:func:`with_declared_size` makes an entry declare another uncompressed size (a zip bomb
declares more than a model needs; a lying entry holds more than it declares);
:func:`as_another_release` makes an archive's kept MJB one of another MuJoCo release (its
header edited, renamed by its hash: only the release differs), so that this release
replays it from its portable form, as a newer release would; :func:`put_portable` puts a
spec zip in place of (or beside) an archive's portable model, consistent with its name,
so that only compiling it can tell. :data:`SLOW_XML` compiles for hours.

Nothing here is needed to record or replay.
"""

from __future__ import annotations

import hashlib
import io
import json
import stat
import struct
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["zip_of", "with_declared_size", "as_another_release", "put_portable", "kept_file",
           "SLOW_XML", "mesh_xml", "box_obj"]

#: An MJCF whose compile never ends in practice and needs little memory: MuJoCo computes the
#: actuator's length range by simulating it for 1e9 s (``lengthrange inttotal``).
SLOW_XML = """<mujoco>
  <compiler><lengthrange mode="all" useexisting="false" inttotal="1e9"/></compiler>
  <worldbody>
    <body><joint name="j" type="hinge" range="-1 1"/><geom size=".1" pos=".2 0 0"/></body>
  </worldbody>
  <actuator><motor joint="j"/></actuator>
</mujoco>
"""

#: A box mesh in OBJ (8 vertices, 12 triangles).
_BOX = ("".join(f"v {x} {y} {z}\n" for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)) + (
    "f 1 3 4\nf 1 4 2\nf 5 6 8\nf 5 8 7\nf 1 2 6\nf 1 6 5\n"
    "f 3 7 8\nf 3 8 4\nf 1 5 7\nf 1 7 3\nf 2 4 8\nf 2 8 6\n")).encode()


def mesh_xml(file: str) -> str:
    """An MJCF of one body on a hinge whose geom is the mesh in ``file`` (a name, a path)."""
    return (f'<mujoco><asset><mesh name="m" file="{file}"/></asset><worldbody><body>'
            '<joint name="j" type="hinge"/><geom type="mesh" mesh="m"/></body></worldbody>'
            "</mujoco>")


def zip_of(entries: Mapping[str, bytes | str], *, links: Mapping[str, str] | None = None) -> bytes:
    """A zip of ``entries`` (name -> bytes or text), names as given (``../x``, ``/x``...), and
    of symbolic links (name -> target) as Unix zip tools store them."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(zipfile.ZipInfo(name), data)
        for name, target in (links or {}).items():
            info = zipfile.ZipInfo(name)
            info.create_system = 3
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, target)
    return buffer.getvalue()


def box_obj() -> bytes:
    """A box mesh in OBJ."""
    return _BOX


def with_declared_size(blob: bytes, name: str, size: int) -> bytes:
    """``blob`` (a zip) whose entry ``name`` declares ``size`` uncompressed bytes, in its
    local header and in the central directory; its data and CRC are left as they were."""
    data = bytearray(blob)
    with zipfile.ZipFile(io.BytesIO(blob)) as archive:
        offset = archive.getinfo(name).header_offset
    struct.pack_into("<I", data, offset + 22, size)
    encoded = name.encode()
    at = 0
    while True:
        at = data.find(b"PK\x01\x02", at)
        if at < 0:
            raise ValueError(f"no central directory entry for {name!r}")
        length = struct.unpack_from("<H", data, at + 28)[0]
        if bytes(data[at + 46:at + 46 + length]) == encoded:
            struct.pack_into("<I", data, at + 24, size)
            return bytes(data)
        at += 4


def kept_file(url: str, attribute: str = "model") -> Path:
    """The file of the model that the root attribute ``attribute`` (``"model"`` or
    ``"portable_model"``) of the local archive ``url`` names."""
    root = json.loads((Path(url) / "zarr.json").read_text())
    return Path(url) / root["attributes"][attribute]["path"]


def _put(url: str, attribute: str, blob: bytes, suffix: str, fields: Mapping[str, Any]) -> Path:
    meta = Path(url) / "zarr.json"
    root = json.loads(meta.read_text())
    old = root["attributes"].get(attribute)
    digest = hashlib.sha256(blob).hexdigest()
    entry = {**(old or {}), **fields, "sha256": digest, "size": len(blob),
             "path": f"models/{digest}.{suffix}"}
    if old is not None and (Path(url) / old["path"]).exists():
        (Path(url) / old["path"]).unlink()
    new = Path(url) / entry["path"]
    new.parent.mkdir(exist_ok=True)
    new.write_bytes(blob)
    root["attributes"][attribute] = entry
    meta.write_text(json.dumps(root, indent=2))
    return new


def as_another_release(url: str, version: int = 3015000) -> Path:
    """Make the MJB kept beside the local archive ``url`` one of another MuJoCo release
    (``version`` as in an MJB header: 3015000 is 3.15.0): its header edited, the file named
    and the attribute ``model`` recorded by its new hash and release. Returns its path."""
    blob = kept_file(url).read_bytes()
    edited = blob[:12] + struct.pack("<i", version) + blob[16:]
    release = f"{version // 1_000_000}.{version // 1000 % 1000}.{version % 1000}"
    return _put(url, "model", edited, "mjb", {"mujoco": release})


def put_portable(url: str, blob: bytes, **fields: Any) -> Path:
    """Put the spec zip ``blob`` as the portable model of the local archive ``url`` (in place
    of the one it keeps, or as its first), named and recorded by its own hash; ``fields``
    update the attribute ``portable_model`` (a new one gets format ``mujoco-spec-zip``).
    Returns its path."""
    return _put(url, "portable_model", blob, "mjz", {"format": "mujoco-spec-zip", **fields})

"""Output folders are untrusted input too: what flyarchive reads back from one, and where it
writes into one, is guarded as an archive is (:mod:`flyarchive.store.localstore`).

- Reads (``manifest.json``, depth and segmentation arrays, videos) open only regular files
  inside the output folder: never a symbolic link leading out of it, a FIFO (the open
  would block), a device (``/dev/zero`` never ends) or a socket, and never more bytes than
  the file can need (:func:`read_bytes`, :func:`check_file`).
- Writes: a folder inside the output folder that is a symbolic link leading out of it is
  refused before anything is written (:func:`check_out_folders`), and each output is
  checked again where it is published (:func:`confine`).

On object stores there are no links, FIFOs or devices: sizes are checked before reading.
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from flyarchive.errors import UnsafeFileError
from flyarchive.store.localstore import IrregularFileError, kind_of, open_regular
from flyarchive.store.location import is_local, local_path

_DAMAGED = ("The output folder was damaged or tampered with; flyarchive reads and writes "
            "only regular files and folders inside it.")


def refuse(path: str, problem: str, fix: str) -> UnsafeFileError:
    """The error for a file or folder of an output folder that flyarchive does not open."""
    return UnsafeFileError(f"{path} {problem}. {fix} {_DAMAGED}")


def confine(path: str | os.PathLike[str], root: str | os.PathLike[str] | None, *,
            what: str = "the output folder") -> str:
    """The real path of a local ``path`` (links resolved); refuses one leading out of ``root``.

    Args:
        path: A local path inside ``root`` (it need not exist).
        root: The output folder; None: no confinement (the real path is returned).
        what: What ``root`` is, for the message.

    Raises:
        UnsafeFileError: the real path is outside the real path of ``root``.
    """
    real = os.path.realpath(path)
    if root is None:
        return real
    top = os.path.realpath(root)
    if real != top and not real.startswith(top.rstrip(os.sep) + os.sep):
        raise refuse(os.fspath(path), f"leads out of {what} {os.fspath(root)!r} "
                     f"(to {real}); flyarchive never reads or writes through it",
                     "Replace the link by the file or folder itself, or choose another "
                     "output folder.")
    return real


def check_file(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None
               ) -> os.stat_result | None:
    """The stat of the regular local file at ``path`` (inside ``root``); None if there is none.

    Raises:
        UnsafeFileError: it leads out of ``root``, or is a FIFO, device, socket or folder.
    """
    real = confine(path, root)
    try:
        st = os.lstat(real)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else kind_of(st.st_mode)
        raise refuse(os.fspath(path), f"is {kind}, not a regular file; flyarchive never "
                     "opens it (reading it could block forever or never end)",
                     "Delete or move it away, and render again.")
    return st


def read_bytes(url: str, storage_options: Mapping[str, Any] | None = None, *,
               max_bytes: int, root: str | None = None,
               what: str = "the output folder") -> bytes | None:
    """The bytes of a file of an output folder, read only if it is safe to; None if missing.

    Args:
        url: A local path, ``file://`` or another fsspec URL.
        storage_options: fsspec options of ``url``.
        max_bytes: Most bytes the file may hold.
        root: Local files: the output folder the file must be inside; None: only the file
            itself must be a regular file (links to one are followed).
        what: What ``root`` is, for messages.

    Raises:
        UnsafeFileError: a local file leading out of ``root``, a FIFO, device or socket,
            or a file of more than ``max_bytes`` bytes (not read).
        StorageError, StorageBackendMissingError: the URL cannot be used.
    """
    if is_local(url):
        return _read_local(str(local_path(url)), max_bytes, root, what)
    from flyarchive.video.workspace import filesystem

    fs, path = filesystem(url, storage_options or {})
    try:
        size = fs.info(path).get("size")
    except FileNotFoundError:
        return None
    if not isinstance(size, int) or size > max_bytes:
        raise _too_large(url, size, max_bytes)
    data = fs.cat_file(path, start=0, end=max_bytes + 1)
    if len(data) > max_bytes:  # replaced by a larger object meanwhile
        raise _too_large(url, len(data), max_bytes)
    return bytes(data)


def _read_local(path: str, max_bytes: int, root: str | None, what: str) -> bytes | None:
    try:
        found = open_regular(confine(path, root, what=what), restore="the file, or render again")
    except IrregularFileError as err:
        raise refuse(path, err.problem, err.fix) from None
    if found is None:
        return None
    fd, st = found
    with io.FileIO(fd, "rb", closefd=True) as f:
        if st.st_size > max_bytes:
            raise _too_large(path, st.st_size, max_bytes)
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:  # grew meanwhile
        raise _too_large(path, len(data), max_bytes)
    return data


def _too_large(path: str, size: object, max_bytes: int) -> UnsafeFileError:
    return refuse(path, f"is {size} bytes, more than the {max_bytes} bytes flyarchive reads "
                  "from such a file; it was not read", "Move it away, and render again.")


def check_out_folders(out: str, storage_options: Mapping[str, Any],
                      urls: Iterable[str]) -> None:
    """Refuse, before anything is written, an output folder holding a symbolic link that
    leads out of it on the way to one of ``urls`` (a ``world00003`` folder linked
    elsewhere would get the videos and maps written there).

    Args:
        out: The output folder (links in the path to it are the user's: followed).
        storage_options: fsspec options of ``out``.
        urls: The paths or URLs that will be written, each inside ``out``.

    Raises:
        UnsafeFileError: naming the link, where it leads and the output folder.
    """
    if not is_local(out):
        return
    base = str(local_path(out)).rstrip(os.sep) or os.sep
    seen: set[str] = set()
    for url in urls:
        path = str(local_path(url))
        if not path.startswith(base + os.sep):
            continue
        parts = path[len(base) + 1:].split(os.sep)
        here = base
        for part in parts:
            here = os.path.join(here, part)
            if here in seen:
                continue
            seen.add(here)
            if os.path.islink(here):
                confine(here, base)
            elif not os.path.isdir(here):
                break  # missing (made by the render) or a file (refused where it is written)


def make_parent(target: Path, root: str | os.PathLike[str] | None) -> None:
    """Make the folder of a local output, which must stay inside ``root`` (checked before
    and after it is made: a folder linked out of the output folder is never written into).

    Raises:
        UnsafeFileError: the folder leads out of ``root``.
    """
    if root is not None:
        confine(target.parent, root)
    target.parent.mkdir(parents=True, exist_ok=True)
    if root is not None:
        confine(target.parent, root)

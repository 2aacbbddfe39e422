"""Files flyarchive writes on local disk outside archives (exports, tables, plots): each
written whole under a temporary name beside its target and renamed into place, with the
permissions a new file of this process gets (its umask), so a killed process or a full
disk never leaves a partial file under the name nor damages the file that was there.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def make_folder(folder: Path) -> None:
    """``folder`` made (with its parents) if missing.

    Raises:
        StorageError: it cannot be made (a part of the path is a file, no permission, a
            read-only file system...), in one line with the likely fix.
    """
    from flyarchive.store.storage_errors import local_error

    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise local_error(str(folder), err, "create the folder") from None


def refuse_inside_archive(path: str | os.PathLike[str], flag: str) -> None:
    """Refuse a local output location at or inside an archive's folder (one holding a
    ``zarr.json``): what is written there is not part of the archive, and makes it
    hard to read, copy and verify.

    Args:
        path: The output file or folder (need not exist).
        flag: How the user named it, for the message (``"--out"``, ``"out="``...).

    Raises:
        OutputLocationError: naming the archive and a place beside it.
    """
    from flyarchive.errors import OutputLocationError

    here = Path(os.path.abspath(os.path.expanduser(os.fspath(path))))
    held = [f for f in (here, *here.parents) if (f / "zarr.json").is_file()]
    if not held:
        return
    folder = held[-1]  # the outermost: the archive, not one of its arrays or groups
    beside = folder.parent / f"{folder.stem}-{here.name if here != folder else 'out'}"
    raise OutputLocationError(
        f"{os.fspath(path)!r} is inside the archive (or zarr group) at '{folder}': what is "
        f"written there is not part of it. Pass {flag} a place outside it, e.g. '{beside}'.")


def refuse_nested_archive(path: str | os.PathLike[str]) -> None:
    """Refuse a new archive inside another's folder (one of its parents holds a
    ``zarr.json``): replacing, moving or deleting the outer one would take it along, and
    ``verify`` of the outer one would not name it.

    Raises:
        OutputLocationError: naming the outer archive and a place beside it.
    """
    from flyarchive.errors import OutputLocationError

    here = Path(os.path.abspath(os.path.expanduser(os.fspath(path))))
    held = [f for f in here.parents if _zarr_node(f / "zarr.json")]
    if held:
        folder = held[-1]
        raise OutputLocationError(
            f"{os.fspath(path)!r} is inside the archive (or zarr group) at '{folder}': an "
            "archive there would be deleted with it (mode='w'), copied and moved with it, "
            f"and unknown to its verify. Record beside it, e.g. "
            f"'{folder.parent / (folder.stem + '-' + here.name)}'. Nothing was written.")


def _zarr_node(path: Path) -> bool:
    """``path`` is the ``zarr.json`` of a zarr node (a file of that name of something else,
    a program's configuration, is not)."""
    try:
        if not path.is_file() or path.stat().st_size > 1 << 22:
            return path.is_file()  # (a huge one: taken for a node, not read)
        document = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(document, dict) and "zarr_format" in document and "node_type" in document


def write_whole(target: Path, write: Callable[[str], object], *,
                suffix: str | None = None) -> None:
    """``write(path)`` into a temporary file beside ``target`` (its folder made if
    missing), flushed to disk, then rename it to ``target``.

    Args:
        suffix: The temporary file's (default ``.tmp<target's suffix>``), e.g. one that
            names this process, for leftovers of killed writers to be found.

    Raises:
        StorageError: the folder or the file cannot be written (one line, the likely fix).
    """
    from flyarchive.errors import FlyarchiveError
    from flyarchive.store.storage_errors import local_error

    make_folder(target.parent)
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                   suffix=f".tmp{target.suffix}" if suffix is None else suffix)
    except OSError as err:
        raise local_error(str(target), err) from None
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as written:  # on disk before it takes the name
            os.fsync(written.fileno())
        os.chmod(tmp, 0o666 & ~umask())  # mkstemp's file is 0600: as a new file would be
        os.replace(tmp, target)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) and not isinstance(err, FlyarchiveError):
            raise local_error(str(target), err) from None
        raise


def umask() -> int:
    """This process's umask, read without changing it where Linux shows it (else set and
    set back at once)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask

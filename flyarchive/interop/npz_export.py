"""Worlds of an archive out as flygym ``RecordedTrajectory`` ``.npz`` files.

flygym defines ``time`` as the simulation time of each frame, so a file's ``time`` is the
archive's ``sim_time`` (the time at which each frame was recorded: ``0.0001, 0.008, ...``
in flygym's loop), as ``.trajectory`` gives it; archives written before ``sim_time``
existed keep the simulation time in ``time``, which is written then. Beside flygym's
fields, a file of an archive that has them also holds the archive's own coordinates,
which flygym's ``RecordedTrajectory.from_file`` ignores and ``import_npz`` reads back:
``scheduled_time`` (the ``time`` coordinate: each frame's scheduled time, ``0.0, 0.008,
...``) and ``frame`` (its index on the frame schedule, -1: unknown). An archive exported
then imported so has the same ``time``, ``sim_time`` and ``frame``.

No file is ever half-written under its final name. In a local folder each file is
written to a temporary name beside it (``.world00003.npz.<random>.<pid>.tmp``),
flushed to disk, then renamed (atomic); a killed export leaves at most temporary
files, which the next export into that folder removes (those of processes that are
gone). At any other fsspec URL (``s3://``, ``memory://``...) each file is one PUT
of its complete bytes, which object stores make visible only once whole.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flyarchive.errors import (
    OutputExistsError,
    OutputLocationError,
    SelectionError,
    StorageError,
    missing_storage_backend,
)
from flyarchive.query import open_archive
from flyarchive.query.selection import parse_world_ids
from flyarchive.store.location import as_url
from flyarchive.store.local_files import refuse_inside_archive, write_whole
from flyarchive.store.storage_errors import (
    check_storage_options,
    filesystem,
    is_remote,
    local_error,
    translated,
)

#: Fields of an exported file beyond flygym's: the archive's ``time`` and ``frame`` coordinates.
SCHEDULED_TIME_KEY = "scheduled_time"
FRAME_KEY = "frame"

_TMP_SUFFIX = ".tmp"
_OBJECT_STORES = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "memory"}


@dataclass(frozen=True)
class NpzExport:
    """What :func:`export_npz` did.

    Attributes:
        files: Paths or URLs of the files written, in world order.
        skipped: World ids not exported because they have no committed frame
            (flygym cannot load a 0-frame trajectory).
    """

    files: list[str] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)


def npz_name(world: int) -> str:
    """The file name of a world: ``world00003.npz``."""
    return f"world{world:05d}.npz"


def export_npz(
    url: str | os.PathLike[str],
    out_dir: str | Path,
    *,
    worlds: Sequence[int] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    out_storage_options: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    progress: Callable[[int, int], object] | None = None,
) -> NpzExport:
    """Write worlds of an archive as flygym ``.npz`` files (``{out_dir}/world{id:05d}.npz``).

    flygym's ``RecordedTrajectory.from_file`` loads them unchanged; only committed
    frames are exported, and worlds without any are skipped. ``time`` is each frame's
    simulation time (``sim_time``), as flygym defines it; the archive's scheduled time
    and frame index go along as ``scheduled_time`` and ``frame`` (see the module's text).

    Args:
        url: The archive.
        out_dir: A local folder (``~`` is expanded; created if missing) or an fsspec URL.
        worlds: World ids to export (default all).
        storage_options: fsspec options of the archive.
        out_storage_options: fsspec options of ``out_dir`` (default: ``storage_options``
            when ``out_dir`` is a URL).
        overwrite: Replace existing files.
        progress: Called as ``progress(files_done, files_total)`` after each file.

    Raises:
        SelectionError: a world id not in the archive, ``worlds`` that are not whole
            numbers each given once (a world named twice would be one file reported
            twice), or no chosen world has frames.
        OutputExistsError: a file exists and ``overwrite`` is False (nothing is written).
        OutputLocationError: ``out_dir`` is a file.
        StorageError: the output cannot be written (no permission, disk full, unreachable
            storage); files written before stay complete, none is half-written.
    """
    asked = parse_world_ids(worlds)  # whole numbers, each once: one file per world
    url = as_url(url)
    if "://" not in str(out_dir) or str(out_dir).startswith("file://"):
        refuse_inside_archive(str(out_dir).removeprefix("file://"), "--to (out_dir=...)")
    ds = open_archive(url, storage_options)
    ids = [int(w) for w in ds.world.values]
    chosen = ids if asked is None else asked
    unknown = [w for w in chosen if w not in ids]
    if unknown or not chosen:
        raise SelectionError(
            f"World(s) {unknown or chosen} are not in the archive {url!r}; it has worlds "
            f"{ids[:20]}{'...' if len(ids) > 20 else ''}."
        )
    n_frames = dict(zip(ids, (int(n) for n in ds.n_frames.values)))
    skipped = [w for w in chosen if n_frames[w] == 0]
    todo = [w for w in chosen if n_frames[w] > 0]
    if not todo:
        raise SelectionError(
            f"World(s) {skipped[:20]} of {url!r} have no committed frames; there is nothing to "
            "export (flygym cannot load an empty trajectory)."
        )
    out = str(out_dir)
    remote = is_remote(out)
    sink: _Sink = (_FsspecSink(out, out_storage_options if out_storage_options is not None
                               else storage_options) if remote
                   else _LocalSink(os.path.expanduser(out.removeprefix("file://"))))
    names = [npz_name(w) for w in todo]
    existing = sink.existing(names)
    if existing and not overwrite:
        raise OutputExistsError(
            f"{existing[:3]} already exist{'s' if len(existing) == 1 else ''}"
            f"{f' (and {len(existing) - 3} more)' if len(existing) > 3 else ''}; pass "
            "overwrite=True (--overwrite) to replace them. Nothing was written."
        )
    written: list[str] = []
    for w, name in zip(todo, names):
        arrays = _arrays(ds, w, n_frames[w])  # read (and checked) before anything is made
        if not written:
            sink.prepare()  # a damaged first world leaves no empty folder behind
        written.append(sink.write(name, arrays))
        if progress is not None:
            progress(len(written), len(todo))
    return NpzExport(written, skipped)


def _arrays(ds: Any, world: int, n: int) -> dict[str, np.ndarray]:
    one = ds.sel(world=world)
    schedule = "sim_time" in ds.variables and "frame" in ds.variables
    arrays = {
        # flygym's time is the simulation time (sim_time); older archives keep it in time
        "time": np.asarray(ds["sim_time" if schedule else "time"].values[:n]),
        "qpos": np.asarray(one.qpos.values[:n]),
        "output_fps": np.asarray(ds.attrs["output_fps"]),
        "playback_speed": np.asarray(ds.attrs["playback_speed"]),
        "world_id": np.asarray(world),
    }
    if "mocap_pos" in ds:
        arrays["mocap_pos"] = np.asarray(one.mocap_pos.values[:n])
        arrays["mocap_quat"] = np.asarray(one.mocap_quat.values[:n])
    if schedule:  # ignored by flygym, read back by import_npz
        arrays[SCHEDULED_TIME_KEY] = np.asarray(ds["time"].values[:n])
        arrays[FRAME_KEY] = np.asarray(ds["frame"].values[:n])
    return arrays


class _Sink:
    """Where the files go."""

    def existing(self, names: list[str]) -> list[str]:
        raise NotImplementedError

    def prepare(self) -> None:
        raise NotImplementedError

    def write(self, name: str, arrays: dict[str, np.ndarray]) -> str:
        raise NotImplementedError


class _LocalSink(_Sink):
    """A local folder: temporary name, fsync, atomic rename."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        if self.folder.exists() and not self.folder.is_dir():
            raise OutputLocationError(
                f"{folder!r} is a file, not a folder; export-npz writes one .npz per world "
                "into a folder. Choose a folder path (it is created if missing)."
            )

    def existing(self, names: list[str]) -> list[str]:
        return [str(self.folder / n) for n in names if (self.folder / n).exists()]

    def prepare(self) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise local_error(str(self.folder), err, "create the folder") from None
        for leftover in self.folder.glob(f".world*.npz.*{_TMP_SUFFIX}"):
            pid = leftover.name[: -len(_TMP_SUFFIX)].rsplit(".", 1)[-1]
            if pid.isdigit() and not _alive(int(pid)):
                leftover.unlink(missing_ok=True)  # from an export that was killed

    def write(self, name: str, arrays: dict[str, np.ndarray]) -> str:
        final = self.folder / name

        def save(path: str) -> None:
            with open(path, "wb") as f:  # (a path would get ".npz" appended)
                np.savez_compressed(f, **arrays)

        write_whole(final, save, suffix=f".{os.getpid()}{_TMP_SUFFIX}")
        return str(final)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


class _FsspecSink(_Sink):
    """Any fsspec URL: each file is one PUT of its complete bytes."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None) -> None:
        self.url = url.rstrip("/")
        check_storage_options(url, storage_options)
        self.options = dict(storage_options or {})
        with translated(url, self.options):
            try:
                self.fs, self.root = filesystem(self.url, self.options)
            except ImportError as err:
                raise missing_storage_backend(url, err) from None
            except ValueError as err:
                raise StorageError(
                    f"Cannot write to {url!r}: {err}. Use a local folder or an fsspec URL of a "
                    "known protocol (s3://, gs://, memory://...)."
                ) from None
            if self.fs.isfile(self.root):
                raise OutputLocationError(
                    f"{url!r} is a file, not a folder; export-npz writes one .npz per world "
                    "under a folder URL. Choose another URL."
                )

    def _path(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/{name}"

    def existing(self, names: list[str]) -> list[str]:
        with translated(self.url, self.options):
            return [f"{self.url}/{n}" for n in names if self.fs.exists(self._path(n))]

    def prepare(self) -> None:
        protocols = {self.fs.protocol} if isinstance(self.fs.protocol, str) else set(self.fs.protocol)
        if protocols & _OBJECT_STORES:
            return  # no folders to make; and a missing bucket is an error, not created here
        with translated(self.url, self.options):
            self.fs.makedirs(self.root, exist_ok=True)

    def write(self, name: str, arrays: dict[str, np.ndarray]) -> str:
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **arrays)
        with translated(self.url, self.options):
            self.fs.pipe_file(self._path(name), buffer.getvalue())
        return f"{self.url}/{name}"

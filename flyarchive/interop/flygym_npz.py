"""flygym ``RecordedTrajectory`` ``.npz`` files into archives (export: :mod:`.npz_export`).

A flygym 2.1 ``.npz`` holds one world: ``time`` (n,), ``qpos`` (n, nq),
``output_fps``, ``playback_speed``, ``world_id`` and, for models with mocap
bodies, ``mocap_pos`` (n, nmocap, 3) and ``mocap_quat`` (n, nmocap, 4). Files are
read with ``allow_pickle=False``. ``time`` is flygym's: the simulation time of each
frame; it becomes the archive's ``sim_time``, and also its ``time`` unless the file
holds ``scheduled_time`` and ``frame`` (as :func:`export_npz` writes them): then those
become ``time`` and ``frame``, so that an archive exported and imported again keeps
all three coordinates.

An import is marked complete only at its end: the archive is created with the
attribute ``npz_import`` (``state: "importing"``, the number of files and frames, a
SHA-256 of the files), frames are committed block by block, and ``state`` becomes
``"complete"`` last. An interrupted import is a valid archive with fewer frames;
``flyarchive info`` and ``verify`` report it as partial, and
``import_npz(..., resume=True)`` (``--resume``) finishes it.
"""

from __future__ import annotations

import hashlib
import os
import zipfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mujoco
import numpy as np

from flyarchive.clock import Timing
from flyarchive.errors import (
    ArchiveExistsError,
    ArchiveNotFoundError,
    ImportMismatchError,
    LayoutMismatchError,
    NonFiniteStateError,
    NpzFormatError,
    OptionsError,
    SelectionError,
)
from flyarchive.interop.npz_export import FRAME_KEY, SCHEDULED_TIME_KEY, NpzExport, export_npz
from flyarchive.layout import ModelLayout
from flyarchive.models import model_bytes, portable_model
from flyarchive.schema import IMPORT_ATTR, finite_frames, import_status
from flyarchive.store import ArchiveSpec, ArchiveWriter, FrameBlock, open_for_reading, open_for_writing
from flyarchive.store.consolidated import consolidate
from flyarchive.store.location import as_url

__all__ = [
    "import_npz", "export_npz", "read_npz", "find_npz_files", "import_status", "NpzTrajectory",
    "NpzExport", "IMPORT_ATTR", "ORIGINAL_ID_VAR",
]

_REQUIRED = ("time", "qpos", "output_fps", "playback_speed", "world_id")
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
#: ``(world,)`` variable holding the files' own ``world_id`` when worlds were renumbered.
ORIGINAL_ID_VAR = "original_world_id"


@dataclass(frozen=True)
class NpzTrajectory:
    """One world read from a flygym ``.npz`` file (host arrays)."""

    path: str
    time: np.ndarray
    qpos: np.ndarray
    output_fps: float
    playback_speed: float
    world_id: int
    mocap_pos: np.ndarray | None
    mocap_quat: np.ndarray | None
    scheduled_time: np.ndarray | None = None
    frame: np.ndarray | None = None


# ----------------------------------------------------------------------------- reading
def _check_is_npz(path: str) -> None:
    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except OSError as err:
        raise NpzFormatError(f"{path!r} cannot be read ({err.strerror or err}).") from None
    if head.startswith(b"\x93NUMPY"):
        raise NpzFormatError(
            f"{path!r} is a single-array .npy file, not an .npz file. Pass the .npz files that "
            "flygym's RecordedTrajectory.save writes (a zip of named arrays)."
        )
    if not head.startswith(_ZIP_MAGIC):
        raise NpzFormatError(
            f"{path!r} is not an .npz file (it does not start like a zip archive). Pass the "
            ".npz files that flygym's RecordedTrajectory.save writes."
        )


def read_npz(path: str | Path) -> NpzTrajectory:
    """Read and check one flygym ``RecordedTrajectory`` file, without pickle.

    Raises:
        NpzFormatError: not an .npz file, missing fields, object arrays (pickle),
            inconsistent shapes, times that are not finite and strictly increasing.
        NonFiniteStateError: NaN or infinity in qpos or the mocap poses.
    """
    path = str(path)
    _check_is_npz(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [k for k in _REQUIRED if k not in data.files]
            if missing:
                raise NpzFormatError(
                    f"{path!r} is not a flygym RecordedTrajectory file: fields {missing} are "
                    f"missing (it has {sorted(data.files)}). Save it with RecordedTrajectory.save."
                )
            arrays = {k: data[k] for k in data.files}
    except ValueError as err:
        if "pickle" in str(err):
            raise NpzFormatError(
                f"{path!r} holds pickled Python objects, which flyarchive never loads "
                "(unpickling can run arbitrary code). Save plain numeric arrays instead."
            ) from None
        raise NpzFormatError(f"{path!r} is not a readable .npz file ({err}).") from None
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as err:
        raise NpzFormatError(
            f"{path!r} is a damaged .npz file ({type(err).__name__}: {err}); it may be truncated."
        ) from None
    return _check_fields(path, arrays)


def _check_fields(path: str, a: dict[str, np.ndarray]) -> NpzTrajectory:
    time, qpos = np.asarray(a["time"]), np.asarray(a["qpos"])
    n = len(time) if time.ndim == 1 else -1
    if n < 1 or qpos.ndim != 2 or qpos.shape[0] != n:
        raise NpzFormatError(
            f"{path!r}: time must be (n,) and qpos (n, nq) with n >= 1; got {time.shape} "
            f"and {qpos.shape}."
        )
    if qpos.dtype not in (np.float32, np.float64) or time.dtype.kind != "f":
        raise NpzFormatError(
            f"{path!r}: qpos must be float32 or float64 and time floating point; got "
            f"{qpos.dtype} and {time.dtype}."
        )
    has_pos, has_quat = "mocap_pos" in a, "mocap_quat" in a
    if has_pos != has_quat:
        raise NpzFormatError(f"{path!r}: mocap_pos and mocap_quat must come together.")
    if has_pos:
        pos, quat = a["mocap_pos"], a["mocap_quat"]
        if pos.shape[:1] != (n,) or pos.shape[2:] != (3,) or quat.shape != (*pos.shape[:2], 4) \
                or pos.dtype.kind != "f" or quat.dtype.kind != "f":
            raise NpzFormatError(
                f"{path!r}: mocap_pos must be (n, nmocap, 3) and mocap_quat (n, nmocap, 4) "
                f"floats with n={n}; got {pos.shape} {pos.dtype} and {quat.shape} {quat.dtype}."
            )
    for key in ("output_fps", "playback_speed", "world_id"):
        if np.shape(a[key]) != () or a[key].dtype.kind not in "iuf":
            raise NpzFormatError(f"{path!r}: {key} must be a number, got {a[key]!r}.")
    _check_values(path, a, time)
    return NpzTrajectory(
        path, time.astype(np.float64), qpos, _number(a["output_fps"]),
        _number(a["playback_speed"]),
        int(a["world_id"]), a.get("mocap_pos"), a.get("mocap_quat"), *_schedule(path, a, n),
    )


def _schedule(path: str, a: dict[str, np.ndarray], n: int
              ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The file's ``scheduled_time`` (float64) and ``frame`` (int64), written by
    :func:`export_npz` beside flygym's fields; None, None when it has neither."""
    has = (SCHEDULED_TIME_KEY in a, FRAME_KEY in a)
    if not any(has):
        return None, None
    if not all(has):
        raise NpzFormatError(
            f"{path!r}: {SCHEDULED_TIME_KEY} and {FRAME_KEY} must come together (flyarchive's "
            "export writes both); remove the other one, or export the file again.")
    scheduled, frame = np.asarray(a[SCHEDULED_TIME_KEY]), np.asarray(a[FRAME_KEY])
    if scheduled.shape != (n,) or frame.shape != (n,) or scheduled.dtype.kind != "f" \
            or frame.dtype.kind not in "iu":
        raise NpzFormatError(
            f"{path!r}: {SCHEDULED_TIME_KEY} must be (n,) floats and {FRAME_KEY} (n,) whole "
            f"numbers with n={n}; got {scheduled.shape} {scheduled.dtype} and {frame.shape} "
            f"{frame.dtype}.")
    if not np.isfinite(scheduled).all() or (np.diff(scheduled) <= 0).any() or (frame < -1).any():
        raise NpzFormatError(
            f"{path!r}: {SCHEDULED_TIME_KEY} must be finite and strictly increasing, and "
            f"{FRAME_KEY} at least -1 (unknown); export the file again.")
    return scheduled.astype(np.float64), frame.astype(np.int64)


def _number(value: np.ndarray) -> float:
    """A 0-d number of an npz as Python's: a whole number stays an int (an export of an
    archive recorded with ``output_fps=50`` imports as 50, not 50.0, and exports so again)."""
    return int(value) if value.dtype.kind in "iu" else float(value)


def _check_values(path: str, a: dict[str, np.ndarray], time: np.ndarray) -> None:
    """Refuse what the recorder refuses: non-finite states, times not strictly increasing."""
    for key in ("output_fps", "playback_speed"):
        if not np.isfinite(a[key]) or a[key] <= 0:
            raise NpzFormatError(f"{path!r}: {key} must be a positive number, got {a[key]!r}.")
    world_id = a["world_id"]
    if not np.isfinite(world_id) or world_id != np.floor(world_id) or not 0 <= world_id < 2**63:
        raise NpzFormatError(
            f"{path!r}: world_id must be a whole number from 0 to 2**63 - 1, got {world_id!r}."
        )
    if not np.isfinite(time).all():
        raise NpzFormatError(f"{path!r}: time holds NaN or infinity at frame "
                             f"{int(np.flatnonzero(~np.isfinite(time))[0])}.")
    steps = np.flatnonzero(np.diff(time) <= 0)
    if steps.size:
        i = int(steps[0]) + 1
        raise NpzFormatError(
            f"{path!r}: time is not strictly increasing at frame {i} ({time[i - 1]!r} s, then "
            f"{time[i]!r} s). One file is one run; split spliced runs into separate files."
        )
    for key in ("qpos", "mocap_pos", "mocap_quat"):
        if key in a:
            bad = ~finite_frames(a[key])
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise NonFiniteStateError(
                    f"{path!r}: {key} holds NaN or infinity at frame {i} "
                    f"(t={float(time[i]):g} s); the simulation diverged. flyarchive refuses "
                    "non-finite states, as the recorder does. Cut the file before that frame, "
                    "or fix the simulation."
                )


def find_npz_files(paths: str | Path | Sequence[str | Path]) -> list[Path]:
    """The ``.npz`` files of ``paths``, in order: files as given, folders' ``*.npz`` sorted.

    ``~`` is expanded.

    Raises:
        SelectionError: a path that does not exist, a folder without ``.npz`` files, no
            files, a file given twice (also through a folder or a link).
    """
    items = [paths] if isinstance(paths, (str, Path)) else list(paths)
    files: list[Path] = []
    for item in (Path(p).expanduser() for p in items):
        if item.is_dir():
            found = sorted(item.glob("*.npz"))
            if not found:
                raise SelectionError(f"The folder {str(item)!r} holds no .npz files.")
            files += found
        elif item.is_file():
            files.append(item)
        else:
            raise SelectionError(f"No file or folder at {str(item)!r}.")
    if not files:
        raise SelectionError("No .npz files were given.")
    seen: dict[str, Path] = {}
    for file in files:
        same = seen.setdefault(os.path.realpath(file), file)
        if same is not file:
            raise SelectionError(
                f"{str(file)!r} is given twice (also as {str(same)!r}, or through a folder "
                "given too): one run's world would be imported twice. Give each file once.")
    return files


def _check_same_run(trajs: list[NpzTrajectory], model: mujoco.MjModel, renumber: bool) -> None:
    first = trajs[0]
    for t in trajs:
        nmocap = 0 if t.mocap_pos is None else t.mocap_pos.shape[1]
        if t.qpos.shape[1] != model.nq or nmocap != model.nmocap:
            raise LayoutMismatchError(
                f"{t.path!r} has nq={t.qpos.shape[1]}, nmocap={nmocap}; the model has "
                f"nq={model.nq}, nmocap={model.nmocap}. Pass the model it was recorded with."
            )
        if (t.output_fps, t.playback_speed, t.qpos.dtype) != (
            first.output_fps, first.playback_speed, first.qpos.dtype
        ):
            raise NpzFormatError(
                f"{t.path!r} and {first.path!r} differ in output_fps, playback_speed or dtype; "
                "import them into separate archives."
            )
        n = min(len(t.time), len(first.time))
        if not all(_same_prefix(getattr(t, key), getattr(first, key), n)
                   for key in ("time", "scheduled_time", "frame")):
            raise NpzFormatError(
                f"{t.path!r} and {first.path!r} sample different times; one archive shares one "
                "time axis. Import them into separate archives."
            )
    if renumber:
        return
    seen: dict[int, str] = {}
    for t in trajs:
        if t.world_id in seen:
            raise NpzFormatError(
                f"{Path(seen[t.world_id]).name!r} and {Path(t.path).name!r} both have world_id "
                f"{t.world_id}; world ids must be unique. flygym's CPU Simulation saves every "
                "file with world_id=0: pass renumber=True (--renumber) to number the worlds "
                "0, 1, ... in file order (the files' ids are kept as 'original_world_id')."
            )
        seen[t.world_id] = t.path


def _same_prefix(a: np.ndarray | None, b: np.ndarray | None, n: int) -> bool:
    """Both None, or equal in their first ``n`` values."""
    if a is None or b is None:
        return a is None and b is None
    return np.array_equal(a[:n], b[:n])


# ----------------------------------------------------------------------------- the marker
def _marker(trajs: list[NpzTrajectory], renumber: bool) -> dict[str, Any]:
    digest = hashlib.sha256(b"renumber" if renumber else b"ids")
    for t in trajs:
        with open(t.path, "rb") as f:
            digest.update(hashlib.file_digest(f, "sha256").digest())
    return {"state": "importing", "files": len(trajs), "frames": max(len(t.time) for t in trajs),
            "renumber": renumber, "sha256": digest.hexdigest()}


def _mark_complete(url: str, storage_options: Mapping[str, Any] | None,
                   marker: Mapping[str, Any]) -> None:
    group = open_for_writing(url, storage_options)
    group.attrs.update({IMPORT_ATTR: {**marker, "state": "complete"}})
    consolidate(group, n_time=int(np.max(group["n_frames"][:], initial=0)))  # root rewritten


# ----------------------------------------------------------------------------- import
def import_npz(
    paths: str | Path | Sequence[str | Path],
    url: str,
    model: mujoco.MjModel,
    *,
    mode: str = "w-",
    resume: bool = False,
    renumber: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    codec: str = "lossless",
    chunk_frames: int = 100,
    progress: Callable[[int, int], object] | None = None,
    store_model: bool = True,
    takeover: bool = False,
    model_source: Any = None,
) -> str:
    """Import flygym ``.npz`` trajectories (files or folders of them) into one archive.

    Each file is one world; files may have different lengths but must sample the same
    times. The timestep comes from ``model``; values keep their dtype bit for bit.

    Args:
        paths: ``.npz`` files or folders of them (``~`` is expanded).
        url: The archive to create: a local path or any fsspec URL.
        model: The model the files were recorded with.
        mode: ``"w-"`` refuse if anything is at ``url`` (default); ``"w"`` replace it.
            ``"a"`` means ``resume=True``.
        resume: Finish an interrupted import into ``url``: same files, same model; the
            frames it committed are kept and the rest written. Without an archive at
            ``url`` the import starts from the beginning; a complete one is left as is.
        renumber: Number the worlds 0, 1, ... in file order instead of using the files'
            ``world_id`` (flygym's CPU Simulation saves every file with ``world_id=0``);
            the files' ids are kept as the ``(world,)`` variable ``original_world_id``.
            Without it, worlds are ordered by ``world_id``, which must be unique.
        codec: ``"lossless"`` or ``"abs:<bound>"`` (see :mod:`flyarchive.codecs`).
        chunk_frames: Frames per chunk (a resumed import keeps the archive's).
        progress: Called as ``progress(frames_done, frames_total)`` after each commit.
        store_model: Keep ``model`` (its exact MJB bytes) beside the archive as
            ``models/<sha256>.mjb``, so that replay needs no model (default). False: keep
            only its layout; replay then needs the model.
        takeover: Take over the writer claim that a crashed writer (on another host) left
            on ``url`` (:mod:`flyarchive.store.claims`).
        model_source: What ``model`` was compiled from (an MJCF ``.xml``, a spec zip or a
            ``mujoco.MjSpec``), kept beside the archive as its portable form
            (``models/<sha256>.mjz``), so that any MuJoCo release can replay it (see
            :class:`~flyarchive.TrajectoryRecorder`); None: only the MJB.

    Returns:
        The archive URL.

    Raises:
        NpzFormatError, NonFiniteStateError: a file that is not a valid flygym trajectory.
        LayoutMismatchError: files of another model, or a ``model_source`` that does not
            compile to ``model``.
        ModelLoadError: ``model_source`` cannot be made portable (a file it names is missing...).
        SelectionError: no such file or folder.
        ArchiveExistsError: something is at ``url`` (without ``mode="w"`` or ``resume``).
        ImportMismatchError: ``resume`` with other files, or into an archive that no
            import made.
        StorageError: the storage failed; what was committed stays.
    """
    if mode == "a":
        mode, resume = "w-", True
    if mode not in ("w-", "w"):
        raise OptionsError(f"mode must be 'w-' or 'w' (or resume=True), got {mode!r}.")
    if resume and mode == "w":
        raise OptionsError("resume=True continues an archive and mode='w' replaces it; choose one.")
    trajs = [read_npz(p) for p in find_npz_files(paths)]
    if not renumber:
        trajs.sort(key=lambda t: t.world_id)
    _check_same_run(trajs, model, renumber)
    marker = _marker(trajs, renumber)
    longest = max(trajs, key=lambda t: len(t.time))
    spec = ArchiveSpec(
        ModelLayout.from_model(model),
        Timing(float(model.opt.timestep), longest.output_fps, longest.playback_speed),
        tuple(range(len(trajs))) if renumber else tuple(t.world_id for t in trajs),
        dtype=str(longest.qpos.dtype), source="flygym-npz", chunk_frames=chunk_frames,
        codec=codec, attrs={IMPORT_ATTR: marker},
        world_vars={ORIGINAL_ID_VAR: np.array([t.world_id for t in trajs], np.int64)}
        if renumber else {},
        model=model_bytes(model) if store_model else None,
        portable=None if model_source is None else portable_model(model_source, model=model),
    )
    url = as_url(url)
    url = str(Path(url).expanduser()) if url.startswith("~") else url
    options = {"storage_options": storage_options, "takeover": takeover}
    writer = (_resume_writer(url, spec, trajs, options) if resume
              else _create_writer(url, spec, mode, options))
    if writer is not None:
        _write_frames(writer, trajs, progress)
        _mark_complete(url, storage_options, marker)
    return url


def _create_writer(url: str, spec: ArchiveSpec, mode: str,
                   options: Mapping[str, Any]) -> ArchiveWriter:
    """A writer of a new archive (``options``: ``storage_options`` and ``takeover``)."""
    try:
        return ArchiveWriter.create(url, spec, mode=mode, **options)
    except ArchiveExistsError as err:
        if mode == "w":  # what flyarchive did not write: the store's own words
            raise err from None
    try:
        status = import_status(open_for_reading(url, options["storage_options"],
                                                attributes_only=True).attrs.asdict())
    except Exception:  # something that is not an archive: the plain message below
        status = None
    if status is not None and status != "complete":
        raise ArchiveExistsError(
            f"{url!r} holds an import that did not finish. Pass resume=True (--resume) with the "
            "same files and model to finish it, or mode='w' (--overwrite) to start over."
        )
    raise ArchiveExistsError(
        f"Something is already at {url!r}; flyarchive never overwrites without being asked. "
        "Pass mode='w' (--overwrite) to replace it, or choose another URL."
    )


def _resume_writer(url: str, spec: ArchiveSpec, trajs: list[NpzTrajectory],
                   options: Mapping[str, Any]) -> ArchiveWriter | None:
    """A writer positioned after the frames every unfinished world committed, or None when
    the import is already complete (``options``: ``storage_options`` and ``takeover``)."""
    try:
        group = open_for_reading(url, options["storage_options"], attributes_only=True)
    except ArchiveNotFoundError:
        return ArchiveWriter.create(url, spec, mode="w-", **options)
    stored = group.attrs.get(IMPORT_ATTR)
    ours = spec.attrs[IMPORT_ATTR]
    if not isinstance(stored, Mapping):
        raise ImportMismatchError(
            f"The archive at {url!r} was not made by import_npz (it has no {IMPORT_ATTR!r} "
            "attribute), so there is no import to resume. Pass mode='w' (--overwrite) to "
            "replace it, or choose another URL."
        )
    keys = ("files", "frames", "renumber", "sha256")
    if any(stored.get(k) != ours[k] for k in keys):
        raise ImportMismatchError(
            f"The import into {url!r} was started with other files or options: it had "
            f"{stored.get('files')!s} file(s) of {stored.get('frames')!s} frames "
            f"(renumber={stored.get('renumber')!s}); now {ours['files']} file(s) of "
            f"{ours['frames']} frames (renumber={ours['renumber']}), and their contents differ. "
            "Pass the same files (same order with renumber) to resume, or --overwrite."
        )
    if stored.get("state") == "complete":
        return None
    if "n_frames" not in group:  # killed while creating the arrays: nothing was committed
        return ArchiveWriter.create(url, spec, mode="w", **options)
    writer = ArchiveWriter.append(url, spec.layout, timing=spec.timing, codec=spec.codec,
                                  dtype=spec.dtype, **options)
    if writer.world_ids != spec.world_ids:
        raise ImportMismatchError(
            f"The archive at {url!r} has worlds {list(writer.world_ids)[:10]}; these files give "
            f"{list(spec.world_ids)[:10]}. Pass the same files to resume, or --overwrite."
        )
    committed = np.asarray(group["n_frames"][:], dtype=np.int64)
    lengths = np.array([len(t.time) for t in trajs])
    unfinished = committed < lengths
    start = int(committed[unfinished].min()) if unfinished.any() else int(lengths.max())
    writer.n_frames = max(0, start - start % writer.chunk_frames)  # redo a partial block
    return writer


def _write_frames(writer: ArchiveWriter, trajs: list[NpzTrajectory],
                  progress: Callable[[int, int], object] | None) -> None:
    """Write frames ``writer.n_frames`` onwards, one commit per ``writer.chunk_frames``."""
    longest = max(trajs, key=lambda t: len(t.time))
    n, step, dtype = len(longest.time), writer.chunk_frames, longest.qpos.dtype

    def block(key: str, t0: int, t1: int) -> np.ndarray | None:
        if getattr(longest, key) is None:
            return None
        out = np.full((len(trajs), t1 - t0, *getattr(longest, key).shape[1:]), np.nan, dtype)
        for w, t in enumerate(trajs):
            part = getattr(t, key)[t0:t1]
            out[w, : len(part)] = part
        return out

    for t0 in range(writer.n_frames, n, step):
        t1 = min(t0 + step, n)
        scheduled = longest.scheduled_time  # None: the file's time is the only time
        writer.write(
            FrameBlock(longest.time[t0:t1] if scheduled is None else scheduled[t0:t1],
                       block("qpos", t0, t1), block("mocap_pos", t0, t1),
                       block("mocap_quat", t0, t1), sim_time=longest.time[t0:t1],
                       frame=None if longest.frame is None else longest.frame[t0:t1]),
            n_frames=np.array([min(len(t.time), t1) for t in trajs]),
        )
        if progress is not None:
            progress(t1, n)

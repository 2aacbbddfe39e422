"""flygym ``RecordedTrajectory`` ``.npz`` files in and out of archives.

A flygym 2.1 ``.npz`` holds one world: ``time`` (n,), ``qpos`` (n, nq),
``output_fps``, ``playback_speed``, ``world_id`` and, for models with mocap
bodies, ``mocap_pos`` (n, nmocap, 3) and ``mocap_quat`` (n, nmocap, 4). Files are
read with ``allow_pickle=False``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mujoco
import numpy as np

from flyarchive.clock import Timing
from flyarchive.errors import LayoutMismatchError, NpzFormatError, OutputExistsError, SelectionError
from flyarchive.layout import ModelLayout
from flyarchive.query import open_archive
from flyarchive.store import ArchiveSpec, ArchiveWriter, FrameBlock

__all__ = ["import_npz", "export_npz", "read_npz", "NpzTrajectory"]

_REQUIRED = ("time", "qpos", "output_fps", "playback_speed", "world_id")


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


def read_npz(path: str | Path) -> NpzTrajectory:
    """Read and check one flygym ``RecordedTrajectory`` file, without pickle.

    Raises:
        NpzFormatError: missing fields, object arrays (pickle), or inconsistent shapes.
    """
    path = str(path)
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
    except (OSError, EOFError) as err:
        raise NpzFormatError(f"{path!r} is not a readable .npz file ({err}).") from None
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
        raise NpzFormatError(f"{path!r}: qpos must be float32 or float64, got {qpos.dtype}.")
    has_pos, has_quat = "mocap_pos" in a, "mocap_quat" in a
    if has_pos != has_quat:
        raise NpzFormatError(f"{path!r}: mocap_pos and mocap_quat must come together.")
    if has_pos:
        pos, quat = a["mocap_pos"], a["mocap_quat"]
        if pos.shape[:1] != (n,) or pos.shape[2:] != (3,) or quat.shape != (*pos.shape[:2], 4):
            raise NpzFormatError(
                f"{path!r}: mocap_pos must be (n, nmocap, 3) and mocap_quat (n, nmocap, 4) with "
                f"n={n}; got {pos.shape} and {quat.shape}."
            )
    for key in ("output_fps", "playback_speed", "world_id"):
        if np.shape(a[key]) != () or a[key].dtype.kind not in "iuf":
            raise NpzFormatError(f"{path!r}: {key} must be a number, got {a[key]!r}.")
    return NpzTrajectory(
        path, time.astype(np.float64), qpos, float(a["output_fps"]), float(a["playback_speed"]),
        int(a["world_id"]), a.get("mocap_pos"), a.get("mocap_quat"),
    )


def _npz_files(paths: str | Path | Sequence[str | Path]) -> list[Path]:
    items = [paths] if isinstance(paths, (str, Path)) else list(paths)
    files: list[Path] = []
    for item in map(Path, items):
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
    return files


def _check_same_run(trajs: list[NpzTrajectory], model: mujoco.MjModel) -> None:
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
        if not np.array_equal(t.time[:n], first.time[:n]):
            raise NpzFormatError(
                f"{t.path!r} and {first.path!r} sample different times; one archive shares one "
                "time axis. Import them into separate archives."
            )
    ids = [t.world_id for t in trajs]
    if len(set(ids)) != len(ids):
        raise NpzFormatError(f"Several files have the same world_id ({ids}); world ids must be unique.")


def import_npz(
    paths: str | Path | Sequence[str | Path],
    url: str,
    model: mujoco.MjModel,
    *,
    mode: str = "w-",
    storage_options: Mapping[str, Any] | None = None,
    codec: str = "lossless",
    chunk_frames: int = 100,
) -> str:
    """Import flygym ``.npz`` trajectories (files or folders of them) into one archive.

    Each file is one world; files may have different lengths but must sample the same
    times. The timestep comes from ``model``; values keep their dtype bit for bit.

    Returns:
        The archive URL.

    Raises:
        NpzFormatError, LayoutMismatchError, SelectionError, ArchiveExistsError.
    """
    trajs = sorted((read_npz(p) for p in _npz_files(paths)), key=lambda t: t.world_id)
    _check_same_run(trajs, model)
    longest = max(trajs, key=lambda t: len(t.time))
    n = len(longest.time)
    spec = ArchiveSpec(
        ModelLayout.from_model(model),
        Timing(float(model.opt.timestep), longest.output_fps, longest.playback_speed),
        tuple(t.world_id for t in trajs), dtype=str(longest.qpos.dtype), source="flygym-npz",
        chunk_frames=chunk_frames,
    )
    writer = ArchiveWriter.create(url, spec, mode=mode, storage_options=storage_options)

    def stacked(key: str) -> np.ndarray | None:
        if getattr(longest, key) is None:
            return None
        out = np.full((len(trajs), n, *getattr(longest, key).shape[1:]), np.nan, longest.qpos.dtype)
        for w, t in enumerate(trajs):
            out[w, : len(t.time)] = getattr(t, key)
        return out

    qpos, pos, quat = stacked("qpos"), stacked("mocap_pos"), stacked("mocap_quat")
    for t0 in range(0, n, chunk_frames):
        t1 = min(t0 + chunk_frames, n)
        cut = (slice(None), slice(t0, t1))
        writer.write(
            FrameBlock(longest.time[t0:t1], qpos[cut], None if pos is None else pos[cut],
                       None if quat is None else quat[cut]),
            n_frames=np.array([min(len(t.time), t1) for t in trajs]),
        )
    return url


def export_npz(
    url: str,
    out_dir: str | Path,
    *,
    worlds: Sequence[int] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    overwrite: bool = False,
) -> list[Path]:
    """Write worlds of an archive as flygym ``.npz`` files (``{out_dir}/world{id:05d}.npz``).

    flygym's ``RecordedTrajectory.from_file`` loads them unchanged; only committed
    frames are exported.

    Args:
        worlds: World ids to export (default all).

    Raises:
        SelectionError: a world id not in the archive.
        OutputExistsError: a file exists and ``overwrite`` is False (nothing is written).
    """
    ds = open_archive(url, storage_options)
    ids = [int(w) for w in ds.world.values]
    chosen = ids if worlds is None else [int(w) for w in worlds]
    unknown = [w for w in chosen if w not in ids]
    if unknown or not chosen:
        raise SelectionError(
            f"World(s) {unknown or chosen} are not in the archive {url!r}; it has worlds "
            f"{ids[:20]}{'...' if len(ids) > 20 else ''}."
        )
    out = Path(out_dir)
    paths = [out / f"world{w:05d}.npz" for w in chosen]
    existing = [str(p) for p in paths if p.exists()]
    if existing and not overwrite:
        raise OutputExistsError(
            f"{existing[:3]} already exist; pass overwrite=True (--overwrite) to replace them."
        )
    out.mkdir(parents=True, exist_ok=True)
    for w, path in zip(chosen, paths):
        one = ds.sel(world=w)
        n = int(one.n_frames)
        arrays = {
            "time": one.time.values[:n],
            "qpos": one.qpos.values[:n],
            "output_fps": np.asarray(ds.attrs["output_fps"]),
            "playback_speed": np.asarray(ds.attrs["playback_speed"]),
            "world_id": np.asarray(w),
        }
        if "mocap_pos" in ds:
            arrays["mocap_pos"] = one.mocap_pos.values[:n]
            arrays["mocap_quat"] = one.mocap_quat.values[:n]
        np.savez_compressed(path, **arrays)
    return paths

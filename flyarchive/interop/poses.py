"""Positions out in the formats neuroscience tools read: ``movement`` poses datasets and NWB
files with ``ndx-pose``.

- :func:`to_movement`: a ``movement`` poses dataset (movement >= 0.17 conventions, built by
  ``movement.io.load_poses.from_numpy``): ``position`` ``(time, space, keypoint,
  individual)``, ``confidence`` ``(time, keypoint, individual)`` all ones, one
  *individual* per world (named ``world<id>``, with the ids as the ``world`` coordinate
  along ``individual``), ``time`` in simulated seconds (``time_unit="seconds"``,
  ``fps`` frames per simulated second), ``source_software="flyarchive"``. NaN positions
  are frames that do not exist (past a world's ``n_frames``), as movement reads NaN.
- :func:`export_poses`: that dataset as a netCDF file (``format="movement"``: movement and
  ``xarray.open_dataset`` read it; the archive's world variables ride along as
  coordinates over ``individual``), or NWB (``format="nwb"``): **one file per world**
  (``world00003.nwb``; NWB holds one subject per file, as movement's own NWB export
  does), written by :mod:`~flyarchive.interop.nwb` (poses, joint angles, leg phases,
  world variables, the lab's metadata). With no keypoints asked, an archive with
  positions kept beside it exports every kept keypoint (tarsus tips included); else every
  body.

Files are written to a temporary name beside the target and renamed (a killed export
leaves no file under a final name), with the permissions the user's umask gives new
files; an existing target is refused unless ``overwrite``. Local paths only. Needs the
extras ``movement`` (movement) or ``nwb`` (pynwb, ndx-pose, PyYAML).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from flyarchive.clock import frame_rate
from flyarchive.errors import (
    OptionsError,
    OutputExistsError,
    OutputLocationError,
    SelectionError,
    missing_dependency,
)
from flyarchive.store.local_files import refuse_inside_archive, write_whole

if TYPE_CHECKING:
    import mujoco
    import xarray as xr

#: What :func:`export_poses` writes.
FORMATS = ("movement", "nwb")
#: Length units of a model, and their size in metres (NWB stores metres by ``conversion``).
LENGTH_UNITS = {"mm": 1e-3, "cm": 1e-2, "m": 1.0}


def nwb_name(world: int) -> str:
    """The NWB file of a world: ``world00003.nwb``."""
    return f"world{world:05d}.nwb"


def _positions_of(data: xr.DataArray | xr.Dataset) -> xr.DataArray:
    import xarray as xr

    position = data["position"] if isinstance(data, xr.Dataset) else data
    if not isinstance(position, xr.DataArray) or set(position.dims) != {"world", "time",
                                                                         "keypoint", "xyz"}:
        raise OptionsError(
            "Expected positions from flyarchive.positions (dims world, time, keypoint, xyz), "
            f"got {type(data).__name__} with dims {getattr(data, 'dims', None)}.")
    return position


def to_movement(data: xr.DataArray | xr.Dataset,
                world_vars: Mapping[str, Any] | None = None, *,
                length_unit: str | None = None) -> xr.Dataset:
    """A ``movement`` poses dataset of positions (computed now; see the module's docstring).

    Args:
        data: From :func:`flyarchive.positions` (a DataArray, or a Dataset with
            ``position``), any selection of it.
        world_vars: ``{name: (world,) DataArray}`` added as coordinates along
            ``individual`` (an archive's world variables: ``ds.success``...).
        length_unit: The positions' unit, for ``position.attrs["units"]`` (``"mm"`` for
            NeuroMechFly: the gait functions then read the file in mm); None: the units
            attribute of ``data``.

    Returns:
        The dataset, which movement's functions take as they are (e.g.
        ``movement.kinematics.compute_velocity(ds.position)``).

    Raises:
        MissingDependencyError: movement is not installed (extra ``movement``).
        OptionsError: ``data`` is not positions.
    """
    try:
        from movement.io import load_poses
    except ImportError as err:
        raise missing_dependency("movement", "movement", "Exporting positions as a movement "
                                 "poses dataset", cause=err) from None
    position = _positions_of(data).transpose("time", "xyz", "keypoint", "world")
    values = np.asarray(position.values, dtype=np.float64)
    times = np.asarray(position.time.values, dtype=np.float64)
    fps = frame_rate(float(np.median(np.diff(times)))) if len(times) > 1 else None
    worlds = [int(w) for w in position.world.values]
    ds = load_poses.from_numpy(values, np.ones((values.shape[0], *values.shape[2:])),
                               individual_names=[f"world{w}" for w in worlds],
                               keypoint_names=[str(k) for k in position.keypoint.values],
                               fps=fps, source_software="flyarchive")
    if fps is not None:
        ds = ds.assign_coords(time=times)
    ds = ds.assign_coords(world=("individual", np.asarray(worlds, dtype=np.int64)))
    for name, values in (world_vars or {}).items():
        ds = ds.assign_coords({name: ("individual", np.asarray(values.sel(world=worlds).values),
                                      dict(values.attrs))})
    units = length_unit or position.attrs.get("units")
    ds.position.attrs.update({"units": units} if units else {})
    source = position.attrs.get("source") or position.attrs.get("stored")
    if source:
        ds.attrs["source_file"] = str(source)
    return ds


def export_poses(
    url: str,
    to: str | os.PathLike[str],
    *,
    format: str = "movement",
    bodies: str | Iterable[str] | None = None,
    sites: str | Iterable[str] | None = None,
    points: Mapping[str, Any] | None = None,
    leg: Any = None,
    segment: Any = None,
    worlds: Sequence[int] | None = None,
    time: tuple[float | None, float | None] | None = None,
    model: mujoco.MjModel | None = None,
    storage_options: Mapping[str, Any] | None = None,
    length_unit: str = "mm",
    overwrite: bool = False,
    progress: Callable[[int, int], object] | None = None,
    metadata: str | os.PathLike[str] | Mapping[str, Any] | None = None,
) -> list[str]:
    """Positions of an archive (or kept positions) written as ``movement`` netCDF or NWB.

    Args:
        url: An archive (positions are computed, or read when kept beside it), or
            positions kept as an archive of their own (``flyarchive positions --to``).
        to: ``format="movement"``: the netCDF file to write (``.nc``); ``"nwb"``: a folder
            (created) for one ``world<id>.nwb`` per world.
        format: ``"movement"`` or ``"nwb"``.
        bodies, sites, points, leg, segment, worlds, time, model, storage_options: As
            :func:`flyarchive.positions` (an archive of positions takes only ``worlds``,
            ``time`` and ``storage_options``).
        length_unit: The model's length unit (``"mm"`` for NeuroMechFly; ``"cm"``, ``"m"``):
            NWB's ``conversion`` to metres; the movement file's ``position`` units.
        overwrite: Replace existing files.
        progress: Called ``(files written, files in all)`` after each file.
        metadata: NWB only: NWBFile and Subject fields in pynwb's names, as a YAML file or
            a mapping (:class:`~flyarchive.interop.nwb.NwbMetadata`).

    Returns:
        The paths written.

    Raises:
        OutputExistsError: a file to write exists and ``overwrite`` is False (nothing is
            written).
        OutputLocationError: ``to`` is not a local path, a symbolic link to nothing, (NWB)
            a file or (movement) a folder; nothing is computed.
        StorageError: the folder or a file cannot be written (permissions, a part of the
            path that is a file...).
        OptionsError: an unknown format or length unit; metadata with unknown fields or
            values of the wrong type, or given for a movement file.
        MissingDependencyError: the format's packages are missing (names the extra).
        And as :func:`flyarchive.positions`.
    """
    if format not in FORMATS:
        raise OptionsError(f"format must be one of {', '.join(FORMATS)}, got {format!r}.")
    if length_unit not in LENGTH_UNITS:
        raise OptionsError(
            f"length_unit must be one of {', '.join(LENGTH_UNITS)}, got {length_unit!r}.")
    target = _local(to)
    if format == "movement" and os.fspath(to).endswith(("/", os.sep)):
        raise OutputLocationError(
            f"{os.fspath(to)!r} names a folder (it ends in '/'); a movement export writes one "
            f"netCDF file. Name the file, e.g. '{target / 'poses.nc'}'.")
    refuse_inside_archive(target, "--to (to=...)")
    _check_target(target, format)
    _check_packages(format)
    if metadata is not None and format != "nwb":
        raise OptionsError("metadata (--metadata) describes NWB files; the movement format "
                           "has no place for it. Drop it, or pass format='nwb'.")
    from flyarchive.interop.nwb import NwbMetadata

    checked = NwbMetadata.load(metadata) if format == "nwb" else NwbMetadata()
    data, ds = _source_positions(url, bodies, sites, points, leg, segment, worlds, time, model,
                                 storage_options)
    if format == "movement":
        _refuse_existing([target], overwrite)
        world_vars = {} if ds is None else {
            str(n): v for n, v in ds.data_vars.items() if v.dims == ("world",) and n != "n_frames"}
        write_whole(target, lambda path: to_movement(
            data, world_vars, length_unit=length_unit).to_netcdf(path, engine="h5netcdf"))
        written = [str(target)]
    else:
        written = _write_nwb(_positions_of(data), target, length_unit, overwrite, checked,
                             _facts(url, ds, data, worlds, time, model, storage_options))
    if progress is not None:
        progress(len(written), len(written))
    return written


def _local(to: str | os.PathLike[str]) -> Path:
    text = str(to)
    if "://" in text and not text.startswith("file://"):
        raise OutputLocationError(
            f"export-poses writes local files; {text!r} is a URL. Write to a local path, then "
            "copy the files where they belong.")
    return Path(text.removeprefix("file://")).expanduser()


def _check_target(target: Path, format: str) -> None:
    """Refuse, before any work, a target that cannot be written as asked: for NWB a folder
    (a symbolic link to one is followed), for movement a file.

    Raises:
        OutputLocationError: a link whose target does not exist, a file where the NWB folder
            should be, or a folder where the movement file should be.
    """
    what = "NWB export writes one world<id>.nwb per world into a folder" if format == "nwb" \
        else "a movement export writes one netCDF file"
    folders = (target, *target.parents) if format == "nwb" else target.parents
    for path in folders:
        if path.is_symlink() and not path.exists():
            raise OutputLocationError(
                f"{str(path)!r} is a symbolic link to {os.readlink(path)!r}, which does not "
                f"exist; {what}. Create what the link points to, or choose another path.")
        if path != target and path.exists():  # the nearest folder that exists
            if not path.is_dir():
                raise OutputLocationError(
                    f"{str(path)!r} is a file, so {str(target)!r} cannot be written below it; "
                    f"{what}. Choose another path.")
            break
    if format == "nwb" and target.exists() and not target.is_dir():
        link = " a symbolic link to" if target.is_symlink() else ""
        raise OutputLocationError(
            f"{str(target)!r} is{link} a file; {what}. Choose a folder path (it is created "
            "if missing).")
    if format == "movement" and target.is_dir():
        raise OutputLocationError(
            f"{str(target)!r} is a folder; {what}. Give the file's path, e.g. "
            f"{str(target / 'poses.nc')!r}.")


def _check_packages(format: str) -> None:
    packages = {"movement": [("movement", "movement"), ("h5netcdf", "movement")],
                "nwb": [("pynwb", "nwb"), ("ndx_pose", "nwb")]}[format]
    import importlib.util

    for module, extra in packages:
        if importlib.util.find_spec(module) is None:
            raise missing_dependency(module.replace("_", "-"), extra,
                                     f"Exporting positions as {format}")


def _source_positions(url: str, bodies: Any, sites: Any, points: Any, leg: Any, segment: Any,
                      worlds: Any, time: Any, model: Any, storage_options: Any) -> tuple[Any, Any]:
    """Positions kept as an archive of their own (and None), or of an archive (computed
    or kept; every kept keypoint when none is asked) and the archive opened."""
    from flyarchive.analyze import open_positions, positions
    from flyarchive.query import open_archive
    from flyarchive.store.derived import holds_derived

    kept = open_positions(url, storage_options) if holds_derived(url, storage_options) else None
    if kept is None:
        ds = open_archive(url, storage_options=storage_options)
        if all(v is None for v in (bodies, sites, points, leg, segment)):
            bodies, sites, points = _kept_request(url, ds, storage_options)
        return positions(url, bodies, sites, points, leg=leg, segment=segment, worlds=worlds,
                         time=time, model=model, storage_options=storage_options), ds
    return _select_kept(kept, url, bodies, sites, points, leg, segment, worlds, time), None


def _select_kept(kept: Any, url: str, bodies: Any, sites: Any, points: Any, leg: Any,
                 segment: Any, worlds: Any, time: Any) -> Any:
    """Positions kept as an archive of their own, cut to the keypoints (by label), worlds and
    time window asked, as an archive's are.

    Raises:
        SelectionError: a keypoint, world or window the kept positions do not hold, or a
            leg or segment (they need the model: ask the archive the positions came from).
    """
    from flyarchive.query.selection import parse_time_window, parse_world_ids

    if leg is not None or segment is not None:
        raise SelectionError(
            f"{url!r} holds positions kept on their own: choose its keypoints by label "
            f"({list(map(str, kept.keypoint.values))}); leg= and segment= need the archive "
            "they were computed from.")
    labels = [str(k) for k in kept.keypoint.values]
    wanted = [b for b in (bodies or []) if b != "*"] + list(sites or []) + list(points or {})
    if wanted and not (bodies and "*" in bodies):
        unknown = [k for k in wanted if k not in labels]
        if unknown:
            raise SelectionError(
                f"Keypoint(s) {unknown} are not among the positions kept at {url!r}: "
                f"{labels}.")
        kept = kept.sel(keypoint=list(dict.fromkeys(wanted)))
    worlds, time = parse_world_ids(worlds), parse_time_window(time)
    if worlds is not None:
        ids = [int(w) for w in kept.world.values]
        unknown = sorted(set(worlds) - set(ids))
        if unknown:
            raise SelectionError(f"World(s) {unknown[:10]} are not in {url!r}. It has "
                                 f"{ids[:10]}{'...' if len(ids) > 10 else ''}.")
        kept = kept.sel(world=worlds)
    if time is not None:
        kept = kept.sel(time=slice(*time))
        if kept.sizes["time"] == 0:
            raise SelectionError(
                f"The time window {time} holds no frame of {url!r}; choose a window within "
                "its recording.")
    return kept


def _kept_request(url: str, ds: Any, storage_options: Any) -> tuple[Any, Any, Any]:
    """The keypoints of the positions kept beside ``url`` for this archive (the group
    with the most of them), as ``bodies, sites, points``; ``(None, None, None)`` (every
    body) when none is kept."""
    from flyarchive.analyze.keep import KIND
    from flyarchive.store.derived import find_derived

    best: list[dict[str, Any]] = []
    for _, derived, _ in find_derived(url, storage_options):
        keypoints = derived.get("keypoints")
        if derived.get("kind") != KIND or derived.get("source_archive_id") != \
                ds.attrs.get("archive_id") or not isinstance(keypoints, list):
            continue
        if len(keypoints) > len(best) and all(isinstance(k, dict) for k in keypoints):
            best = keypoints
    if not best:
        return None, None, None
    bodies = [k["body"] for k in best if k.get("kind") == "body"]
    sites = [k["label"] for k in best if k.get("kind") == "site"]
    points = {k["label"]: (k["body"], tuple(k["offset"])) for k in best if k.get("kind") == "point"}
    return bodies, sites, points


def _facts(url: str, ds: Any, data: Any, worlds: Any, time: Any, model: Any,
           storage_options: Any) -> Any:
    """What the NWB files say about their archive; its legs' phases for NeuroMechFly."""
    from flyarchive.interop.nwb import archive_facts

    epochs = None
    if ds is None:  # positions kept as an archive of their own: no states, no recording time
        from flyarchive.store.derived import open_derived

        return archive_facts(url, open_derived(url, storage_options), None, recorded=False)
    facts = archive_facts(url, ds, None)
    if facts.neuromechfly:
        from flyarchive.analyze import gait_epochs
        from flyarchive.errors import SelectionError

        try:
            epochs = gait_epochs(url, worlds=worlds, time=time, model=model,
                                 storage_options=storage_options)
        except SelectionError:  # not a fly with six tarsi, or too few frames
            epochs = None
    return archive_facts(url, ds, epochs)


def _refuse_existing(paths: Sequence[Path], overwrite: bool) -> None:
    existing = [str(p) for p in paths if p.exists() or p.is_symlink()]
    if existing and not overwrite:
        raise OutputExistsError(
            f"{existing[:3]} already exist{'s' if len(existing) == 1 else ''}"
            f"{f' (and {len(existing) - 3} more)' if len(existing) > 3 else ''}; pass "
            "overwrite=True (--overwrite) to replace them. Nothing was written.")


def _write_nwb(position: xr.DataArray, folder: Path, length_unit: str, overwrite: bool,
               metadata: Any, facts: Any) -> list[str]:
    worlds = [int(w) for w in position.world.values]
    paths = [folder / nwb_name(w) for w in worlds]
    _refuse_existing(paths, overwrite)
    values = np.asarray(position.transpose("world", "time", "keypoint", "xyz").values)
    labels = [str(k) for k in position.keypoint.values]
    names = [label.replace("/", ".") for label in labels]
    if len(set(names)) != len(names):
        raise OptionsError(f"Keypoint labels {labels} collide once '/' becomes '.' for NWB.")
    from flyarchive.interop.nwb import nwb_file

    for world, path, world_values in zip(worlds, paths, values):
        committed = np.flatnonzero(np.isfinite(world_values).any(axis=(1, 2)))
        last = int(committed.max()) + 1 if committed.size else 0
        write_whole(path, lambda tmp, w=world, v=world_values[:last]: nwb_file(
            tmp, w, v, position.time.values[:last], labels, LENGTH_UNITS[length_unit], facts,
            metadata))
    return [str(p) for p in paths]

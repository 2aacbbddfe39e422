"""What positions are computed from, and the lazy array they are: the archive's window,
its model and the keypoints (:func:`prepare`), the dask array of kinematics blocks
(:func:`lazy_positions`) and its labels (:func:`as_positions`).

Each dask task reads one block of the archive's state (a shard of worlds by several
chunks of frames) where it runs and computes its keypoints there
(:func:`~flyarchive.analyze.blocks.kinematics_block`); the graph holds the model's MJB
bytes once (:func:`~flyarchive.models.shipping.graph_model`: under a default Dask
client, only the key they were sent to its workers under, once per client and model),
the keypoint definitions and the function: no state travels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from flyarchive.analyze import BACKENDS
from flyarchive.analyze.blocks import kinematics_block
from flyarchive.analyze.keypoints import KeypointRequest, KeypointSet, resolve
from flyarchive.analyze.model import AnalysisModel, analysis_model
from flyarchive.models.shipping import graph_model
from flyarchive.errors import OptionsError
from flyarchive.store.dataset import committed_getter

if TYPE_CHECKING:
    import mujoco
    import xarray as xr

#: The unit of positions: the model's own (MuJoCo has none).
UNITS = "model length unit (mm for NeuroMechFly)"


class Prepared:
    """An archive's window, the model and the keypoints: what positions are computed from.

    Attributes:
        ds: The archive's dataset, cut to the window asked for.
        url: Its URL; None when only a dataset was given and its URL is unknown.
        model: The checked model (:class:`~flyarchive.analyze.model.AnalysisModel`).
        keypoints: Resolved in the model.
        storage_options: Of the archive's URL.
        whole: The dataset ``ds`` was cut from (as opened or given), where streamed
            reads find the window (:mod:`~flyarchive.store.window_reader`); None: unknown.
    """

    def __init__(self, ds: xr.Dataset, url: str | None, model: AnalysisModel,
                 keypoints: KeypointSet, storage_options: Mapping[str, Any] | None,
                 whole: xr.Dataset | None = None) -> None:
        self.ds, self.url, self.model, self.keypoints = ds, url, model, keypoints
        self.storage_options, self.whole = storage_options, whole


def prepare(source: str | xr.Dataset, request: KeypointRequest, *,
            worlds: Sequence[int] | None = None,
            time: tuple[float | None, float | None] | None = None,
            model: mujoco.MjModel | None = None,
            storage_options: Mapping[str, Any] | None = None) -> Prepared:
    """Open (or take) the archive, cut it to the window, find the model, resolve the
    keypoints. Raises as :func:`positions` does."""
    whole, url = _archive(source, storage_options)
    ds = window(whole, worlds, time)
    checked = analysis_model(ds.attrs["layout"], url=url, model=model,
                             storage_options=storage_options, archive_attrs=ds.attrs)
    return Prepared(ds, url, checked, resolve(checked.model, request), storage_options, whole)


def _archive(source: str | xr.Dataset, storage_options: Mapping[str, Any] | None
             ) -> tuple[xr.Dataset, str | None]:
    import xarray as xr

    from flyarchive.query import open_archive

    if isinstance(source, xr.Dataset):
        return source, source_url(source)
    if not isinstance(source, str):
        source = str(source)  # a pathlib.Path, say
    return open_archive(source, storage_options), source


def source_url(ds: xr.Dataset) -> str | None:
    """The URL the archive's dataset was opened from (its readers know it); None if its
    state is not read from an archive (e.g. loaded in memory)."""
    getter = committed_getter(ds.get("qpos"))
    return None if getter is None else str(getter.url)


def window(ds: xr.Dataset, worlds: Sequence[int] | None,
           time: tuple[float | None, float | None] | None) -> xr.Dataset:
    """``ds`` cut to the worlds and the frames of a time window, checked
    (:func:`flyarchive.query.selection.select_frames`). Worlds without frames are kept only
    when no selection is made."""
    if worlds is None and time is None:
        return ds
    from flyarchive.query.selection import select_frames

    jobs = select_frames(ds, worlds, time)
    start, stop = min(j.start for j in jobs), max(j.stop for j in jobs)
    return ds.isel(world=[j.world_index for j in jobs], time=slice(start, stop))


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise OptionsError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}.")
    return backend


def lazy_positions(prepared: Prepared, orientations: bool, backend: str) -> Any:
    """``(world, time, K, 3 or 7)`` dask array of the prepared window: one task per
    block of the archive's state.

    With a default ``distributed.Client`` in this process, the model is sent to its
    workers now (once per client and model) and each compute sends only its key; the
    array computes on that client, or in this process (any local scheduler), not on
    another cluster (a clear :class:`~flyarchive.errors.ModelLoadError` there)."""
    import dask.array as da
    from dask.base import tokenize

    ds, kp = prepared.ds, prepared.keypoints
    qpos = ds.qpos.data
    if not isinstance(qpos, da.Array):
        qpos = da.from_array(np.asarray(qpos), chunks=(1, -1, -1))
    args: list[Any] = [qpos, "wtd"]
    mocap = "mocap_pos" in ds and ds.sizes.get("mocap", 0) > 0
    if mocap:
        for name, index in (("mocap_pos", "wtmx"), ("mocap_quat", "wtmy")):
            data = ds[name].data
            data = data.rechunk(qpos.chunks[:2] + data.shape[2:]) if isinstance(data, da.Array) \
                else da.from_array(np.asarray(data), chunks=qpos.chunks[:2] + data.shape[2:])
            args += [data, index]
    sha = prepared.model.sha256
    blob = graph_model(prepared.model.blob, sha)  # once, not per task nor per compute
    channels = 7 if orientations else 3
    largest = max(qpos.chunks[0]) * max(qpos.chunks[1]) if qpos.size else None
    name = "flyarchive-positions-" + tokenize(qpos.name, sha, kp.digest, orientations, backend)
    return da.blockwise(
        kinematics_block, "wtkc", *args, blob, None, new_axes={"k": len(kp), "c": channels},
        concatenate=True, name=name, dtype=np.float64 if backend == "cpu" else np.float32,
        meta=np.empty((0, 0, 0, 0), np.float64 if backend == "cpu" else np.float32),
        sha256=sha, keypoints=kp, orientations=orientations, backend=backend, mocap=mocap,
        largest=largest)


def as_positions(prepared: Prepared, data: Any, orientations: bool, backend: str,
                 **attrs: Any) -> xr.DataArray | xr.Dataset:
    """The labelled result: ``position`` (and ``orientation``) of ``(world, time, K, 3|7)``."""
    import xarray as xr

    ds, kp = prepared.ds, prepared.keypoints
    coords: dict[str, Any] = {"world": ds.world.values, "time": ds.time.values,
                              "keypoint": list(kp.labels),
                              "keypoint_kind": ("keypoint", list(kp.kinds)),
                              "keypoint_body": ("keypoint", list(kp.bodies))}
    for name in ("sim_time", "frame"):
        if name in ds.coords:
            coords[name] = ("time", ds[name].values)
    attrs = {"units": UNITS, "model_sha256": prepared.model.sha256, "backend": backend,
             **({"source": prepared.url} if prepared.url else {}), **attrs}
    dims = ("world", "time", "keypoint", "xyz")
    position = xr.DataArray(data[..., :3], dims=dims, coords={**coords, "xyz": ["x", "y", "z"]},
                            name="position", attrs=attrs)
    if not orientations:
        return position
    orientation = xr.DataArray(data[..., 3:], dims=("world", "time", "keypoint", "wxyz"),
                               coords={**coords, "wxyz": ["w", "x", "y", "z"]},
                               name="orientation", attrs={**attrs, "units": "quaternion"})
    return xr.Dataset({"position": position, "orientation": orientation}, attrs=attrs)

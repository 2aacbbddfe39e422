"""The JSON manifest beside rendered videos: what each video shows and how it was made.

``{out}/manifest.json``::

    {
      "manifest_version": 2,
      "archive": "/data/run.zarr", "layout_hash": "30188fcf72d2369f",
      "versions": {"flyarchive": "0.1.0", "mujoco": "3.16.0", ...},
      "worlds": [0, 3], "cameras": ["front"],
      "videos": [
        {"world": 3, "camera": "front", "path": "/data/videos/world00003/front.mp4",
         "frames": 50, "first_frame": 10, "frame_range": [10, 60],
         "start_time": 0.4, "end_time": 2.36, "fps": 25.0, "size": [240, 320],
         "backend": "cpu", "video": {"crf": 18, "preset": "veryfast", ...}},
        ...
      ]
    }

The top level holds only what every entry shares (the archive, its layout hash, the
library versions) and an index of worlds and cameras; each entry carries its own frame
range (archive indices, ``[start, stop)``), simulated start and end time (seconds, of its
first and last frame), size ``(height, width)``, backend and encoder settings. A later
render into the same folder from the same archive keeps the entries it does not
rewrite, whatever their settings.

The file is replaced whole: written to a staging file, then renamed into place on local
disk, one PUT on object stores. On local disk, renders finishing into one folder at
once take turns (a lock on the folder), so neither loses the other's entries.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flyarchive.store.header import Archive

__all__ = ["write_manifest", "read_manifest", "video_entry", "describe", "MANIFEST_VERSION"]

MANIFEST_VERSION = 2
#: Settings that version 1 manifests kept at the top level only.
_V1_SHARED = ("fps", "size", "backend", "video")


def write_manifest(plan: Any, ds: Archive, entries: list[dict[str, Any]], *,
                   staging: Path | None = None) -> str:
    """Write (or update) ``{plan.out}/manifest.json`` with the videos of one render.

    Args:
        plan: The :class:`flyarchive.distribute.plan.RenderPlan` that was rendered.
        ds: Its archive, from :func:`flyarchive.open_archive`.
        entries: One per video, from :func:`describe`.
        staging: A local folder on the output's file system to stage the file in.

    Returns:
        The manifest's URL.

    Raises:
        StorageError: the manifest could not be written.
    """
    from flyarchive.store import package_versions
    from flyarchive.video import write_output
    from flyarchive.video.workspace import scratch_dir

    url = f"{plan.out}/manifest.json"
    with _turn(plan.out, plan.out_storage_options):
        manifest = {
            "manifest_version": MANIFEST_VERSION, "archive": plan.url,
            "layout_hash": ds.attrs["layout"]["hash"], "versions": package_versions(),
        }
        earlier = read_manifest(url, plan.out_storage_options)
        kept = []
        if (earlier.get("archive"), earlier.get("layout_hash")) == (plan.url, manifest["layout_hash"]):
            paths = {v["path"] for v in entries}
            kept = [_upgrade(v, earlier) for v in earlier.get("videos", [])
                    if isinstance(v, dict) and v.get("path") not in paths]
        manifest["worlds"] = sorted({w for v in kept + entries for w in _worlds(v)})
        manifest["cameras"] = sorted({v["camera"] for v in kept + entries})
        manifest["videos"] = kept + entries
        with tempfile.TemporaryDirectory(prefix="flyarchive-manifest-", dir=scratch_dir()) as tmp:
            local = Path(tmp) / "manifest.json"
            local.write_text(json.dumps(manifest, indent=2))
            write_output(local, url, plan.out_storage_options, overwrite=True, staging_dir=staging)
    return url


def read_manifest(url: str, storage_options: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest at ``url``, or ``{}`` when there is none or it is unreadable."""
    import fsspec

    try:
        with fsspec.open(url, "r", **dict(storage_options)) as f:
            value = json.load(f)
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def video_entry(plan: Any, job: Any, camera: str, path: str | Mapping[str, str]
                ) -> dict[str, Any]:
    """What a render task returns for one finished video (every backend alike).

    Args:
        plan: The render plan (``fps``, ``options``).
        job: The video's :class:`~flyarchive.query.frames.VideoJob`, or
            :class:`~flyarchive.video.mosaic.MosaicJob`.
        camera: Its camera name.
        path: Its final path or URL, or ``{output name: URL}`` of every output.

    Returns:
        ``{"world", "camera", "path", "frames", "first_frame", "fps", "size"}``, plus
        ``"outputs"`` (``{name: URL}``) and a ``"depth"`` / ``"segmentation"`` entry
        saying what the map's counts mean, when maps were made; plus ``"mosaic"``
        (:meth:`~flyarchive.video.mosaic.MosaicJob.describe`, ``"world"`` None, ``size``
        of a tile) for a mosaic, ``"overlays"`` (the items burnt in) with overlays.
        ``path`` is the mp4, or the first map without RGB. The
        manifest's entry adds the rest (:func:`describe`).
    """
    from flyarchive.video.mosaic import is_mosaic

    urls = {"rgb": path} if isinstance(path, str) else dict(path)
    entry = {"world": None if is_mosaic(job) else job.world_id, "camera": camera,
             "path": next(iter(urls.values())), "frames": job.n_frames,
             "first_frame": job.start, "fps": plan.fps, "size": list(plan.options.size)}
    if list(urls) != ["rgb"]:
        entry["outputs"] = urls
    options = plan.options
    if "depth" in urls:
        entry["depth"] = {"unit": "model length unit (metres for SI models; NeuroMechFly: "
                                  "millimetres)", "scale": options.depth_scale, "no_hit": 0,
                          "saturated": 65535, "meaning": "planar depth = count * scale"}
    if "segmentation" in urls:
        entry["segmentation"] = {"ids": "geom", "meaning": "count = geom id + 1",
                                 "background": 0}
    if is_mosaic(job):
        entry["mosaic"] = job.describe()
    if getattr(options, "overlays", ()):
        entry["overlays"] = list(options.overlays)
    return entry


def describe(plan: Any, ds: Archive, video: dict[str, Any]) -> dict[str, Any]:
    """A rendered video's entry, with everything that describes it alone.

    Args:
        plan: The render plan.
        ds: Its archive.
        video: What the render returned for it (world, camera, path, frames...).

    Returns:
        ``video`` plus ``frame_range`` (archive indices ``[start, stop)``),
        ``start_time`` / ``end_time`` (simulated seconds of its first and last frame),
        ``fps``, ``size`` ``[height, width]``, ``backend`` and ``video`` (encoder settings);
        for a window of a ``where`` mask also ``window``, its index among its world's
        windows (its frames and times are the entry's ``frame_range`` and times).
    """
    from flyarchive.video.mosaic import is_mosaic

    if "mosaic" in video:
        job = next(j for j in plan.jobs if is_mosaic(j) and j.index == video["mosaic"]["index"])
    else:
        job = next(j for j in plan.jobs if not is_mosaic(j) and j.world_id == video["world"]
                   and j.start == video.get("first_frame", j.start))
    times = ds.time.values
    window = {} if getattr(job, "window", None) is None else {"window": job.window}
    return {
        **video, "first_frame": job.start, "frame_range": [job.start, job.stop],
        "start_time": float(times[job.start]), "end_time": float(times[job.stop - 1]),
        **window,
        "fps": plan.fps, "size": list(plan.options.size), "backend": plan.options.backend,
        "video": asdict(plan.options.video),
    }


def _worlds(entry: dict[str, Any]) -> list[int]:
    """The worlds an entry shows: its world, or a mosaic's worlds."""
    if isinstance(entry.get("mosaic"), dict):
        return [w for w in entry["mosaic"].get("worlds", []) if w is not None]
    return [entry["world"]] if entry.get("world") is not None else []


def _upgrade(entry: dict[str, Any], earlier: dict[str, Any]) -> dict[str, Any]:
    """An earlier entry, given the settings a version 1 manifest kept at its top level."""
    shared = {k: earlier[k] for k in _V1_SHARED if k in earlier and k not in entry}
    return {**entry, **shared}


@contextmanager
def _turn(out: str, storage_options: Mapping[str, Any]) -> Iterator[None]:
    """Hold the output folder's lock on local disk (no-op elsewhere, or without flock)."""
    from flyarchive.video.workspace import filesystem, is_local_fs

    fs, path = filesystem(out, storage_options)
    if not is_local_fs(fs):
        yield
        return
    try:
        import fcntl

        fd = os.open(path, os.O_RDONLY)
    except (ImportError, OSError):
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a file system without flock: go on unlocked
            pass
        yield
    finally:
        os.close(fd)

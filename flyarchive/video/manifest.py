"""The JSON manifest beside rendered videos: what each video shows and how it was made.

``{out}/manifest.json``::

    {
      "manifest_version": 2,
      "archive": "/data/run.zarr", "archive_id": "9c1f...", "layout_hash": "30188fcf72d2369f",
      "versions": {"flyarchive": "0.1.0", "mujoco": "3.16.0", ...},
      "worlds": [0, 3], "cameras": ["front"],
      "videos": [
        {"world": 3, "camera": "front", "path": "/data/videos/world00003/front.mp4",
         "frames": 50, "first_frame": 10, "frame_range": [10, 60],
         "start_time": 0.4, "end_time": 2.36, "fps": 25.0, "size": [240, 320],
         "backend": "opengl", "video": {"crf": 18, "preset": "veryfast", ...}},
        ...
      ]
    }

The top level holds only what every entry shares (the archive, its ``archive_id`` and
layout hash, the library versions) and an index of worlds and cameras; each entry carries its own frame
range (archive indices, ``[start, stop)``), simulated start and end time (seconds, of its
first and last frame), size ``(height, width)``, backend and encoder settings. A later
render into the same folder from the same archive keeps the entries it does not
rewrite, whatever their settings.

The file is replaced whole: written to a staging file, then renamed into place on local
disk, one PUT on object stores. On local disk, renders finishing into one folder at
once take turns (a lock on the folder), so neither loses the other's entries. While a
render runs, its finished videos are added as they finish (:class:`ManifestJournal`).

A manifest is read as untrusted input (:func:`read_manifest`): only a small regular file
inside the output folder, shallow JSON, entries of the types :func:`describe` writes; a
render refuses to merge into one that is not, before rendering anything.
"""

from __future__ import annotations

import json
import posixpath
import os
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from flyarchive.errors import ManifestError
from flyarchive.schema import MAX_JSON_DEPTH, json_depth_of

if TYPE_CHECKING:
    from flyarchive.store.header import Archive
    from flyarchive.video.mosaic import Job
    from flyarchive.video.mp4 import VideoOptions


class RenderedOptions(Protocol):
    """What a manifest records of a render's options
    (:class:`flyarchive.render.options.RenderOptions`)."""

    backend: str
    size: tuple[int, int]
    video: VideoOptions
    depth_scale: float | None
    overlays: tuple[str, ...]


class RenderedPlan(Protocol):
    """What a manifest records of a render's plan (:class:`flyarchive.render.plan.RenderPlan`,
    which the render stage defines after this one)."""

    url: str
    out: str
    out_storage_options: dict[str, Any]
    fps: float
    options: RenderedOptions
    jobs: tuple[Job, ...]
    notes: tuple[str, ...]
    model_sha256: str | None


MANIFEST_VERSION = 2
#: Largest manifest read, bytes (about 400,000 videos).
MAX_MANIFEST_BYTES = 256 << 20
#: Least seconds between two writes of a render's manifest while it runs.
JOURNAL_EVERY_S = 2.0
#: Settings that version 1 manifests kept at the top level only.
_V1_SHARED = ("fps", "size", "backend", "video")


def write_manifest(plan: RenderedPlan, ds: Archive, entries: list[dict[str, Any]], *,
                   staging: Path | None = None) -> str:
    """Write (or update) ``{plan.out}/manifest.json`` with the videos of one render.

    Args:
        plan: The :class:`flyarchive.render.plan.RenderPlan` that was rendered.
        ds: Its archive, from :func:`flyarchive.open_archive`.
        entries: One per video, from :func:`describe`.
        staging: A local folder on the output's file system to stage the file in.

    Returns:
        The manifest's URL.

    Raises:
        StorageError: the manifest could not be written.
        UnsafeFileError, ManifestError: the manifest there cannot be read safely
            (:func:`read_manifest`); it is not replaced.
    """
    from flyarchive.store import package_versions
    from flyarchive.video import write_output
    from flyarchive.video.workspace import scratch_dir

    url = manifest_url(plan.out)
    with _turn(plan.out, plan.out_storage_options):
        manifest = {
            "manifest_version": MANIFEST_VERSION, "archive": plan.url,
            "archive_id": ds.attrs.get("archive_id"),
            "layout_hash": ds.attrs["layout"]["hash"], "versions": package_versions(),
        }
        earlier = read_manifest(url, plan.out_storage_options, root=output_root(plan.out))
        kept = []
        if earlier.get("layout_hash") == manifest["layout_hash"] and (
                earlier.get("archive") == plan.url
                or same_archive(earlier, plan.url, manifest["archive_id"])):
            paths = {v["path"] for v in entries}
            kept = [_upgrade(v, earlier) for v in earlier.get("videos", [])
                    if v["path"] not in paths and names_inside(v, plan.out)]
        manifest["worlds"] = sorted({w for v in kept + entries for w in _worlds(v)})
        manifest["cameras"] = sorted({v["camera"] for v in kept + entries})
        manifest["videos"] = kept + entries
        with tempfile.TemporaryDirectory(prefix="flyarchive-manifest-", dir=scratch_dir()) as tmp:
            local = Path(tmp) / "manifest.json"
            local.write_text(json.dumps(manifest, indent=2))
            write_output(local, url, plan.out_storage_options, overwrite=True, staging_dir=staging,
                         root=output_root(plan.out))
    return url


class ManifestJournal:
    """The manifest of one render, kept up to date while it runs.

    Each finished video's entry (:meth:`add`, from any thread) reaches ``manifest.json``
    within :data:`JOURNAL_EVERY_S` seconds (the first one at once; for a manifest so large
    that writing it takes longer than a tenth of that, within ten times a write), written
    by a thread of its own; :meth:`close` writes the last ones. A render stopped by Ctrl-C, SIGTERM or an
    error keeps every finished video listed; one killed (SIGKILL) keeps those listed up to
    :data:`JOURNAL_EVERY_S` seconds before. ``render --resume`` continues from the list.

    Args:
        plan: The render plan.
        ds: Its archive.
        staging: A local folder on the output's file system to stage the file in.
        every_s: Least seconds between two writes.
    """

    def __init__(self, plan: RenderedPlan, ds: Archive, staging: Path | None = None, *,
                 every_s: float = JOURNAL_EVERY_S) -> None:
        self._plan, self._ds, self._staging, self._every_s = plan, ds, staging, every_s
        self._entries: dict[str, dict[str, Any]] = {}  # path -> entry, in finishing order
        self._lock = threading.Lock()
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._written = 0  # entries in the manifest
        self._thread = threading.Thread(target=self._run, name="flyarchive-manifest", daemon=True)
        self._thread.start()

    def add(self, video: dict[str, Any]) -> None:
        """A finished video: what its task returned (:func:`video_entry`)."""
        entry = describe(self._plan, self._ds, video)
        with self._lock:
            self._entries[entry["path"]] = entry
        self._dirty.set()

    def close(self, entries: list[dict[str, Any]] | None = None, *, quiet: bool = False) -> str:
        """Stop the writer thread and write the manifest a last time.

        Args:
            entries: Every video of the render, in plan order (it finished); None: the
                videos finished so far (it stopped).
            quiet: Swallow an error of the last write (the render is failing already).

        Returns:
            The manifest's URL.
        """
        self._stop.set()
        self._dirty.set()
        self._thread.join()
        with self._lock:
            final = list(self._entries.values()) if entries is None else list(entries)
        try:
            if final or entries is not None:
                write_manifest(self._plan, self._ds, final, staging=self._staging)
        except Exception:
            if not quiet:
                raise
        return manifest_url(self._plan.out)

    def _run(self) -> None:
        while True:
            self._dirty.wait()
            if self._stop.is_set():
                return
            self._dirty.clear()
            with self._lock:
                entries = list(self._entries.values())
            start = time.monotonic()
            try:
                write_manifest(self._plan, self._ds, entries, staging=self._staging)
            except Exception:  # the last write (close) reports it
                pass
            # a large manifest (a write takes long) is written less often: at most ~10 % of
            # one core goes to it
            if self._stop.wait(max(self._every_s, 10 * (time.monotonic() - start))):
                return


def manifest_url(out: str) -> str:
    """The manifest of the output folder ``out``."""
    return f"{out.rstrip('/')}/manifest.json"


def output_root(out: str) -> str | None:
    """The local path of an output folder (what its files must stay inside); None elsewhere."""
    from flyarchive.store.location import is_local, local_path

    return str(local_path(out)) if is_local(out) else None


def read_manifest(url: str, storage_options: Mapping[str, Any] | None = None, *,
                  root: str | None = None) -> dict[str, Any]:
    """The manifest at ``url``, checked; ``{}`` when there is none.

    It is read as every file of an output folder (:mod:`flyarchive.video.guard`): a regular
    file inside the folder, of at most :data:`MAX_MANIFEST_BYTES`, nested at most
    :data:`~flyarchive.schema.MAX_JSON_DEPTH` deep, each video entry of the types
    :func:`check_manifest` names.

    Args:
        url: The manifest's path or URL (``{out}/manifest.json``).
        storage_options: fsspec options of ``url``.
        root: A local manifest's output folder (default: the folder holding it).

    Raises:
        UnsafeFileError: a link leading out of the output folder, a FIFO, a device, or a
            file larger than :data:`MAX_MANIFEST_BYTES` (not read).
        ManifestError: not JSON, nested too deep, or an entry of the wrong types.
    """
    from flyarchive.store.location import is_local, local_path
    from flyarchive.video.guard import read_bytes

    if root is None and is_local(url):
        root = str(local_path(url).parent)
    raw = read_bytes(url, storage_options, max_bytes=MAX_MANIFEST_BYTES, root=root)
    if raw is None:
        return {}
    try:
        value = json.loads(raw)
    except RecursionError:
        raise _bad(url, f"its JSON is nested more than {MAX_JSON_DEPTH} deep") from None
    except ValueError as err:
        raise _bad(url, f"it is not JSON ({err})") from None
    check_manifest(value, url)
    return value


def check_manifest(value: Any, url: str) -> None:
    """Check the types of a parsed manifest: an object with flyarchive's
    ``manifest_version`` whose ``videos`` is a list of entries,
    each with ``path`` and ``camera`` (text), ``world`` (an integer, or null for a mosaic
    entry, which holds a ``mosaic`` object), and, where present, integers, numbers, text,
    lists and objects where :func:`describe` writes them.

    Raises:
        ManifestError: naming the manifest, the entry (index and path) and the field.
    """
    if not isinstance(value, dict):
        raise _bad(url, f"it holds {type(value).__name__}, not a JSON object")
    if json_depth_of(value) > MAX_JSON_DEPTH:
        raise _bad(url, f"its JSON is nested more than {MAX_JSON_DEPTH} deep")
    videos = value.get("videos", [])
    if not isinstance(videos, list):
        raise _bad(url, f"'videos' is {_short(videos)}, not a list")
    for i, entry in enumerate(videos):
        problem = _entry_problem(entry)
        if problem is not None:
            path = entry.get("path") if isinstance(entry, dict) else None
            where = f"video entry {i}" + (f" ({path!r})" if isinstance(path, str) else "")
            raise _bad(url, f"{where} {problem}")
    version = value.get("manifest_version")
    if not isinstance(version, int) or isinstance(version, bool) \
            or not 1 <= version <= MANIFEST_VERSION:
        raise _bad(url, f"it is not a flyarchive manifest (its manifest_version is "
                        f"{_short(version)}; flyarchive writes 1 to {MANIFEST_VERSION}), and "
                        "would be replaced")


def names_inside(entry: dict[str, Any], folder: str) -> bool:
    """Whether every file a (well-typed) entry names lies inside ``folder``: entries of a
    manifest edited, or of a folder copied or moved since it was rendered, may not."""
    return all(_inside(p, folder) for p in [entry["path"], *entry.get("outputs", {}).values()])


def _inside(path: str, folder: str) -> bool:
    """Whether the file ``path`` lies inside ``folder`` (URLs or local paths, ``..`` resolved)."""
    def split(url: str) -> tuple[str, str]:
        protocol, _, rest = url.partition("://") if "://" in url else ("", "", url)
        return ("" if protocol == "file" else protocol), posixpath.normpath(rest or "/")

    (p_protocol, p), (f_protocol, f) = split(path), split(folder)
    return p_protocol == f_protocol and p.startswith(f.rstrip("/") + "/")


def _entry_problem(entry: Any) -> str | None:
    """What is wrong with one video entry, as a phrase; None if nothing is."""
    if not isinstance(entry, dict):
        return f"is {_short(entry)}, not an object"
    for key in ("path", "camera"):
        if not isinstance(entry.get(key), str):
            return f"has {key}={_short(entry.get(key))}, not text" if key in entry else \
                f"has no {key!r}"
    if "world" not in entry:
        return "has no 'world'"
    mosaic = entry.get("mosaic")
    if entry["world"] is None and not isinstance(mosaic, dict):
        return "has world=null without a 'mosaic' object"
    for key, check, what in _FIELDS:
        if key in entry and not check(entry[key]):
            return f"has {key}={_short(entry[key])}, not {what}"
    if isinstance(mosaic, dict) and not _int_list(mosaic.get("worlds", []), none=True):
        return f"has mosaic worlds={_short(mosaic.get('worlds'))}, not a list of integers or nulls"
    return None


def _is_int(v: Any) -> bool:
    return type(v) is int


def _is_number(v: Any) -> bool:
    return type(v) in (int, float)


def _int_list(v: Any, n: int | None = None, *, none: bool = False) -> bool:
    return isinstance(v, list) and (n is None or len(v) == n) and all(
        _is_int(x) or (none and x is None) for x in v)


_FIELDS: tuple[tuple[str, Any, str], ...] = (
    ("world", lambda v: v is None or _is_int(v), "an integer"),
    ("frames", lambda v: _is_int(v) and v >= 0, "a whole number >= 0"),
    ("first_frame", lambda v: _is_int(v) and v >= 0, "a whole number >= 0"),
    ("window", _is_int, "an integer"),
    ("frame_range", lambda v: _int_list(v, 2), "[start, stop], two integers"),
    ("size", lambda v: _int_list(v, 2), "[height, width], two integers"),
    ("fps", _is_number, "a number"),
    ("start_time", _is_number, "a number"),
    ("end_time", _is_number, "a number"),
    ("backend", lambda v: isinstance(v, str), "text"),
    ("video", lambda v: isinstance(v, dict), "an object"),
    ("depth", lambda v: isinstance(v, dict), "an object"),
    ("segmentation", lambda v: isinstance(v, dict), "an object"),
    ("mosaic", lambda v: isinstance(v, dict), "an object"),
    ("outputs", lambda v: isinstance(v, dict) and all(
        isinstance(k, str) and isinstance(u, str) for k, u in v.items()),
     "an object of output names and paths"),
    ("overlays", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
     "a list of texts"),
)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _bad(url: str, problem: str) -> ManifestError:
    return ManifestError(
        f"The manifest {url}: {problem}. It was damaged or edited, and flyarchive does not "
        "merge into or trust it. Move it away (the videos stay) and render again: the new "
        "manifest lists the videos that render makes.")


def video_entry(plan: RenderedPlan, job: Job, camera: str, path: str | Mapping[str, str]
                ) -> dict[str, Any]:
    """What a render task returns for one finished video (every backend alike).

    Args:
        plan: The render plan (``fps``, ``options``).
        job: The video's :class:`~flyarchive.query.selection.VideoJob`, or
            :class:`~flyarchive.video.mosaic.MosaicJob`.
        camera: Its camera name.
        path: Its final path or URL, or ``{output name: URL}`` of every output.

    Returns:
        ``{"world", "camera", "path", "frames", "first_frame", "fps", "size"}``, plus
        ``"outputs"`` (``{name: URL}``) and a ``"depth"`` / ``"segmentation"`` entry
        saying what the map's counts mean, when maps were made; plus ``"mosaic"``
        (:meth:`~flyarchive.video.mosaic.MosaicJob.describe` and ``tile_size``; ``"world"``
        None, ``size`` the mosaic frame's) for a mosaic, ``"overlays"`` (the items burnt in) with overlays.
        ``path`` is the mp4, or the first map without RGB. The
        manifest's entry adds the rest (:func:`describe`).
    """
    from flyarchive.video.mosaic import is_mosaic

    urls = {"rgb": path} if isinstance(path, str) else dict(path)
    entry = {"world": None if is_mosaic(job) else job.world_id, "camera": camera,
             "path": next(iter(urls.values())), "frames": job.n_frames,
             "first_frame": job.start, "fps": plan.fps, "size": video_size(plan, job)}
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
        entry["mosaic"] = {**job.describe(), "tile_size": list(options.size)}
    if options.overlays:
        entry["overlays"] = list(options.overlays)
    return entry


def describe(plan: RenderedPlan, ds: Archive, video: dict[str, Any]) -> dict[str, Any]:
    """A rendered video's entry, with everything that describes it alone.

    Args:
        plan: The render plan.
        ds: Its archive.
        video: What the render returned for it (world, camera, path, frames...).

    Returns:
        ``video`` plus ``frame_range`` (archive indices ``[start, stop)``),
        ``start_time`` / ``end_time`` (simulated seconds of its first and last frame),
        ``fps``, ``size`` ``[height, width]``, ``backend``, ``video`` (encoder settings)
        and ``model_sha256`` (of the compiled model rendered with, its MJB bytes);
        for a window of a ``where`` mask also ``window``, its index among its world's
        windows (its frames and times are the entry's ``frame_range`` and times); and
        ``notes`` when the render changed something asked for (a fitted mosaic, overlay
        items left out of small frames).
    """
    from flyarchive.video.mosaic import is_mosaic

    if "mosaic" in video:
        job = next(j for j in plan.jobs if is_mosaic(j) and j.index == video["mosaic"]["index"])
    else:
        job = next(j for j in plan.jobs if not is_mosaic(j) and j.world_id == video["world"]
                   and j.start == video.get("first_frame", j.start))
    times = ds.time.values
    window = {} if getattr(job, "window", None) is None else {"window": job.window}
    notes = {"notes": list(plan.notes)} if plan.notes else {}
    return {
        **video, "first_frame": job.start, "frame_range": [job.start, job.stop],
        "start_time": float(times[job.start]), "end_time": float(times[job.stop - 1]),
        **window, **notes,
        "fps": plan.fps, "size": video_size(plan, job), "backend": plan.options.backend,
        "video": asdict(plan.options.video),
        **({"model_sha256": plan.model_sha256} if plan.model_sha256 else {}),
    }


def video_size(plan: RenderedPlan, job: Job) -> list[int]:
    """``[height, width]`` of a job's video frames: the mosaic's for a mosaic."""
    from flyarchive.video.mosaic import is_mosaic, mosaic_size

    if is_mosaic(job):
        return list(mosaic_size(plan.options.size, (job.rows, job.cols)))
    return list(plan.options.size)


def _worlds(entry: dict[str, Any]) -> list[int]:
    """The worlds an entry shows: its world, or a mosaic's worlds."""
    if isinstance(entry.get("mosaic"), dict):
        return [w for w in entry["mosaic"].get("worlds", []) if w is not None]
    return [entry["world"]] if entry.get("world") is not None else []


def same_archive(manifest: Mapping[str, Any], url: str, archive_id: str | None) -> bool:
    """Whether a manifest's render is of the archive at ``url`` with ``archive_id``: the
    same ``archive_id`` (however the archive is named: a ``file://`` URL, a link); for
    archives without one, the same URL."""
    theirs = manifest.get("archive_id")
    if theirs is not None and archive_id is not None:
        return bool(theirs == archive_id)
    return bool(manifest.get("archive") == url)


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

"""Continue a render that stopped (``render_videos(..., resume=True)``, ``flyarchive render
--resume``): keep the videos that an earlier render into the same output folder finished
and listed in its manifest, when they are exactly what this render would make; render
the rest (:func:`resume_plan`).

A (world, camera) video is kept when the manifest lists it for this archive (same
``archive_id``, however the archive is named, and layout hash) with the very entry this
render would write (path, frames, window, size, fps, backend, encoder settings, outputs,
mosaic, overlays...), and each of its outputs is a regular file (a map: its
``zarr.json``) inside the output folder. A job (a world or a mosaic) with a camera not
kept is rendered (all its cameras are rendered together), and only its videos not kept
are published, replacing what is in their place (a video the stopped render finished but
did not list yet, one of other settings).
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from flyarchive.errors import UnsafeFileError
from flyarchive.render.plan import RenderPlan, another_archive

if TYPE_CHECKING:
    from collections.abc import Iterable

    from flyarchive.store.header import Archive


def resume_plan(plan: RenderPlan, ds: Archive) -> tuple[RenderPlan, list[dict[str, Any]]]:
    """The plan of what is left to render, and the manifest entries of the videos kept.

    Args:
        plan: The whole render.
        ds: Its archive (or header).

    Returns:
        The plan of the jobs left (with ``overwrite``: they replace what is there), and
        the kept videos' entries, in plan order.

    Raises:
        UnsafeFileError, ManifestError: the manifest there cannot be read safely.
        OutputExistsError: the manifest lists the videos of another archive (and
            ``overwrite`` is off): resuming would replace them.
    """
    from flyarchive.video.manifest import (
        describe,
        manifest_url,
        output_root,
        read_manifest,
        same_archive,
        video_entry,
    )

    earlier = read_manifest(manifest_url(plan.out), plan.out_storage_options,
                            root=output_root(plan.out))
    archive_id = ds.attrs.get("archive_id")
    same = archive_id is not None and same_archive(earlier, plan.url, archive_id) and \
        earlier.get("layout_hash") == ds.attrs["layout"]["hash"]
    if earlier.get("videos") and not plan.options.overwrite and earlier.get("archive") != \
            plan.url and not same_archive(earlier, plan.url, archive_id):
        # resuming would replace another archive's videos (one recorded again at the
        # same URL is this render's archive: its videos are rendered again)
        raise another_archive(plan, earlier)
    listed = {v["path"]: v for v in earlier.get("videos", [])} if same else {}
    kept: list[dict[str, Any]] = []
    todo = []
    for job in plan.jobs:
        found = 0
        for camera in plan.cameras:
            urls = plan.output_urls(job, camera)
            expected = describe(plan, ds, video_entry(plan, job, camera, urls))
            entry = _current(listed.get(expected["path"]))
            if entry == json.loads(json.dumps(expected)) and _present(plan, urls.values()):
                kept.append(entry)
                found += 1
        if found < len(plan.cameras):
            todo.append(job)
    options = dataclasses.replace(plan.options, overwrite=True)
    return dataclasses.replace(plan, jobs=tuple(todo), options=options,
                               kept=frozenset(v["path"] for v in kept)), kept


def _current(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    """A manifest entry with its backend by its current name (manifests written before
    the OpenGL backend was called ``"opengl"`` say ``"cpu"``)."""
    from flyarchive.replay import OLD_BACKENDS

    if entry is not None and entry.get("backend") in OLD_BACKENDS:
        return {**entry, "backend": OLD_BACKENDS[entry["backend"]]}
    return entry


def _present(plan: RenderPlan, urls: Iterable[str]) -> bool:
    """Whether every output is there: a regular file inside the output folder (a map: its
    ``zarr.json``, written last); a hostile one is not kept (it is rendered again)."""
    from flyarchive.store.location import is_local, local_path
    from flyarchive.video.guard import check_file
    from flyarchive.video.manifest import output_root
    from flyarchive.video.workspace import filesystem

    root = output_root(plan.out)
    for url in urls:
        target = url if url.endswith(".mp4") else f"{url}/zarr.json"
        if is_local(target):
            try:
                if check_file(local_path(target), root) is None:
                    return False
            except UnsafeFileError:
                return False
            continue
        fs, path = filesystem(target, plan.out_storage_options)
        if not fs.isfile(path):
            return False
    return True

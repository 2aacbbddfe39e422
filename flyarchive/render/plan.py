"""Render plans: what to render, as plain values sent to workers.

A plan holds the archive URL (absolute), the cameras, the output folder, the options and
the videos to make (:class:`~flyarchive.query.selection.VideoJob`, one per world or window,
or :class:`~flyarchive.video.mosaic.MosaicJob`), checked before any work
(:func:`preflight`). The OpenGL backend cuts each video into segments
(:meth:`RenderPlan.segments`); the Warp backends pack (world, frame) states into batches
(:func:`pack_batches`: :class:`Batch` es of :class:`Piece` s), and split the videos into
groups of whole videos, one per render thread or worker (:func:`split_groups`).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np

from flyarchive.errors import OutputExistsError, RenderOptionsError
from flyarchive.render.options import RenderOptions
from flyarchive.video.mosaic import Job
from flyarchive.video.workspace import filesystem, is_local_fs


#: What a run calls with each finished video's manifest entry.
OnVideo = Callable[[dict[str, Any]], None]


def job_video_path(out: str, job: Job | int, camera: str) -> str:
    """:func:`flyarchive.video.safe_video_path` of a job's world and camera, with the job's
    window, if any, before ``.mp4``: ``{out}/world00003/front.frames000120-000240.mp4``
    (archive frames ``[120, 240)``, :attr:`~flyarchive.query.selection.VideoJob.suffix`).

    Args:
        out: The output folder (path or URL).
        job: A :class:`~flyarchive.query.selection.VideoJob`, or a world id.
        camera: The camera's name.
    """
    from flyarchive.video.output_files import output_urls

    return output_urls(out, job, camera)["rgb"]


#: The shortest segment :meth:`RenderPlan.segments` makes to spread frames over workers.
MIN_SEGMENT_FRAMES = 25


@dataclass(frozen=True)
class RenderPlan:
    """What to render and where (plain values, sent to workers)."""

    url: str
    storage_options: dict[str, Any]
    cameras: tuple[str, ...]
    out: str
    out_storage_options: dict[str, Any]
    fps: float
    options: RenderOptions
    jobs: tuple[Job, ...]
    #: Videos (their manifest ``path``) that an earlier render finished and this one
    #: keeps (``resume``): their job is rendered for its other cameras, they are not
    #: published again.
    kept: frozenset[str] = frozenset()
    #: What the render changed from what was asked (a mosaic fitted to fewer worlds, overlay
    #: items left out of small frames), one sentence each; the manifest's entries give them.
    notes: tuple[str, ...] = ()
    #: The ``archive_id`` of the archive planned with: a worker that opened an archive
    #: since replaced at the same URL opens it again.
    archive_id: str | None = None
    #: SHA-256 of the compiled model rendered with (its MJB bytes): a manifest entry names
    #: it, so that ``resume`` keeps only videos of the same model.
    model_sha256: str | None = None

    def video_url(self, job: Job | int, camera: str) -> str:
        """The final URL of the video of ``job`` (a :class:`~flyarchive.query.selection.VideoJob`,
        or a world id) and ``camera`` (see :func:`job_video_path`)."""
        return job_video_path(self.out, job, camera)

    def output_urls(self, job: Job | int, camera: str) -> dict[str, str]:
        """Where each output of ``job``'s camera goes (a world's or a mosaic's video, maps
        beside it): :func:`flyarchive.video.output_files.output_urls`."""
        from flyarchive.video.output_files import output_urls

        return output_urls(self.out, job, camera, self.options.outputs)

    def is_kept(self, job: Job, camera: str) -> bool:
        """Whether the video of ``job`` and ``camera`` is kept from an earlier render."""
        return bool(self.kept) and next(iter(self.output_urls(job, camera).values())) in self.kept

    def segments(self, n_workers: int | None = 1, *, head: int = 0
                 ) -> Iterator[tuple[Job, int, int]]:
        """(job, start, stop) for every segment, in playing order per job.

        Segments are at most ``options.segment_frames`` long, shorter (down to
        :data:`MIN_SEGMENT_FRAMES`) when that gives each of ``n_workers`` workers about four tasks.
        ``n_workers=None`` (rendering in this process): one segment per video. ``head``:
        the first job's first ``head`` frames (at most all of them, at most
        ``options.segment_frames``) are a segment of their own, yielded first; the other
        frames are split as said.
        """
        head = min(head, self.jobs[0].n_frames, self.options.segment_frames) if self.jobs else 0
        total = sum(job.n_frames for job in self.jobs) - head
        if n_workers is None:
            step = max((job.n_frames for job in self.jobs), default=1)
        else:
            step = max(min(self.options.segment_frames, MIN_SEGMENT_FRAMES),
                       min(self.options.segment_frames, -(-total // (4 * max(n_workers, 1)))))
        for i, job in enumerate(self.jobs):
            first = job.start
            if i == 0 and head:
                yield job, first, first + head
                first += head
            for k0 in range(first, job.stop, step):
                yield job, k0, min(k0 + step, job.stop)


def preflight(plan: RenderPlan, model: mujoco.MjModel) -> None:
    """Fail before any work: environment variables, cameras, frame size, and outputs in the way.

    Raises:
        ConfigError: a ``FLYARCHIVE_*`` environment variable holds a value that is not
            allowed (:mod:`flyarchive.config`).
        CameraNotFoundError, StorageError (an unknown protocol).
        FrameSizeError: a size H.264 or (backend ``"opengl"``) OpenGL cannot take.
        OutputExistsError: videos exist and ``overwrite`` is off, the folder holds a
            render of another archive (its manifest) and ``overwrite`` is off, or (local
            disk) a folder is where a video goes (even with ``overwrite``).
        UnsafeFileError: a folder inside the output folder is a symbolic link leading out
            of it on the way to an output, or the manifest there is not a regular file
            inside it, or too large (:mod:`flyarchive.video.guard`).
        ManifestError: the manifest there is not JSON or has entries of the wrong types.
    """
    from flyarchive import config
    from flyarchive.models import camera_ids
    from flyarchive.replay.sizes import MAX_GL_SIDE, parse_frame_size
    from flyarchive.video.guard import check_out_folders
    from flyarchive.video.manifest import manifest_url, output_root, read_manifest, same_archive

    config.check()
    gl = plan.options.backend == "opengl"  # OpenGL's limit, found before any work
    parse_frame_size(plan.options.size, even=True, max_side=MAX_GL_SIDE if gl else None)
    camera_ids(model, plan.cameras)
    fs, _ = filesystem(plan.out, plan.out_storage_options)
    finals = [u for j in plan.jobs for c in plan.cameras if not plan.is_kept(j, c)
              for u in plan.output_urls(j, c).values()]
    paths = {u: filesystem(u, plan.out_storage_options)[1] for u in finals}
    check_out_folders(plan.out, plan.out_storage_options, [*finals, manifest_url(plan.out)])
    earlier = read_manifest(manifest_url(plan.out), plan.out_storage_options,
                            root=output_root(plan.out))
    videos = [u for u in paths if u.endswith(".mp4")]  # maps (.zarr) are folders themselves
    listing = manifest_url(plan.out)  # its folder: the render would fail at its very end
    videos.append(listing)
    paths[listing] = filesystem(listing, plan.out_storage_options)[1]
    folders = [u for u in videos if os.path.isdir(paths[u])] if is_local_fs(fs) else []
    if folders:
        raise OutputExistsError(
            f"{len(folders)} video or manifest path(s) are folders, e.g. {folders[0]!r}. Remove "
            "or rename them, or choose another output folder."
        )
    del paths[listing]  # the manifest is rewritten, never "already exists"
    exists = os.path.lexists if is_local_fs(fs) else fs.exists  # local: a dangling link too
    existing = [] if plan.options.overwrite else [u for u, p in paths.items() if exists(p)]
    if existing:
        raise OutputExistsError(
            f"{len(existing)} video(s) already exist, e.g. {existing[0]!r}. Pass overwrite=True "
            "(--overwrite) to replace them, resume=True (--resume) to keep those a stopped "
            "render finished and render the rest, or choose another output folder."
        )
    if earlier.get("videos") and not plan.options.overwrite and \
            not same_archive(earlier, plan.url, plan.archive_id):
        raise another_archive(plan, earlier)


def another_archive(plan: RenderPlan, manifest: Mapping[str, Any]) -> OutputExistsError:
    """The refusal of a render into a folder whose manifest lists another archive's videos."""
    return OutputExistsError(
        f"{plan.out!r} holds the videos of a render of another archive "
        f"({manifest.get('archive')!r}), which its manifest lists; rendering this one there "
        "would list only this one's (and --resume would replace them). Choose another output "
        "folder, or pass overwrite=True (--overwrite) to start a new manifest there (those "
        "videos stay, unlisted, but where this render writes the same file)."
    )


@dataclass(frozen=True)
class Piece:
    """Frames ``[start, stop)`` of ``plan.jobs[job]``, rows ``[offset, offset + n)`` of a batch."""

    job: int
    start: int
    stop: int
    offset: int

    @property
    def n(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Batch:
    """Up to ``B`` states to render together: consecutive pieces of world-major work."""

    pieces: tuple[Piece, ...]

    @property
    def n(self) -> int:
        return sum(p.n for p in self.pieces)


def pack_batches(jobs: Sequence[Job], batch_worlds: int, lanes: int = 1) -> list[Batch]:
    """Pack the frames of ``jobs`` into batches of ``batch_worlds`` states, ``lanes``
    videos at a time.

    Jobs are dealt in order to ``lanes`` lanes; a lane takes the next job when its
    current one is done. Each batch takes frames from every lane still holding frames,
    in about equal shares (a lane with fewer left leaves its share to the others), so
    every batch feeds ``lanes`` videos and that many encoders work at once, while the
    host holds only a few batches. ``lanes=1``: world-major, one video after another.
    Every batch but the last is full; a job's frames keep their order across batches.

    Args:
        jobs: :class:`flyarchive.query.selection.VideoJob` s (``start``, ``stop`` archive indices).
        batch_worlds: ``B``, states per batch, ``>= 1``.
        lanes: Videos in each batch, at most (capped at ``B``); ``>= 1``.

    Returns:
        The batches, in rendering order; ``Piece.job`` indexes ``jobs``.
    """
    if batch_worlds < 1:
        raise RenderOptionsError(f"batch_worlds must be at least 1, got {batch_worlds!r}.")
    todo = deque(i for i, job in enumerate(jobs) if job.stop > job.start)
    open_lanes: list[list[int]] = []  # per lane: [job index, next archive index]
    batches: list[Batch] = []
    while todo or open_lanes:
        pieces: list[Piece] = []
        filled = 0
        while filled < batch_worlds and (todo or open_lanes):
            while len(open_lanes) < max(1, min(lanes, batch_worlds)) and todo:
                i = todo.popleft()
                open_lanes.append([i, jobs[i].start])
            share = -(-(batch_worlds - filled) // len(open_lanes))  # ceil
            for lane in list(open_lanes):
                i, k = lane
                take = min(share, jobs[i].stop - k, batch_worlds - filled)
                if take <= 0:
                    break
                pieces.append(Piece(i, k, k + take, filled))
                filled += take
                lane[1] = k + take
                if lane[1] == jobs[i].stop:
                    open_lanes.remove(lane)
        batches.append(Batch(tuple(pieces)))
    return batches


def split_groups(jobs: Sequence[Job], batch_worlds: int, n_groups: int) -> list[tuple[Job, ...]]:
    """Split jobs, in order, into at most ``n_groups`` groups of whole videos.

    Each group holds about the same number of frames, rounded up to whole batches, so
    only a group's last batch can be partial (a partial batch costs a full one).

    Returns:
        Non-empty tuples of jobs; concatenated, they are ``jobs``.
    """
    ends = np.cumsum([job.n_frames for job in jobs])  # frames up to the end of each job
    total = int(ends[-1]) if len(ends) else 0
    cuts: list[int] = [0]
    for i in range(1, max(1, n_groups)):
        target = round(i * total / n_groups / batch_worlds) * batch_worlds
        cut = int(np.argmin(np.abs(ends - target))) + 1  # jobs before the cut
        if cuts[-1] < cut < len(jobs):
            cuts.append(cut)
    cuts.append(len(jobs))
    return [tuple(jobs[a:b]) for a, b in zip(cuts, cuts[1:]) if b > a]

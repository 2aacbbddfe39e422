"""Helpers shared by the test suite: where a test writes, tiny recordings, snapshots of
what is committed (to assert that a refused call changed nothing), and an S3 endpoint
that refuses every request.

Plain functions and classes, no pytest: ``tests/conftest.py`` and
``tests/bad_input/conftest.py`` wrap them in fixtures.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import mujoco

__all__ = [
    "Location", "record", "copy_archive", "slider_archive", "write_states", "snapshot", "to_memory",
    "memory_snapshot", "bucket_snapshot", "listing_snapshot", "forbidding_s3",
]


@dataclass(frozen=True)
class Location:
    """Where a test writes an archive: a URL and its fsspec options (None: none)."""

    url: str
    storage_options: dict[str, Any] | None = None


def record(model: mujoco.MjModel, url: str, *, n_worlds: int = 2, n_steps: int = 76,
           chunk_frames: int = 5, **kwargs: Any) -> str:
    """Record ``n_worlds`` worlds of :func:`flyarchive.testing.simulate` into ``url``.

    With the tiny model's 2 ms timestep and the recorder's default 25 fps at 0.2x, a
    frame is due every 4 steps: the default 76 steps give 20 frames per world, the same
    states as ``reference_frames(model, n_worlds, n_steps)``.

    Args:
        model: The model to simulate.
        url: Where to record (created; ``mode="a"`` in ``kwargs`` appends).
        n_worlds: Worlds, each from :func:`flyarchive.testing.perturb` with its seed.
        n_steps: Simulation steps.
        chunk_frames: Frames per chunk (a commit every ``chunk_frames`` frames).
        **kwargs: Passed to :class:`flyarchive.TrajectoryRecorder`.

    Returns:
        ``url``.
    """
    from flyarchive import TrajectoryRecorder
    from flyarchive.testing import simulate

    with TrajectoryRecorder(url, model, chunk_frames=chunk_frames, **kwargs) as recorder:
        simulate(model, n_worlds, n_steps, recorder.record_as_needed)
    return url


def copy_archive(source: str | os.PathLike[str], target: str | os.PathLike[str],
                 storage_options: dict[str, Any] | None = None) -> str:
    """Copy the local archive ``source`` to ``target``, a local path (which must not exist)
    or a URL (``memory://...``, ``s3://bucket/key.zarr``: file by file); returns ``target``.

    A test that needs an archive of its own copies one recorded once (milliseconds; a
    recording takes most of a second, more on S3). The copy is the same archive,
    ``archive_id`` included: a test about an archive replaced at the same URL records a
    new one.
    """
    target = str(target)
    if "://" not in target:
        import shutil

        return str(shutil.copytree(source, target, symlinks=True))
    import fsspec

    fs, root = fsspec.core.url_to_fs(target, **(storage_options or {}))
    for path in sorted(Path(source).rglob("*")):
        if path.is_file():
            fs.pipe_file(f"{root}/{path.relative_to(source).as_posix()}", path.read_bytes())
    return target


def slider_archive(url: str, qpos: Any, *, output_fps: float = 25.0,
                   playback_speed: float = 0.25, chunk_frames: int = 4) -> str:
    """An archive of :func:`flyarchive.testing.slider_model` whose frame ``k`` of world
    ``w`` puts the block at ``x = qpos[w, k, 0]`` (see :func:`~flyarchive.testing.slider_columns`).

    Args:
        url: Where to write it (created).
        qpos: ``(n_worlds, n_frames, 1)`` slider positions in metres; NaN is written as is.
        output_fps: Frames per second of video.
        playback_speed: Simulated seconds per second of video: frame ``k`` is at
            ``t = k * playback_speed / output_fps`` (the slider's timestep is 10 ms).
        chunk_frames: Frames per chunk; each world is a shard of its own.

    Returns:
        ``url``.
    """
    import numpy as np

    from flyarchive.clock import Timing
    from flyarchive.layout import ModelLayout
    from flyarchive.store import ArchiveSpec, ArchiveWriter, FrameBlock
    from flyarchive.testing import slider_model

    qpos = np.asarray(qpos, dtype=float)
    n_worlds, n_frames = qpos.shape[:2]
    spec = ArchiveSpec(ModelLayout.from_model(slider_model()),
                       Timing(0.01, output_fps, playback_speed), tuple(range(n_worlds)),
                       chunk_frames=chunk_frames, shard_worlds=1)
    time = np.arange(n_frames) * (playback_speed / output_fps)
    ArchiveWriter.create(url, spec).write(FrameBlock(time=time, qpos=qpos))
    return url


def write_states(url: str, model: mujoco.MjModel, qpos: Any, *, chunk_frames: int = 5,
                 mocap: tuple[Any, Any] | None = None, portable: Any = None,
                 fps: float = 125.0) -> str:
    """An archive of given states: ``qpos`` ``(worlds, frames, nq)`` (and mocap poses), frame
    ``k`` at ``k / fps`` s (0.008 s apart by default: 25 frames/s at playback 0.2), the model
    kept beside it (and its portable form ``portable``, from
    :func:`flyarchive.models.portable_model`, if given); returns ``url``."""
    import numpy as np

    from flyarchive.clock import Timing
    from flyarchive.layout import ModelLayout
    from flyarchive.models import model_bytes
    from flyarchive.store import ArchiveSpec, ArchiveWriter, FrameBlock

    qpos = np.asarray(qpos, dtype=float)
    timing = Timing(float(model.opt.timestep), fps * 0.2, 0.2)
    spec = ArchiveSpec(ModelLayout.from_model(model), timing, tuple(range(qpos.shape[0])),
                       chunk_frames=chunk_frames, model=model_bytes(model), portable=portable)
    with ArchiveWriter.create(url, spec) as writer:
        writer.write(FrameBlock(np.arange(qpos.shape[1]) * (1.0 / fps), qpos,
                                *(mocap if mocap is not None else (None, None))))
    return url


def snapshot(root: str | os.PathLike[str]) -> dict[str, bytes]:
    """Every file under a local folder: relative path -> bytes (``{}`` if it is missing).

    Compare a snapshot taken before a refused call with one taken after: equal means
    nothing was written, removed or changed.
    """
    root = Path(root)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root)): p.read_bytes() for p in files}


def to_memory(url: str | os.PathLike[str]) -> str:
    """A copy of a local archive in fsspec's memory file system; its ``memory://`` URL."""
    return copy_archive(url, f"memory://{uuid.uuid4().hex}.zarr")


def memory_snapshot(url: str) -> dict[str, bytes]:
    """Every file under a ``memory://`` URL: path -> bytes."""
    import fsspec

    fs = fsspec.filesystem("memory")
    return {p: fs.cat(p) for p in sorted(fs.find(url))}


def bucket_snapshot(fs: Any, bucket: str) -> dict[str, bytes]:
    """Every object of ``bucket`` on the fsspec file system ``fs``: key -> bytes."""
    return {p: fs.cat_file(p) for p in sorted(fs.find(bucket))}


def listing_snapshot(fs: Any, root: str) -> dict[str, tuple[Any, ...]]:
    """Every object under ``root`` (``bucket/prefix``) of the S3 file system ``fs`` as one
    listing describes it: key -> (ETag, size, last modified).

    One LIST request where :func:`bucket_snapshot` makes a GET per object. The ETag of an
    object put whole is the MD5 of its bytes, and a rewrite moves its time: equal
    snapshots mean nothing was written, removed or changed.
    """
    return {key: (info["ETag"], info["size"], info["LastModified"])
            for key, info in sorted(fs.find(root, detail=True).items())}


class _Forbidden(BaseHTTPRequestHandler):
    """Answers every S3 request as AWS does for an unknown access key; notes each method."""

    protocol_version = "HTTP/1.1"
    body = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InvalidAccessKeyId</Code>'
            b"<Message>The AWS Access Key Id you provided does not exist in our records."
            b"</Message></Error>")

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        self.server.methods.append(self.command)  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.send_response(403)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", "0" if self.command == "HEAD" else str(len(self.body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(self.body)

    do_PUT = do_HEAD = do_POST = do_DELETE = do_GET


@dataclass(frozen=True)
class ForbiddingS3:
    """An S3 endpoint on loopback that refuses every request (HTTP 403, bad key).

    Attributes:
        endpoint_url: ``http://127.0.0.1:PORT``.
        methods: HTTP methods of the requests received so far, in order.
    """

    endpoint_url: str
    methods: list[str]

    @property
    def writes(self) -> list[str]:
        """The requests that would have changed something (PUT, POST, DELETE)."""
        return [m for m in self.methods if m in ("PUT", "POST", "DELETE")]


@contextmanager
def forbidding_s3() -> Iterator[ForbiddingS3]:
    """Serve an S3 endpoint that refuses every request, for the ``with`` block."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Forbidden)
    server.methods = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield ForbiddingS3(f"http://127.0.0.1:{server.server_address[1]}",
                           server.methods)  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()

"""What a render run reports about itself: progress bars, and stage timings of the Warp
pipeline gathered by a :class:`PipelineProfile` context (as ``dask.diagnostics.Profiler``).

Nothing here is global but the profiles active in each context (a
:class:`contextvars.ContextVar`): a render reports to the profiles that were active
where it started, so two renders in two threads, each in its own ``with
PipelineProfile()``, never mix their numbers.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from types import TracebackType
from typing import Any

#: Seconds per stage, summed over threads. The thread that drives the renderer gets its
#: renderer (``setup_s``: imports, kernel loading, model and buffers on the device, when
#: the process does not hold one already), waits for
#: reads (``wait_read_s``), for a free host buffer (``wait_encoders_s``), submits
#: batches (``submit_s``) and waits for their frames (``wait_gpu_s``); encoder threads
#: wait for work (``encoder_idle_s``), hand frames over (``encode_s``: of which
#: ``write_rgb_s`` piping to ffmpeg and ``write_maps_s`` compressing map chunks), open
#: each video's writers (``open_s``), close their inputs (``close_input_s``: the maps'
#: last chunks) and finish and publish videos (``publish_s``, of which ``wait_ffmpeg_s``
#: waiting for ffmpeg to exit).
STAGES = ("setup_s", "wait_read_s", "wait_encoders_s", "submit_s", "wait_gpu_s", "encode_s",
          "publish_s", "encoder_idle_s", "write_rgb_s", "write_maps_s", "open_s",
          "close_input_s", "wait_ffmpeg_s")
#: Counts: batches submitted, states rendered (one per world and frame, every camera),
#: videos published, and the most encoder threads one render used.
COUNTS = ("batches", "frames", "videos", "encoder_threads")

_ACTIVE: contextvars.ContextVar[tuple[PipelineProfile, ...]] = contextvars.ContextVar(
    "flyarchive_pipeline_profiles", default=())


class PipelineProfile:
    """Stage timings of the Warp render pipeline (backends ``"gpu"`` and ``"warp-cpu"``).

    Every render started inside the ``with`` block, in this thread (or a task of
    this context), adds to :attr:`results`; renders that run on Dask workers send
    their numbers back with their results. The OpenGL backend (``"opengl"``) reports
    nothing. Profiles nest: an inner one sees only its block, the outer one all of it.

    Example::

        with PipelineProfile() as prof:
            render_videos(url, model, "front", "videos",
                          options=RenderOptions(backend="warp-cpu"), n_workers=0)
        print(prof.results["encode_s"], prof.results["frames"])

    Thread-safe: encoder threads add to it while the render runs.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._results: dict[str, float] = dict.fromkeys(STAGES + COUNTS, 0.0)
        self._tokens: list[contextvars.Token[tuple[PipelineProfile, ...]]] = []

    def __enter__(self) -> PipelineProfile:
        self._tokens.append(_ACTIVE.set((*_ACTIVE.get(), self)))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        _ACTIVE.reset(self._tokens.pop())

    @property
    def results(self) -> dict[str, float]:
        """A copy of the numbers so far: every key of :data:`STAGES` (seconds) and
        :data:`COUNTS`, each ``>= 0``."""
        with self._lock:
            return dict(self._results)

    def add(self, results: Mapping[str, float]) -> None:
        """Add another run's results (sums; ``encoder_threads`` keeps the larger)."""
        with self._lock:
            for key, value in results.items():
                if key == "encoder_threads":
                    self._results[key] = max(self._results[key], float(value))
                elif key in self._results:
                    self._results[key] += float(value)


class StageTimer:
    """What one render reports to the profiles active where it was made (none: nothing).

    Made in the thread that starts a render and passed explicitly to its other threads
    (threads do not inherit context variables).
    """

    def __init__(self) -> None:
        self._profiles = _ACTIVE.get()

    def __bool__(self) -> bool:
        return bool(self._profiles)

    def add(self, key: str, value: float) -> None:
        """Add ``value`` to ``key`` of every active profile."""
        for profile in self._profiles:
            profile.add({key: value})

    def add_results(self, results: Mapping[str, float]) -> None:
        """Add a whole run's results (e.g. from a Dask worker)."""
        for profile in self._profiles:
            profile.add(results)

    @contextmanager
    def time(self, key: str) -> Iterator[None]:
        """Add the seconds the block takes to ``key``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(key, time.perf_counter() - start)


def progress_bar(total: int, show: bool, *, what: str = "frames", unit: str = "frame",
                 items: Iterable[Any] | None = None) -> Any:
    """A tqdm progress bar of ``total`` steps, or None when ``show`` is False.

    Args:
        total: Steps to come.
        show: Whether to show one.
        what: Its label.
        unit: What one step is.
        items: An iterable to wrap (the bar advances as it is consumed, and closes at
            its end); None: call ``update(n)`` and ``close()`` yourself.
    """
    if not show:
        return None
    from tqdm import tqdm

    return tqdm(items, total=total, desc=what, unit=unit)

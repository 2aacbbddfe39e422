"""The public recorders, bound to flyarchive's archives: :class:`TrajectoryRecorder`
(:mod:`flyarchive.record.cpu_recorder`) and :class:`WarpTrajectoryRecorder`
(:mod:`flyarchive.record.warp_recorder`, made on first use: its module imports Warp), writing
through the store's :class:`~flyarchive.store.ArchiveWriter` and reading their recording
back (``.trajectory``) through :mod:`flyarchive.interop.trajectories` (:data:`ARCHIVES`).

The record stage imports only the base modules: its recorders sample state and hand
blocks of frames to a sink (:mod:`flyarchive.record.sink`); this module hands them the
store (dependency injection). ``flyarchive.TrajectoryRecorder`` is this module's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flyarchive.clock import Timing
from flyarchive.layout import ModelLayout
from flyarchive.record import cpu_recorder as cpu
from flyarchive.record.sink import ArchiveSink
from flyarchive.archive_spec import ArchiveSpec


class StoredArchives:
    """The archives of :mod:`flyarchive.store` as recorders use them
    (:class:`flyarchive.record.sink.Archives`)."""

    def create(self, url: str, spec: ArchiveSpec, **options: Any) -> ArchiveSink:
        from flyarchive.store import ArchiveWriter

        return ArchiveWriter.create(url, spec, **options)

    def append(self, url: str, layout: ModelLayout, *, timing: Timing | None = None,
               **options: Any) -> ArchiveSink:
        from flyarchive.store import ArchiveWriter

        return ArchiveWriter.append(url, layout, timing=timing, **options)

    def refuse_existing(self, url: str,
                        storage_options: Mapping[str, Any] | None = None) -> None:
        from flyarchive.store import refuse_existing

        refuse_existing(url, storage_options)

    def read_trajectories(self, url: str, storage_options: Mapping[str, Any] | None = None, *,
                          worlds: Sequence[int] | None = None) -> Any:
        from flyarchive.interop.trajectories import read_trajectories

        return read_trajectories(url, storage_options, worlds=worlds)

    def before_exit(self) -> None:
        from flyarchive.store.shutdown import write_without_new_threads

        write_without_new_threads()


#: flyarchive's archives, as the public recorders write them.
ARCHIVES = StoredArchives()


class TrajectoryRecorder(cpu.TrajectoryRecorder):
    __doc__ = cpu.TrajectoryRecorder.__doc__
    archives = ARCHIVES


def __getattr__(name: str) -> Any:
    """:class:`WarpTrajectoryRecorder`, bound on first use (its module imports Warp)."""
    if name != "WarpTrajectoryRecorder":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from flyarchive.record.warp_recorder import WarpTrajectoryRecorder as Recorder

    bound = type("WarpTrajectoryRecorder", (Recorder,),
                 {"__doc__": Recorder.__doc__, "__module__": __name__, "archives": ARCHIVES})
    globals()[name] = bound
    return bound

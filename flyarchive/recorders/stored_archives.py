"""flyarchive's archives as the public recorders write them: :class:`StoredArchives`, the
store's :class:`~flyarchive.store.ArchiveWriter` behind the record stage's protocols
(:class:`flyarchive.record.sink.Archives`), and :data:`ARCHIVES`, the one the public
recorders are bound to.

The record stage imports only the base modules: its recorders sample state and hand
blocks of frames to a sink (:mod:`flyarchive.record.sink`); this module hands them the
store (dependency injection), and reads their recording back (``.trajectory``) through
:mod:`flyarchive.recorders.trajectories`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flyarchive.archive_spec import ArchiveSpec
from flyarchive.clock import Timing
from flyarchive.layout import ModelLayout
from flyarchive.record.sink import ArchiveSink


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

    def check_location(self, url: str, mode: str,
                       storage_options: Mapping[str, Any] | None = None) -> None:
        """Refuse, before anything is recorded, a location inside another archive's folder
        and (``mode="w-"``) one where something is already."""
        from flyarchive.store import refuse_existing
        from flyarchive.store.local_files import refuse_nested_archive
        from flyarchive.store.location import is_local, local_path

        if is_local(url):
            refuse_nested_archive(local_path(url))
        if mode == "w-":
            refuse_existing(url, storage_options)

    def read_trajectories(self, url: str, storage_options: Mapping[str, Any] | None = None, *,
                          worlds: Sequence[int] | None = None) -> Any:
        from flyarchive.recorders.trajectories import read_trajectories

        return read_trajectories(url, storage_options, worlds=worlds)

    def before_exit(self) -> None:
        from flyarchive.store.shutdown import write_without_new_threads

        write_without_new_threads()


#: flyarchive's archives, as the public recorders write them.
ARCHIVES = StoredArchives()

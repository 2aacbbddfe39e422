"""What a recorder needs of the archives it writes, as protocols: the writer of one archive
(:class:`ArchiveSink`) and the archives themselves (:class:`Archives`: create, append,
refuse, read back). The store implements them (:class:`flyarchive.store.ArchiveWriter`);
the public recorders are bound to it by :mod:`flyarchive.recorders`. So recorders never
import the store or query: they sample state and hand :class:`FrameBlock` s to a sink.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from flyarchive.clock import Timing
from flyarchive.layout import ModelLayout
from flyarchive.archive_spec import ArchiveSpec, FrameBlock

class ArchiveSink(Protocol):
    """The writer of one archive, as a recorder uses it (:class:`flyarchive.store.ArchiveWriter`)."""

    url: str
    world_ids: tuple[int, ...]
    n_worlds: int
    chunk_frames: int
    dtype: np.dtype
    block: tuple[int, int] | None
    attrs: Mapping[str, Any]

    @property
    def n_frames(self) -> int: ...
    def write(self, block: FrameBlock, *, n_frames: np.ndarray | None = None) -> None: ...
    def last_frame(self) -> FrameBlock | None: ...
    def close(self) -> None: ...


class Archives(Protocol):
    """The archives recorders write (:data:`flyarchive.recorders.ARCHIVES`)."""

    def create(self, url: str, spec: ArchiveSpec, *, mode: str = "w-",
               storage_options: Mapping[str, Any] | None = None,
               takeover: bool = False) -> ArchiveSink: ...

    def append(self, url: str, layout: ModelLayout, *,
               storage_options: Mapping[str, Any] | None = None, timing: Timing | None = None,
               world_block: tuple[int, int] | None = None, takeover: bool = False,
               codec: str | None = None, dtype: Any = None) -> ArchiveSink: ...

    def check_location(self, url: str, mode: str,
                       storage_options: Mapping[str, Any] | None = None) -> None: ...

    def read_trajectories(self, url: str, storage_options: Mapping[str, Any] | None = None, *,
                          worlds: Sequence[int] | None = None) -> Any: ...

    def before_exit(self) -> None: ...

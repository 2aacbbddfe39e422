"""Archives of random states, written without simulating: for tests of reading.

Nothing here is needed to record or replay.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["TIMING", "write_random"]


def _timing() -> Any:
    from flyarchive.clock import Timing

    return Timing(0.002, 25, 0.2)


#: The frame schedule of :func:`write_random`'s archives (the tiny model's timestep).
TIMING = _timing()


def write_random(url: str, n_worlds: int = 64, n_frames: int = 40, *, chunk_frames: int = 20,
                 shard_worlds: int = 64, committed: np.ndarray | None = None,
                 world_ids: Sequence[int] | None = None, mode: str = "w-", seed: int = 0,
                 storage_options: Mapping[str, Any] | None = None) -> np.ndarray:
    """Write random states of the tiny model (13 dofs, one mocap body) to a new archive.

    Random float64 values do not compress, so the bytes a read moves say what it read.
    One commit per ``chunk_frames`` frames, through :class:`flyarchive.store.ArchiveWriter`.

    Args:
        url: Where.
        n_worlds, n_frames: Worlds and frames written.
        chunk_frames, shard_worlds: The archive's chunking.
        committed: ``(n_worlds,)`` frames each world commits (default: all of them).
        world_ids: The worlds' ids (default: ``0..n_worlds-1``).
        mode: As for :meth:`~flyarchive.store.ArchiveWriter.create`.
        seed: Seeds the values.
        storage_options: Passed to fsspec.

    Returns:
        ``(n_worlds, n_frames, 13)`` qpos as written (also past ``committed``).
    """
    from flyarchive.layout import ModelLayout
    from flyarchive.store import ArchiveSpec, ArchiveWriter, FrameBlock
    from flyarchive.testing import tiny_model

    model = tiny_model()
    rng = np.random.default_rng(seed)
    ids = tuple(int(w) for w in (world_ids if world_ids is not None else range(n_worlds)))
    spec = ArchiveSpec(ModelLayout.from_model(model), TIMING, ids, chunk_frames=chunk_frames,
                       shard_worlds=shard_worlds)
    qpos = rng.normal(size=(n_worlds, n_frames, model.nq))
    with ArchiveWriter.create(url, spec, mode=mode, storage_options=storage_options) as writer:
        for t0 in range(0, n_frames, chunk_frames):
            t1 = min(t0 + chunk_frames, n_frames)
            n = t1 - t0
            block = FrameBlock(TIMING.frame_times(np.arange(t0, t1)), qpos[:, t0:t1],
                               rng.normal(size=(n_worlds, n, 1, 3)),
                               rng.normal(size=(n_worlds, n, 1, 4)), frame=np.arange(t0, t1))
            ends = None if committed is None else np.minimum(committed, t1)
            writer.write(block, n_frames=ends)
    return qpos

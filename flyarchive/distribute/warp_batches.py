"""The states of each batch of the Warp pipeline, read from the archive, with the overlay
text of each state: world-major per-world videos, or the tiles of mosaic frames.

A batch (:class:`~flyarchive.distribute.plan.Batch`) holds pieces of videos, in frames;
a mosaic frame of ``T`` tiles takes ``T`` render slots (slot ``frame * T + tile``). Slots
without a state (a blank tile, or a world past its last frame) are NaN, which the
pipeline renders black like any non-finite state.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flyarchive.distribute.plan import Batch
from flyarchive.store import StateReader
from flyarchive.video.mosaic import is_mosaic

__all__ = ["BatchSource"]


class BatchSource:
    """Reads the states (and texts) of batches of ``jobs``.

    Args:
        plan: The render plan (archive, options: ``overlay``).
        jobs: The videos, indexed by ``Piece.job``: all per-world or all mosaics.
        tiles: Slots per frame: ``rows * cols`` for mosaics, else 1.
    """

    def __init__(self, plan: Any, jobs: tuple[Any, ...], tiles: int = 1) -> None:
        self._reader = StateReader(plan.url, plan.storage_options)
        self._jobs, self._tiles = jobs, tiles
        self._mosaic = bool(jobs) and is_mosaic(jobs[0])
        items = tuple(getattr(plan.options, "overlays", ()))
        self._overlay = None
        if items or self._mosaic:
            from flyarchive.query.archive import open_header
            from flyarchive.video.overlay_text import OverlayText

            header = open_header(plan.url, plan.storage_options or None)  # no xarray imported
            self._overlay = OverlayText(header, items, label_world=self._mosaic,
                                        size=tuple(plan.options.size))

    def read(self, batch: Batch) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None,
                                          list[str] | None]:
        """qpos ``(n, nq)``, mocap poses (None without mocap bodies), float32 host arrays,
        and one text per slot (None without overlay) of a batch's slots."""
        if self._mosaic:
            return self._read_mosaic(batch)
        pieces = [(self._jobs[p.job].world_index, p.start, p.stop) for p in batch.pieces]
        qpos, mocap_pos, mocap_quat = self._reader.read(pieces)
        texts = None
        if self._overlay is not None:
            texts = [t for w, k0, k1 in pieces for t in self._overlay.texts(w, k0, k1)]
        return qpos, mocap_pos, mocap_quat, texts

    def _read_mosaic(self, batch: Batch) -> tuple[np.ndarray, np.ndarray | None,
                                                  np.ndarray | None, list[str] | None]:
        """The tiles of every mosaic frame of the batch, in one read of the archive (the
        tiles of a mosaic are often consecutive worlds over the same frames: one block)."""
        tiles = self._tiles
        slots = batch.n * tiles
        out = {name: np.full((slots, *a.shape[2:]), np.nan, np.float32)
               for name, a in self._reader.arrays.items()}
        texts = [""] * slots
        reads: list[tuple[int, int, int]] = []  # (world index, start, stop) per tile piece
        rows: list[np.ndarray] = []  # the slots each one fills
        for piece in batch.pieces:
            for t, tile in enumerate(self._jobs[piece.job].tiles):
                last = piece.stop if tile is None else min(piece.stop, tile.stop)
                if tile is None or last <= piece.start:
                    continue
                reads.append((tile.world_index, piece.start, last))
                rows.append((piece.offset + np.arange(last - piece.start)) * tiles + t)
        if not reads:
            return out["qpos"], out.get("mocap_pos"), out.get("mocap_quat"), texts
        states = self._reader.read(reads)
        where = np.concatenate(rows)
        for name, values in zip(("qpos", "mocap_pos", "mocap_quat"), states):
            if values is not None:
                out[name][where] = values
        assert self._overlay is not None
        for (world, start, stop), slot_rows in zip(reads, rows):
            for row, text in zip(slot_rows, self._overlay.texts(world, start, stop)):
                texts[row] = text
        return out["qpos"], out.get("mocap_pos"), out.get("mocap_quat"), texts

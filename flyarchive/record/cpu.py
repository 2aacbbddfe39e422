"""Record CPU MuJoCo simulations (one or several ``MjData``) into an archive."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import mujoco
import numpy as np

from flyarchive.clock import FrameClock, Timing
from flyarchive.errors import NonFiniteStateError
from flyarchive.layout import ModelLayout
from flyarchive.store import ArchiveSpec, ArchiveWriter, FrameBlock, parse_mode, refuse_existing

__all__ = ["TrajectoryRecorder", "FrameBuffer"]


def _n_world_vars(world_vars: Mapping[str, Any]) -> int:
    """Worlds implied by the first world variable (1 without any), to check options early."""
    for values in world_vars.values():
        shape = np.shape(values)
        return shape[0] if shape and shape[0] > 0 else 1
    return 1


class FrameBuffer:
    """Host buffer of up to ``chunk_frames`` frames for ``n_worlds`` worlds.

    Args:
        n_worlds: Worlds per frame.
        chunk_frames: Capacity in frames.
        nq: Generalized coordinates per world.
        nmocap: Mocap bodies per world (0 for none).
        dtype: Storage dtype.
    """

    def __init__(self, n_worlds: int, chunk_frames: int, nq: int, nmocap: int, dtype: Any) -> None:
        self.time = np.empty(chunk_frames, dtype=np.float64)
        self.qpos = np.empty((n_worlds, chunk_frames, nq), dtype=dtype)
        self.mocap_pos = np.empty((n_worlds, chunk_frames, nmocap, 3), dtype=dtype) if nmocap else None
        self.mocap_quat = np.empty((n_worlds, chunk_frames, nmocap, 4), dtype=dtype) if nmocap else None
        self.size = 0

    @property
    def full(self) -> bool:
        return self.size == len(self.time)

    def block(self) -> FrameBlock:
        """The buffered frames (views, valid until the next :meth:`clear`)."""
        n = self.size
        return FrameBlock(
            self.time[:n], self.qpos[:, :n],
            None if self.mocap_pos is None else self.mocap_pos[:, :n],
            None if self.mocap_quat is None else self.mocap_quat[:, :n],
        )

    def clear(self) -> None:
        self.size = 0


class TrajectoryRecorder:
    """Records the kinematic state of CPU simulations at the video cadence.

    Drop-in for flygym's recorder loop: call :meth:`record_as_needed` after every
    step; it returns True when it recorded a frame. Frames are buffered on the host
    (one chunk at most) and committed to the archive every ``chunk_frames`` frames
    and on :meth:`close` (also when used as a context manager).

    Args:
        url: Where to write: a local path or any fsspec URL.
        model: The compiled model being simulated.
        output_fps: Video frame rate, frames per second.
        playback_speed: Video seconds per simulated second.
        chunk_frames: Frames per chunk and per flush; a crash loses at most this many.
        world_ids: World index of each ``MjData`` passed to :meth:`record_as_needed`
            (default ``0..n-1``).
        mode: ``"w-"`` (default) refuses an existing archive, ``"w"`` replaces it,
            ``"a"`` appends after its last committed frame.
        storage_options: Passed to fsspec.
        codec: ``"lossless"`` (default) or ``"abs:<bound>"``.
        dtype: Storage dtype (default float64, bit-exact with MuJoCo's state).
        source: Recorded in the attributes.
        attrs: User metadata stored in the archive's attributes.
        world_vars: Per-world user variables, ``{name: (n_worlds,) array}``.
        world_block: ``(start, stop)``: write only these world indices of an archive
            created beforehand with ``ArchiveSpec(capacity_frames=...)``, alongside other
            processes writing other blocks (e.g. one per GPU). Needs ``mode="a"``.
        takeover: Take over the archive's claim (with ``world_block``: this block's)
            from a writer that crashed on another host; a writer that died on this host
            is taken over without it.

    Raises:
        ArchiveExistsError: if ``mode="w-"`` and something is at ``url`` (checked at once).
        SchemaError, CodecSpecError, TimingError, ValueError: for options that cannot
            work (checked at once, before anything is written).
        ArchiveInUseError: from the first :meth:`record_as_needed` when another writer
            holds the archive.
        NonFiniteStateError: from :meth:`record_as_needed` when a world's state holds
            NaN or infinity; nothing of that frame is buffered, and every frame before it
            is committed by :meth:`close`.
    """

    def __init__(
        self,
        url: str,
        model: mujoco.MjModel,
        *,
        output_fps: float = 25,
        playback_speed: float = 0.2,
        chunk_frames: int = 100,
        world_ids: Sequence[int] | None = None,
        mode: str = "w-",
        storage_options: Mapping[str, Any] | None = None,
        codec: str = "lossless",
        dtype: str = "float64",
        source: str = "mujoco",
        attrs: Mapping[str, Any] | None = None,
        world_vars: Mapping[str, np.ndarray] | None = None,
        world_block: tuple[int, int] | None = None,
        takeover: bool = False,
    ) -> None:
        if world_block is not None and parse_mode(mode) != "a":
            raise ValueError("world_block writes into an existing archive: pass mode='a'.")
        self._block = dict(world_block=world_block, takeover=takeover)
        self.url = str(url)
        self.layout = ModelLayout.from_model(model)
        self.timing = Timing(float(model.opt.timestep), output_fps, playback_speed)
        self._options = dict(mode=parse_mode(mode), storage_options=storage_options,
                             takeover=takeover)
        self._spec_args = dict(
            dtype=dtype, source=source, chunk_frames=chunk_frames, codec=codec,
            attrs=dict(attrs or {}), world_vars=dict(world_vars or {}),
        )
        # Every option is checked now, before the first frame and before any storage.
        spec = self._spec(range(_n_world_vars(self._spec_args["world_vars"]))
                          if world_ids is None else world_ids)
        self._world_ids = None if world_ids is None else spec.world_ids
        self._writer: ArchiveWriter | None = None
        self._buffer: FrameBuffer | None = None
        self._clock: FrameClock | None = None
        self._closed = False
        if mode == "w-":
            refuse_existing(self.url, storage_options)

    def _spec(self, world_ids: Sequence[int]) -> ArchiveSpec:
        return ArchiveSpec(self.layout, self.timing, world_ids, **self._spec_args)  # type: ignore[arg-type]

    def _start(self, n_worlds: int) -> None:
        world_ids = self._world_ids or tuple(range(n_worlds))
        if len(world_ids) != n_worlds:
            raise ValueError(f"world_ids has {len(world_ids)} entries for {n_worlds} MjData.")
        if self._block["world_block"] is not None:
            self._writer = ArchiveWriter.append(
                self.url, self.layout, storage_options=self._options["storage_options"],
                timing=self.timing, **self._block,
            )
        else:
            self._writer = ArchiveWriter.create(self.url, self._spec(world_ids), **self._options)
        if self._writer.n_worlds != n_worlds:
            self._writer.close()  # release the archive: nothing was written
            raise ValueError(
                f"The archive at {self.url!r} has {self._writer.n_worlds} worlds; "
                f"{n_worlds} MjData were passed."
            )
        w = self._writer
        self._buffer = FrameBuffer(n_worlds, w.chunk_frames, self.layout.nq, self.layout.nmocap, w.dtype)
        self._clock = FrameClock(self.timing, next_frame=w.n_frames)

    @property
    def n_frames(self) -> int:
        """Frames recorded so far (committed and buffered)."""
        if self._writer is None or self._buffer is None:
            return 0
        return self._writer.n_frames + self._buffer.size

    @property
    def committed_frames(self) -> int:
        """Frames committed to the archive (safe from a crash)."""
        return 0 if self._writer is None else self._writer.n_frames

    def record_as_needed(self, mj_data: mujoco.MjData | Sequence[mujoco.MjData]) -> bool:
        """Record the state of ``mj_data`` (one or several worlds) if a frame is due.

        All worlds must be at the same simulation time.

        Returns:
            True if a frame was recorded.
        """
        datas = [mj_data] if isinstance(mj_data, mujoco.MjData) else list(mj_data)
        if self._closed:
            raise RuntimeError(f"The recorder for {self.url!r} is closed; create a new one.")
        if self._writer is None:
            self._start(len(datas))
        assert self._clock is not None and self._buffer is not None
        if not self._clock.is_due_at(datas[0].time):
            return False
        buf, i = self._buffer, self._buffer.size
        for w, data in enumerate(datas):
            buf.qpos[w, i] = data.qpos
            if buf.mocap_pos is not None and buf.mocap_quat is not None:
                buf.mocap_pos[w, i] = data.mocap_pos
                buf.mocap_quat[w, i] = data.mocap_quat
        self._check_finite(i, datas[0].time)
        buf.time[i] = datas[0].time
        buf.size += 1
        if buf.full:
            self.flush()
        return True

    def _check_finite(self, i: int, time: float) -> None:
        assert self._buffer is not None and self._writer is not None
        buf = self._buffer
        bad = ~np.isfinite(buf.qpos[:, i]).all(axis=1)
        if buf.mocap_pos is not None and buf.mocap_quat is not None:
            bad |= ~np.isfinite(buf.mocap_pos[:, i]).all(axis=(1, 2))
            bad |= ~np.isfinite(buf.mocap_quat[:, i]).all(axis=(1, 2))
        if bad.any():
            self._clock.next_frame -= 1  # type: ignore[union-attr]
            worlds = [self._writer.world_ids[w] for w in np.flatnonzero(bad)]
            raise NonFiniteStateError(
                f"The state of world(s) {worlds} holds NaN or infinity at t={time!r} s "
                f"(frame {self.n_frames}); the simulation diverged. The frame was not recorded; "
                f"the {self.n_frames} frames before it are kept. Reduce the timestep or fix the "
                "controller, and close() the recorder to commit what was recorded."
            )

    def flush(self) -> None:
        """Commit the buffered frames to the archive."""
        if self._writer is None or self._buffer is None or self._buffer.size == 0:
            return
        self._writer.write(self._buffer.block())
        self._buffer.clear()

    def close(self) -> None:
        """Commit what is buffered and release the archive; the recorder takes no more frames."""
        if not self._closed:
            self.flush()
            self._closed = True
            if self._writer is not None:
                self._writer.close()

    def __enter__(self) -> "TrajectoryRecorder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

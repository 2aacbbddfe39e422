"""What a task of the lazy positions runs: :func:`kinematics_block` finds (or builds: once
per thread on the CPU, once per process on Warp) the engine of its model, keypoints and
backend, and runs it on a block of the archive's state.

The model travels to workers as its MJB bytes, sent once per client and model, and is
loaded once per process (:mod:`~flyarchive.models.shipping`); state is read on the worker
from the archive, never shipped.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from flyarchive.analyze.cpu_positions import CpuKinematics
from flyarchive.analyze.keypoints import KeypointSet
from flyarchive.lru import LRUCache
from flyarchive.models.shipping import ModelRef, shipped_model

#: CPU engines kept per thread, at most (each holds an ``MjData`` of its own).
ENGINES_PER_THREAD = 4
#: This thread's CPU engines (an :class:`~flyarchive.lru.LRUCache` each thread makes).
_LOCAL = threading.local()


def thread_engine(sha256: str, blob: bytes | ModelRef, keypoints: KeypointSet, orientations: bool,
                  backend: str, largest: int | None = None) -> Any:
    """The engine of a model, keypoints and backend for this thread: on ``"cpu"`` this
    thread's own (an ``MjData`` per thread; built on first use), on Warp the process's
    (:func:`~flyarchive.analyze.warp_positions.warp_engine`: batches of at most
    ``largest`` frames, the most a caller gives at once), which is never held here (the
    process's cache decides when it goes)."""
    if backend != "cpu":
        from flyarchive.analyze.warp_positions import warp_engine

        return warp_engine(shipped_model(sha256, blob), sha256, keypoints, orientations, backend,
                           largest=largest)
    engines = getattr(_LOCAL, "engines", None)
    if engines is None:
        engines = _LOCAL.engines = LRUCache(ENGINES_PER_THREAD, name="CPU engines of a thread")
    return engines.get((sha256, keypoints.digest, orientations),
                       lambda: CpuKinematics(shipped_model(sha256, blob), keypoints, orientations))


def kinematics_block(qpos: np.ndarray, *args: Any, sha256: str, keypoints: KeypointSet,
                     orientations: bool, backend: str, mocap: bool,
                     largest: int | None = None) -> np.ndarray:
    """One block of the lazy positions: ``(w, t, nq)`` qpos (and, with ``mocap``,
    ``(w, t, nmocap, 3)`` positions and ``(w, t, nmocap, 4)`` quaternions), then the
    model's MJB bytes (or their :class:`~flyarchive.models.shipping.ModelRef`) ->
    ``(w, t, K, 3 or 7)`` (float64 on ``"cpu"``, float32 on Warp, with an engine whose
    batch holds ``largest`` frames, the array's largest block: one engine serves every
    block of the array, and none computes frames that no block holds)."""
    blob = args[-1]
    mocap_pos, mocap_quat = (args[0], args[1]) if mocap else (None, None)
    engine = thread_engine(sha256, blob, keypoints, orientations, backend, largest)
    w, t = qpos.shape[:2]
    flat = [None if a is None else np.asarray(a).reshape(w * t, *a.shape[2:])
            for a in (qpos, mocap_pos, mocap_quat)]
    out = engine.frames(*flat)
    return out.reshape(w, t, *out.shape[1:])

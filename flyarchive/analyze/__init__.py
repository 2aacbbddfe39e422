"""Analyze: what the recorded worlds did, in space. Forward kinematics of keypoints (bodies,
sites and points fixed in bodies) for every world and frame, kept beside the archive on
request, and gait and locomotion measures from them.

- :func:`positions` (:mod:`~flyarchive.analyze.lazy`): lazy positions of an archive
  (built by :mod:`~flyarchive.analyze.prepare`: window, model
  (:mod:`~flyarchive.analyze.model`), keypoints, dask blocks running
  :mod:`~flyarchive.analyze.blocks`), on the CPU (:mod:`~flyarchive.analyze.cpu_positions`,
  bit-exact with MuJoCo, on the model's :mod:`~flyarchive.analyze.skeleton`) or with
  mujoco-warp (:mod:`~flyarchive.analyze.warp_positions`, Warp's CPU device or CUDA); the
  model's bytes in the graph, sent to a Dask cluster once per client and model
  (:mod:`~flyarchive.models.shipping`, the renderer's lazy frames' too);
  :func:`~flyarchive.analyze.warp_stream.load_positions` streams a window into host memory
  with reading (straight through the archive's shard reader:
  :mod:`~flyarchive.store.window_reader`), upload, kinematics and copy-back overlapped;
- keypoints by name, leg and segment (:mod:`~flyarchive.analyze.keypoints`);
- :func:`keep_positions`, :func:`open_positions` (:mod:`~flyarchive.analyze.keep`):
  positions stored as a derived group, committed as recordings are;
- :func:`gait_summary`, :func:`gait_steps`, :func:`gait_epochs`
  (:mod:`~flyarchive.analyze.gait`): distance, speed, heading, height, step frequency, duty
  factor, phases, tripod coordination and support patterns per world, one row per step,
  every stance and swing interval; from archives, positions or ``movement`` poses datasets;
  stance, swing and their events from the tips (:mod:`~flyarchive.analyze.steps`), by the
  thresholds of :class:`GaitParams` (:mod:`~flyarchive.analyze.gait_params`: no NumPy, so
  that the command line's parser reads their defaults); positions computed into memory by
  this process and worker processes (:mod:`~flyarchive.analyze.cpu_processes`) on the CPU.

Imports only the stages before it (store, query) and the base modules. Importing the
package imports none of them: each name below loads its module on first use (the command
line builds its parsers with :data:`BACKENDS` alone; ``flyarchive --help`` imported MuJoCo,
NumPy and the analysis modules through here before, 1.5 s on a loaded 2-core VM).
"""

from __future__ import annotations

import importlib
from typing import Any

#: Backends of :func:`flyarchive.positions`: CPU MuJoCo (bit-exact), mujoco-warp on
#: Warp's CPU device, mujoco-warp on CUDA.
BACKENDS = ("cpu", "warp-cpu", "gpu")

_LAZY = {
    "GaitParams": "flyarchive.analyze.gait_params", "gait_summary": "flyarchive.analyze.gait",
    "gait_steps": "flyarchive.analyze.gait", "gait_epochs": "flyarchive.analyze.gait",
    "gait_positions": "flyarchive.analyze.gait", "gait_points": "flyarchive.analyze.gait",
    "keep_positions": "flyarchive.analyze.keep", "open_positions": "flyarchive.analyze.keep",
    "keypoint_labels": "flyarchive.analyze.keypoints",
    "select_keypoints": "flyarchive.analyze.keypoints",
    "tarsus_tips": "flyarchive.analyze.keypoints", "positions": "flyarchive.analyze.lazy",
    "StreamStats": "flyarchive.analyze.warp_stream",
    "load_positions": "flyarchive.analyze.warp_stream",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # looked up once
        return value
    raise AttributeError(f"module 'flyarchive.analyze' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


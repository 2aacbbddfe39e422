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
  (:mod:`~flyarchive.analyze.model_ref`, the renderer's lazy frames' too);
  :func:`~flyarchive.analyze.warp_stream.load_positions` streams a window into host memory
  with reading (straight through the archive's shard reader:
  :mod:`~flyarchive.analyze.state_read`), upload, kinematics and copy-back overlapped;
- keypoints by name, leg and segment (:mod:`~flyarchive.analyze.keypoints`);
- :func:`keep_positions`, :func:`open_positions` (:mod:`~flyarchive.analyze.keep`):
  positions stored as a derived group, committed as recordings are;
- :func:`gait_summary`, :func:`gait_steps`, :func:`gait_epochs`
  (:mod:`~flyarchive.analyze.gait`): distance, speed, heading, height, step frequency, duty
  factor, phases, tripod coordination and support patterns per world, one row per step,
  every stance and swing interval; from archives, positions or ``movement`` poses datasets;
  stance, swing and their events from the tips (:mod:`~flyarchive.analyze.steps`); positions
  computed into memory by this process and worker processes
  (:mod:`~flyarchive.analyze.cpu_processes`) on the CPU.

Imports only the stages before it (store, query) and the base modules.
"""

from flyarchive.analyze.gait import (
    GaitParams,
    gait_epochs,
    gait_points,
    gait_positions,
    gait_steps,
    gait_summary,
)
from flyarchive.analyze.keep import keep_positions, open_positions
from flyarchive.analyze.keypoints import keypoint_labels, select_keypoints, tarsus_tips
from flyarchive.analyze.lazy import positions
from flyarchive.analyze.warp_stream import StreamStats, load_positions


"""Replay recorded kinematic state: position-only kinematics, then rasterize.

- :mod:`~flyarchive.replay.kinematics`: recorded state into an ``MjData``;
- :mod:`~flyarchive.replay.opengl`: :class:`OpenGLRenderer`, ``mujoco.Renderer`` on EGL
  (backend ``"cpu"``, bit-exact with frames rendered live);
- :mod:`~flyarchive.replay.warp` (with :mod:`~flyarchive.replay.warp_kernels`,
  :mod:`~flyarchive.replay.warp_compose`, :mod:`~flyarchive.replay.warp_rows` and
  :mod:`~flyarchive.replay.warp_model`): :class:`WarpBatchRenderer`, mujoco-warp's
  batch ray tracer on CUDA (``"gpu"``) or Warp's CPU device (``"warp-cpu"``);
- :mod:`~flyarchive.replay.outputs`: depth and segmentation besides RGB, and their
  16-bit counts;
- :mod:`~flyarchive.replay.compose` (with :mod:`~flyarchive.replay.font`): text burnt into
  frames, tiles joined into mosaics, on the host;
- :mod:`~flyarchive.replay.sizes`: frame sizes, pixel formats and shapes.

Nothing here is imported by ``import flyarchive`` but these names.
"""

#: Render backends, as ``RenderOptions(backend=...)`` and ``flyarchive render --backend``
#: take them: OpenGL (``"cpu"``), mujoco-warp on CUDA (``"gpu"``) or on Warp's CPU device.
BACKENDS = ("cpu", "gpu", "warp-cpu")
#: The backends that render with mujoco-warp.
WARP_BACKENDS = ("gpu", "warp-cpu")

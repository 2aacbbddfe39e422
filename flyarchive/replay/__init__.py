"""Replay: the renderers, which draw frames from recorded states (position-only kinematics,
then rasterize). States in, frames (and depth and segmentation maps) out, in memory; the
pipelines that read an archive, run these renderers and write videos are
:mod:`flyarchive.render`'s.

- :mod:`~flyarchive.replay.kinematics`: recorded state into an ``MjData``;
- :mod:`~flyarchive.replay.opengl_frames`: :class:`OpenGLRenderer`, ``mujoco.Renderer`` on EGL
  (backend ``"opengl"``, bit-exact with frames rendered live);
- :mod:`~flyarchive.replay.warp_frames` (with :mod:`~flyarchive.replay.warp_kernels`,
  :mod:`~flyarchive.replay.warp_compose`, :mod:`~flyarchive.replay.warp_rows` and
  :mod:`~flyarchive.replay.warp_model`): :class:`WarpBatchRenderer`, mujoco-warp's
  batch ray tracer on CUDA (``"gpu"``) or Warp's CPU device (``"warp-cpu"``);
- :mod:`~flyarchive.replay.output_kinds`: what a renderer makes besides RGB (depth and
  segmentation), and their 16-bit counts;
- :mod:`~flyarchive.replay.overlay_text`: text burnt into frames: what overlays say, the
  font, and the burning on the host and on the Warp device;
- :mod:`~flyarchive.replay.mosaic_tiles`: tiles joined into one mosaic frame on the host;
- :mod:`~flyarchive.replay.sizes`: frame sizes, pixel formats and shapes;
- :mod:`~flyarchive.replay.releases`: the visual defaults of the MuJoCo release that
  recorded an archive (MuJoCo 4's ``"auto"`` headlight), pinned for replay.

Nothing here is imported by ``import flyarchive`` but these names.
"""

#: Render backends, as ``RenderOptions(backend=...)`` and ``flyarchive render --backend``
#: take them: OpenGL (``"opengl"``: mujoco.Renderer, bit-exact), mujoco-warp on CUDA
#: (``"gpu"``) or on Warp's CPU device (``"warp-cpu"``).
BACKENDS = ("opengl", "gpu", "warp-cpu")
#: The backends that render with mujoco-warp.
WARP_BACKENDS = ("gpu", "warp-cpu")
#: Old names of backends, still accepted with a DeprecationWarning: old -> new.
OLD_BACKENDS = {"cpu": "opengl"}


def backend_name(backend: str) -> str:
    """``backend`` by its current name: ``"cpu"`` (the OpenGL backend's old name) is
    ``"opengl"``, with a :class:`DeprecationWarning`; any other value is returned as it is
    (checked by its user)."""
    if isinstance(backend, str) and backend in OLD_BACKENDS:
        import warnings

        new = OLD_BACKENDS[backend]
        warnings.warn(f"backend={backend!r} is called {new!r} now (it renders with OpenGL); "
                      f"{backend!r} will be removed.", DeprecationWarning, stacklevel=3)
        return new
    return backend

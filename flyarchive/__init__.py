"""flyarchive: record MuJoCo kinematic state into xarray/zarr archives, render video later.

The public API (every name in ``__all__``: what the README uses, and more) is
re-exported here. Heavy optional parts (rendering, mujoco-warp, Dask) load on first use:
``import flyarchive`` imports only the error classes, and each other name loads its
module when it is first used (so ``flyarchive --help`` and commands that need no xarray
start at once).

Public modules (they declare ``__all__``; everything else is internal, reached through
the names re-exported here): this package, :mod:`flyarchive.errors`,
:mod:`flyarchive.config` (the ``FLYARCHIVE_*`` environment variables),
:mod:`flyarchive.models` (models: files, bytes, kept forms), :mod:`flyarchive.testing` (test
support, as ``zarr.testing``) and the bridges of :mod:`flyarchive.interop` that users
call by module.

The stages, in the order of the data flow (each imports only those before it;
tests/test_layout_rules.py checks it):

- base: :mod:`flyarchive.errors` (every exception), :mod:`flyarchive.config`,
  :mod:`flyarchive.schema` (schema v1, validation), :mod:`flyarchive.layout` (a model's
  qpos/mocap layout and fingerprint), :mod:`flyarchive.clock` (when a frame is due),
  :mod:`flyarchive.codecs` (the state arrays' codec pipelines), :mod:`flyarchive.models`
  (the one home of models: files, MJB, the portable form, the child-process check, the
  cache of loaded models; its modules that read archives are of the store's floor, the one
  that ships models to Dask workers of the analysis's),
  :mod:`flyarchive.warp_log` (Warp imported quietly, kernels compiled once),
  :mod:`flyarchive.lru` (what a process keeps between calls: a small bounded cache),
  :mod:`flyarchive.zarr_internals` (the only module that touches zarr's internals);
  :mod:`flyarchive.archive_spec` (what is fixed when an archive is created, and a block of
  frames to commit: what a recorder hands to the store, checked before anything is written);
- :mod:`flyarchive.record`: recorders sample state when a frame is due (bound to the
  store by :mod:`flyarchive.recorders`);
- :mod:`flyarchive.store`: the code that opens, writes and commits zarr archives;
- :mod:`flyarchive.query`: archives as lazy, validated xarray Datasets; selections;
- :mod:`flyarchive.analyze`: forward kinematics of keypoints, gait measures;
- :mod:`flyarchive.replay`: the renderers: states in, frames out (position-only kinematics,
  then OpenGL or Warp), overlay text;
- :mod:`flyarchive.video`: frames to mp4 and lossless maps, manifests, output folders;
- :mod:`flyarchive.render`: the pipelines: how one process turns an archive into videos with
  the renderers;
- :mod:`flyarchive.distribute`: where render work runs (this process, Dask, GPUs);
- applications: :mod:`flyarchive.cli` (the ``flyarchive`` command),
  :mod:`flyarchive.recorders` (the public recorders bound to the store, and recordings
  read back), :mod:`flyarchive.demo`, :mod:`flyarchive.plot`, :mod:`flyarchive.summary`
  (``flyarchive info``), :mod:`flyarchive.view` (the web viewer), :mod:`flyarchive.interop`
  (flygym, movement, NWB).

:mod:`flyarchive.testing` is test support; no product module imports it.
"""

from __future__ import annotations

import importlib
from typing import Any

from flyarchive.errors import *  # noqa: F403
from flyarchive.errors import __all__ as _errors_all

__version__ = "0.1.0"

_LAZY = {
    "FrameClock": "flyarchive.clock",
    "Timing": "flyarchive.clock",
    "ModelLayout": "flyarchive.layout",
    "check_compatible": "flyarchive.layout",
    "open_archive": "flyarchive.query",
    "select_frames": "flyarchive.query",
    "VideoJob": "flyarchive.query",
    "dof_labels": "flyarchive.query.dofs",
    "select_dofs": "flyarchive.query.dofs",
    "TrajectoryRecorder": "flyarchive.recorders.trajectory_recorder",
    "SCHEMA_VERSION": "flyarchive.schema",
    "validate": "flyarchive.schema",
    "WarpTrajectoryRecorder": "flyarchive.recorders.warp_trajectory_recorder",
    "render_videos": "flyarchive.distribute.api",
    "render_frames": "flyarchive.distribute.frames",
    "RenderOptions": "flyarchive.render.options",
    "RenderResult": "flyarchive.distribute.api",
    "default_video_options": "flyarchive.render.options",
    "PipelineProfile": "flyarchive.render.diagnostics",
    "OpenGLRenderer": "flyarchive.replay.opengl_frames",
    "WarpBatchRenderer": "flyarchive.replay.warp_frames",
    "VideoOptions": "flyarchive.video.mp4",
    "read_video": "flyarchive.video.decode",
    "read_depth": "flyarchive.video.decode",
    "read_segmentation": "flyarchive.video.decode",
    "import_npz": "flyarchive.interop.flygym_npz",
    "export_npz": "flyarchive.interop.flygym_npz",
    "verify": "flyarchive.store.integrity",
    "VerifyReport": "flyarchive.store.integrity",
    "load_kept_model": "flyarchive.models.kept",
    "load_model_file": "flyarchive.models.files",
    "attach_model": "flyarchive.models.kept",
    "save_mjb": "flyarchive.models.mjb",
    "set_trajectory_recorder": "flyarchive.interop.flygym_sim",
    "read_trajectories": "flyarchive.recorders.trajectories",
    "add_world_vars": "flyarchive.store.world_vars",
    "positions": "flyarchive.analyze",
    "load_positions": "flyarchive.analyze",
    "keep_positions": "flyarchive.analyze",
    "open_positions": "flyarchive.analyze",
    "gait_summary": "flyarchive.analyze",
    "gait_steps": "flyarchive.analyze",
    "gait_epochs": "flyarchive.analyze",
    "gait_positions": "flyarchive.analyze",
    "gait_points": "flyarchive.analyze",
    "GaitParams": "flyarchive.analyze",
    "select_keypoints": "flyarchive.analyze",
    "keypoint_labels": "flyarchive.analyze",
    "tarsus_tips": "flyarchive.analyze",
    "to_movement": "flyarchive.interop.poses",
    "export_poses": "flyarchive.interop.poses",
}

__all__ = [*_errors_all, *_LAZY]


#: Old names, kept working with a DeprecationWarning: old name -> (what it is now, its
#: module, since, the warning's words).
_DEPRECATED = {
    "CpuRenderer": ("OpenGLRenderer", "flyarchive.replay.opengl_frames", "0.2",
                    "flyarchive.CpuRenderer is flyarchive.OpenGLRenderer since flyarchive 0.2 "
                    "(it is the OpenGL renderer)"),
    "load_model": ("load_archive_or_file", "flyarchive.models.kept", "0.2",
                   "flyarchive.load_model is two functions since flyarchive 0.2, named for the "
                   "trust they give: flyarchive.load_kept_model(url) for the model an archive "
                   "keeps (checked in a child process first), flyarchive.load_model_file(path) "
                   "for a model file you trust"),
}


def __getattr__(name: str) -> Any:
    if name in _DEPRECATED:
        new, module, _, words = _DEPRECATED[name]
        import warnings

        warnings.warn(f"{words}; {name} will be removed.", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(module), new)
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # looked up once
        return value
    raise AttributeError(f"module 'flyarchive' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

"""Warp, imported for flyarchive: the missing-package error, and its console messages
silent unless asked for.

Warp prints a greeting when it initializes (version, devices, kernel cache) and one
line per module it loads; on a machine without a CUDA driver its native code also
prints a warning. flyarchive silences them unless the environment variable
``FLYARCHIVE_VERBOSE`` is on (:func:`flyarchive.config.verbose`; ``flyarchive render
--verbose`` sets it), so that processes started later (Dask workers on this machine)
follow the same setting. Every module imports warp and mujoco_warp through
:func:`import_warp` and :func:`import_mujoco_warp`, which configure it.

A user who chose a Warp log level is left alone: only Warp's default level
(``LOG_INFO``) is raised to ``LOG_WARNING``.
"""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile
from typing import Any

from flyarchive.config import verbose
from flyarchive.errors import missing_dependency

__all__ = ["import_warp", "import_mujoco_warp", "configure_warp"]

_CUDA_WARNING = "Warp CUDA warning: Could not find or load the NVIDIA CUDA driver"


def import_warp(what: str) -> Any:
    """The ``warp`` module, configured (:func:`configure_warp`).

    Args:
        what: What needs it, for the error.

    Raises:
        MissingDependencyError: warp is not installed (names the ``gpu`` extra).
    """
    try:
        import warp
    except ImportError as err:
        raise missing_dependency("warp-lang", "gpu", what, cause=err) from None
    configure_warp(warp)
    return warp


def import_mujoco_warp(what: str) -> Any:
    """The ``mujoco_warp`` module, with ``warp`` configured first.

    Raises:
        MissingDependencyError: mujoco-warp or warp is not installed (names the ``gpu`` extra).
    """
    import_warp(what)
    try:
        import mujoco_warp
    except ImportError as err:
        raise missing_dependency("mujoco-warp", "gpu", what, cause=err) from None
    return mujoco_warp


def configure_warp(wp: Any) -> None:
    """Apply the setting to an imported ``warp`` module (before it initializes).

    Quiet: Warp's log level goes from its default ``LOG_INFO`` to ``LOG_WARNING``
    (no greeting, no "Module ... load" lines); on a machine without a CUDA driver,
    Warp is initialized now with its native "could not load the CUDA driver" line
    held back (any other output of that moment is passed on). Verbose: ``LOG_INFO``.
    """
    config = wp.config
    if verbose():
        if getattr(config, "log_level", None) is not None and config.log_level > wp.LOG_INFO:
            config.log_level = wp.LOG_INFO
        return
    if hasattr(config, "log_level"):
        if config.log_level == wp.LOG_INFO:
            config.log_level = wp.LOG_WARNING
    else:  # older Warp
        config.quiet = True
    if not _cuda_driver_loadable() and not _initialized(wp):
        _init_without_cuda_warning(wp)


def _cuda_driver_loadable() -> bool:
    """Whether Warp will find a CUDA driver (it dlopens the same names)."""
    for name in ("libcuda.so", "libcuda.so.1"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    return sys.platform not in ("linux",)  # elsewhere: do not interfere


def _initialized(wp: Any) -> bool:
    runtime = getattr(getattr(wp, "_src", None), "context", None)
    return getattr(runtime, "runtime", None) is not None


def _init_without_cuda_warning(wp: Any) -> None:
    """``wp.init()`` with file descriptor 2 captured; lines other than the CUDA-driver
    warning are written back to stderr."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            wp.init()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            rest = [line for line in capture.read().decode(errors="replace").splitlines(True)
                    if not line.startswith(_CUDA_WARNING)]
    if rest:
        sys.stderr.write("".join(rest))

"""Warp, imported for flyarchive: the missing-package error, its console messages silent
unless asked for, and kernels compiled once per machine.

Warp prints a greeting when it initializes (version, devices, kernel cache) and one
line per module it loads; on a machine without a CUDA driver its native code also
prints a warning. flyarchive silences them unless the environment variable
``FLYARCHIVE_VERBOSE`` is on (:func:`flyarchive.config.verbose`; ``flyarchive render
--verbose`` sets it), so that processes started later (Dask workers on this machine)
follow the same setting. Every module imports warp and mujoco_warp through
:func:`import_warp` and :func:`import_mujoco_warp`, which configure it.

A user who chose a Warp log level is left alone: only Warp's default level
(``LOG_INFO``) is raised to ``LOG_WARNING``.

Kernels compile once per machine, not once per process: Warp compiles a module that
is not in its kernel cache in every process that needs it, at the same time (two
Warp-CPU workers each spent 22-25 s compiling mujoco-warp's render kernel, side by
side). :func:`configure_warp` puts a file lock around Warp's compile step, one per
module, in ``{kernel cache}/flyarchive-locks/``: the first process compiles, the others
wait for it and then load the module from the cache. A process that dies releases its
lock. Without ``fcntl`` (Windows) nothing is locked.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from flyarchive.config import verbose, warp_optimization
from flyarchive.errors import missing_dependency

#: Folder of the kernel cache that holds the compile locks (one file per module).
LOCK_FOLDER = "flyarchive-locks"

#: Held while file descriptor 2 is captured (Warp initializing on a machine without a
#: CUDA driver, often in a background thread: :mod:`flyarchive.distribute.warm`). A
#: thread whose stderr line must not be lost in that capture (the command line's error)
#: writes it holding this lock.
STDERR_LOCK = threading.Lock()

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
    _warn_of_another_line(mujoco_warp)
    return mujoco_warp


@functools.cache
def _warn_of_another_line(mujoco_warp: Any) -> None:
    """Warn, once per process, when mujoco-warp is of another line than MuJoCo.

    mujoco-warp is made for the MuJoCo of its own release (4.0 for 4.0, 3.16 for 3.16) but
    declares only ``mujoco>=3.13``, so pip pairs flygym's MuJoCo 3.16 with mujoco-warp 4.0
    unless told otherwise."""
    import importlib.metadata

    import mujoco

    try:
        warp_version = importlib.metadata.version("mujoco-warp")
    except importlib.metadata.PackageNotFoundError:  # a source checkout on the path
        return
    line, warp_line = mujoco.__version__.split(".")[:2], warp_version.split(".")[:2]
    if line != warp_line:
        import warnings

        wanted = ".".join(line)
        warnings.warn(
            f"mujoco-warp {warp_version} is made for MuJoCo {'.'.join(warp_line)}, and this "
            f"environment has MuJoCo {mujoco.__version__}: install the mujoco-warp of MuJoCo's "
            f"line (pip install 'mujoco-warp=={wanted}.*'; with flygym, pip install "
            "'flyarchive[all]' or 'flygym[warp]' keeps them together).", stacklevel=3)


def configure_warp(wp: Any) -> None:
    """Apply the setting to an imported ``warp`` module (before it initializes).

    Quiet: Warp's log level goes from its default ``LOG_INFO`` to ``LOG_WARNING``
    (no greeting, no "Module ... load" lines); on a machine without a CUDA driver,
    Warp is initialized now with its native "could not load the CUDA driver" line
    held back (any other output of that moment is passed on). Verbose: ``LOG_INFO``.
    Either way, kernel compilation is serialized across processes (see the module doc),
    and ``FLYARCHIVE_WARP_OPTIMIZATION`` sets the compiler's optimization level
    (:func:`set_optimization`).
    """
    config = wp.config
    _lock_compilation(wp)
    set_optimization(config)
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


def set_optimization(config: Any) -> None:
    """Give Warp's ``config`` the level of ``FLYARCHIVE_WARP_OPTIMIZATION`` when it is set
    and the program left ``config.optimization_level`` at Warp's default (None).

    Raises:
        ConfigError: the variable is not a whole number from 0 to 3.
    """
    level = warp_optimization()
    if level is not None and getattr(config, "optimization_level", 0) is None:
        config.optimization_level = level


def no_cuda(wp: Any, instead: str) -> str | None:
    """Why ``backend='gpu'`` cannot run here (Warp sees no CUDA device), as the sentence of
    an error that suggests ``instead``; None when it can."""
    wp.init()
    if wp.get_cuda_device_count() >= 1:
        return None
    return ("backend='gpu' needs a CUDA device, and Warp sees none on this machine "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}). Pass {instead}.")


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
    """``wp.init()`` with file descriptor 2 captured (holding :data:`STDERR_LOCK`); lines
    other than the CUDA-driver warning are written back to stderr."""
    with STDERR_LOCK:
        _capture_init(wp)


def _capture_init(wp: Any) -> None:
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


def _lock_compilation(wp: Any) -> None:
    """Wrap Warp's ``Module._compile`` (once) so that one process at a time compiles a module.

    ``Module._compile(device, output_dir, ...)`` returns at once when the module's binary
    is in the cache; otherwise it generates and compiles it into ``output_dir``. Under
    the lock of ``output_dir``, a process that waited finds the binary that the other one
    made. Left alone when Warp has no such method (another Warp version) or no ``fcntl``.
    """
    try:
        import fcntl  # noqa: F401  (POSIX only)

        module_class = wp._src.context.Module
    except (ImportError, AttributeError):
        return
    compile_ = getattr(module_class, "_compile", None)
    if compile_ is None or getattr(compile_, "_flyarchive_locked", False):
        return
    module_class._compile = _locked(compile_, wp)


def _locked(compile_: Callable[..., bool], wp: Any) -> Callable[..., bool]:
    @functools.wraps(compile_)
    def _compile(self: Any, device: Any = None, output_dir: Any = None, *args: Any,
                 **kwargs: Any) -> bool:
        if output_dir is None:  # ahead-of-time builds: Warp picks the folder itself
            return compile_(self, device, output_dir, *args, **kwargs)
        with _compile_lock(os.fspath(output_dir), wp, getattr(self, "name", "?")):
            return compile_(self, device, output_dir, *args, **kwargs)

    _compile._flyarchive_locked = True  # type: ignore[attr-defined]
    return _compile


class _compile_lock:
    """Exclusive ``flock`` on ``{kernel cache}/flyarchive-locks/{module folder}.lock``
    (beside ``output_dir`` when that is outside the kernel cache) for the block."""

    def __init__(self, output_dir: str, wp: Any, module: str) -> None:
        cache = os.path.realpath(str(getattr(wp.config, "kernel_cache_dir", None) or ""))
        name = os.path.basename(os.path.normpath(output_dir))
        inside = bool(cache) and os.path.dirname(os.path.realpath(output_dir)) == cache
        folder = os.path.join(cache, LOCK_FOLDER) if inside else os.path.dirname(output_dir)
        self.path = os.path.join(folder, f"{name}.lock")
        self.module = module
        self.fd: int | None = None

    def __enter__(self) -> None:
        import fcntl

        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:  # a read-only cache: compile unlocked, as Warp alone would
            return
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            start = time.perf_counter()
            if verbose():
                sys.stderr.write(f"Warp module {self.module}: waiting for another process "
                                 f"compiling it (lock {self.path})\n")
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            if verbose():
                sys.stderr.write(f"Warp module {self.module}: waited "
                                 f"{time.perf_counter() - start:.1f} s\n")

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)  # releases the lock
            self.fd = None

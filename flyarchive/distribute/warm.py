"""Warp started early: importing the Warp renderer (warp, mujoco_warp) and creating the
CUDA context take seconds of a render's start, and the CUDA part runs without the GIL.

:func:`warm_up_here` starts that work in a background thread as soon as it is known
that this process will render on a Warp device: the command line calls it right after
parsing its arguments, before it imports xarray and zarr; :func:`render_videos` calls
it again (a no-op while the first thread lives) before opening the archive. The render
waits for the thread (:func:`wait_for_warm_up`) so Warp is never imported and
initialized by two threads at once. Dask GPU workers start :func:`warm_warp` as they
start (:mod:`flyarchive.distribute.worker_setup`).

This module imports nothing heavy (no mujoco, numpy, xarray or Warp).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

__all__ = ["warm_up_here", "wait_for_warm_up", "warm_warp"]

#: The thread importing Warp and initializing the device, if any.
_warming: threading.Thread | None = None
_lock = threading.Lock()


def warm_warp(device: str) -> None:
    """Import the Warp renderer (warp, mujoco_warp) and initialize ``device`` (a CUDA
    context), ignoring failures: the render that follows reports them."""
    try:
        from flyarchive.replay import warp  # noqa: F401  (the import is the work)

        wp = warp.wp
        wp.init()
        if device.startswith("cuda") and wp.get_cuda_device_count() > 0:
            wp.get_device(device).context  # noqa: B018  (creates the primary context)
    except Exception:
        pass


def warm_up_here(backend: str, *, gpus: Sequence[int] | None, n_workers: int | None,
                 on_cluster: bool) -> None:
    """When this process will render on a Warp device (one GPU, or Warp's CPU device
    unless ``n_workers`` asks for worker processes), start importing Warp and
    initializing the device in a background thread, unless one is already at it.
    Nothing otherwise (a cluster renders). Arguments as :func:`render_videos`'s."""
    global _warming
    device = _device_here(backend, gpus=gpus, n_workers=n_workers, on_cluster=on_cluster)
    if device is None:
        return
    with _lock:
        if _warming is not None:
            return
        _warming = threading.Thread(target=warm_warp, args=(device,), name="flyarchive-warm",
                                    daemon=True)
        _warming.start()


def wait_for_warm_up() -> None:
    """Wait until the thread started by :func:`warm_up_here` (if any) has finished."""
    global _warming
    with _lock:
        warming, _warming = _warming, None
    if warming is not None:
        warming.join()


def _device_here(backend: str, *, gpus: Sequence[int] | None, n_workers: int | None,
                 on_cluster: bool) -> str | None:
    """The Warp device this process renders on, or None when it does not render."""
    if on_cluster or backend not in ("gpu", "warp-cpu"):
        return None
    if backend == "gpu":
        from flyarchive.distribute.gpus import visible_gpus

        if not (n_workers == 0 or (gpus is not None and len(gpus) == 1)
                or len(visible_gpus()) == 1):
            return None
        return f"cuda:{gpus[0] if gpus else 0}"
    if n_workers is None or n_workers <= 1 or (os.cpu_count() or 1) <= 1:
        return "cpu"  # render threads in this process, or one
    return None

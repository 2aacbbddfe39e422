"""Warp started early: importing the Warp renderer (warp, mujoco_warp) and creating the
CUDA context take seconds of a render's start, beside the seconds of opening the
archive (on S3: waiting for the network) and preparing the model.

:func:`render_videos` calls :func:`warm_up_here` before it opens the archive: once it
is known that this process renders on a Warp device, that work starts in a background
thread (a no-op while one lives). The render waits for the thread
(:func:`wait_for_warm_up`) so Warp is never imported and initialized by two threads at
once. Dask GPU workers start it as they start (:func:`start_warm_up`, from
:mod:`flyarchive.distribute.worker_setup`).

Started earlier, beside the command line's own imports of xarray and zarr, it gained
nothing: both are Python work under one GIL, and the CUDA context takes 0.34 s (1×
H200: ``flyarchive render --backend gpu``, 1024 worlds × 250 frames, in-process
``main``: 28.3 s started early against 27.5 s started at ``render_videos``, median of 3;
2-core VM, warp-cpu: 12.25 s against 12.46 s, within noise).

This module imports nothing heavy (no mujoco, numpy, xarray or Warp).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

#: The thread importing Warp and initializing the device, if any.
_warming: threading.Thread | None = None
_lock = threading.Lock()


def warm_warp(device: str) -> None:
    """Import the Warp renderer (warp, mujoco_warp) and initialize ``device`` (a CUDA
    context), ignoring failures: the render that follows reports them."""
    try:
        from flyarchive.replay import warp_frames  # noqa: F401  (the import is the work)

        wp = warp_frames.wp
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
    device = _device_here(backend, gpus=gpus, n_workers=n_workers, on_cluster=on_cluster)
    if device is not None:
        start_warm_up(device)


def start_warm_up(device: str) -> None:
    """:func:`warm_warp` of ``device`` in a background thread, unless one is already at it."""
    global _warming
    with _lock:
        if _warming is None:
            _warming = threading.Thread(target=warm_warp, args=(device,),
                                        name="flyarchive-warm", daemon=True)
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

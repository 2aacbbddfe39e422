"""Dask worker preload for the LocalClusters flyarchive starts (``preload=[__name__]``).

Worker processes share the client's terminal process group, so a Ctrl-C reaches them
too: each would print a ``KeyboardInterrupt`` traceback and die while the client shuts
the cluster down. The client alone handles Ctrl-C; its workers ignore SIGINT.

A worker given cores of its own (``FLYARCHIVE_CPUS``, set per GPU worker by
:mod:`flyarchive.distribute.gpus`) pins itself to them. A worker that offers the resource
``GPU`` starts importing the Warp renderer and initializing CUDA in a background thread
as it starts, so that this overlaps with the other workers' start and the client's
work; the first task waits for that import instead of doing it.

A worker process that imported the Warp renderer took 1.2-1.4 s to exit (2-core VM):
the interpreter's final garbage collections walk the large graph of objects that
importing mujoco_warp makes. The cluster's close waits for that, at the end of every
render on a local cluster; the objects are frozen out of the collector at exit
(:func:`gc.freeze`, as the ``flyarchive`` command does).
"""

from __future__ import annotations

import atexit
import gc
import signal
import threading
from typing import Any

from flyarchive import config


def dask_setup(worker: Any) -> None:
    """Ignore SIGINT, pin to ``FLYARCHIVE_CPUS``, start warming Warp on GPU workers
    (called by Dask as the worker starts); freeze the garbage collector's objects at exit."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    atexit.register(gc.freeze)  # runs last (registered first), before the final collections
    cpus = config.cpus()
    if cpus:
        from flyarchive.distribute.gpus import pin_process

        pin_process(cpus)
    if _offers(worker, "GPU"):
        from flyarchive.distribute.warm import start_warm_up

        start_warm_up("cuda")


def _offers(worker: Any, resource: str) -> bool:
    state = getattr(worker, "state", None)
    resources = getattr(state, "total_resources", None) or getattr(worker, "total_resources", {})
    return bool((resources or {}).get(resource))


def warm_worker(device: str, dask_worker: Any = None) -> None:
    """Start importing the Warp renderer and initializing ``device`` on this worker, in a
    background thread (``client.run(warm_worker, device)``: Dask passes ``dask_worker``):
    on ``"cuda"`` only a worker that offers the resource ``GPU``."""
    if device == "cpu" or _offers(dask_worker, "GPU"):
        from flyarchive.distribute.warm import start_warm_up

        start_warm_up(device)

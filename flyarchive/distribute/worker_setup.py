"""Dask worker preload for the LocalClusters flyarchive starts (``preload=[__name__]``).

Worker processes share the client's terminal process group, so a Ctrl-C reaches them
too: each would print a ``KeyboardInterrupt`` traceback and die while the client shuts
the cluster down. The client alone handles Ctrl-C; its workers ignore SIGINT.
"""

from __future__ import annotations

import signal
import threading
from typing import Any


def dask_setup(worker: Any) -> None:
    """Ignore SIGINT in this worker process (called by Dask as the worker starts)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)

"""Writing while the interpreter exits: zarr's and fsspec's event loops made to run
blocking calls inline, once Python refuses to start threads.

Used to commit the frames of recorders nobody closed (:mod:`flyarchive.record.common`).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class _InlineExecutor(ThreadPoolExecutor):
    """Runs each task at once, in the thread that submits it."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as err:
            future.set_exception(err)
        return future


def write_without_new_threads() -> None:
    """Let zarr's and fsspec's event loops do blocking I/O without starting threads.

    Once Python exits it refuses new threads (3.12), and ``asyncio.to_thread``, through
    which zarr writes local files (and aiohttp resolves names for s3fs), starts one
    whenever its pool has no idle thread. Their loops run such calls inline from here on.
    """
    from flyarchive.zarr_internals import sync

    async def install() -> None:
        asyncio.get_running_loop().set_default_executor(_InlineExecutor(max_workers=1))

    sync(install())
    fsspec_asyn = sys.modules.get("fsspec.asyn")
    fsspec_loop = getattr(fsspec_asyn, "loop", [None])[0]
    if fsspec_loop is not None and fsspec_loop.is_running():
        fsspec_asyn.sync(fsspec_loop, install)  # type: ignore[union-attr]

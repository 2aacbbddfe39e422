"""Render threads of this process, run together and stopped together (:func:`run_threads`):
those sharing Warp's CPU device (:func:`flyarchive.render.warp_pipeline.render_threads`).
(OpenGL renders in worker processes instead: render threads with a GL context each did not
scale, see :func:`flyarchive.distribute.placement.placement`.)

The threads are waited for on events of their own, not with ``Thread.join``: a join
that Ctrl-C interrupts marks its thread finished although it still runs (CPython 3.12,
``Thread._wait_for_tstate_lock``), and a render that returned then would leave its threads
writing into a closed run.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Sequence

from flyarchive.errors import RenderFailedError


def run_threads(work: Sequence[Callable[[], None]], stop: threading.Event,
                name: str = "flyarchive-render") -> None:
    """Run each of ``work`` on a thread of its own (named ``{name}-{i}``, in this context:
    :mod:`contextvars`), and return when all have returned.

    A failure sets ``stop``, which the others check at their next step (a frame, a
    batch) and then end, raising :class:`~flyarchive.errors.RenderFailedError`; the
    first error that is not that one is raised here. Ctrl-C (KeyboardInterrupt) or
    SIGTERM (:class:`~flyarchive.errors.Terminated`) in this thread sets ``stop`` too,
    waits for the threads to end, and is raised.

    Args:
        work: What each thread runs.
        stop: Set on the first failure or interruption; ``work`` checks it.
        name: The threads' name prefix.
    """
    failed: list[BaseException] = []
    ended = [threading.Event() for _ in work]

    def run(i: int) -> None:
        try:
            work[i]()
        except BaseException as err:
            failed.append(err)
            stop.set()
        finally:
            ended[i].set()

    threads = [threading.Thread(target=contextvars.copy_context().run, args=(run, i),
                                name=f"{name}-{i}", daemon=True) for i in range(len(work))]
    try:
        for thread in threads:
            thread.start()
        for event in ended:
            event.wait()
    except BaseException as err:  # Ctrl-C, SIGTERM: the threads stop at their next step
        failed.insert(0, err)
        stop.set()
        for thread, event in zip(threads, ended):
            if thread.ident is not None:  # started
                event.wait()
    if failed:
        raise next((e for e in failed if not isinstance(e, RenderFailedError)), failed[0])

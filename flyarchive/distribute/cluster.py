"""Dask clusters for rendering: the caller's client, a scheduler's, or a LocalCluster.

A LocalCluster started here renders quietly and stops cleanly: its scheduler serves
HTTP on a free loopback port (never Dask's fixed 8787, which warns when taken), its
worker processes ignore Ctrl-C (this process handles it and closes the cluster), and
their scratch folders are removed when it closes.

Two kinds are started here: one worker process per core (the OpenGL backend), or one
per GPU (backend ``"gpu"``, as dask-cuda's ``LocalCUDACluster`` does): each with its GPU
alone (``CUDA_VISIBLE_DEVICES``), the resource ``GPU=1``, its own cores and as many x264
encoders (:mod:`flyarchive.distribute.gpus`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

from flyarchive.config import gl_backend, worker_environment
from flyarchive.errors import (
    FlyarchiveError,
    RenderBackendError,
    RenderFailedError,
    missing_dependency,
)
from flyarchive.video.workspace import SCRATCH_PREFIX, sweep_local

log = logging.getLogger(__name__)

#: Where a LocalCluster's scheduler serves HTTP: a free port on loopback. A fixed port
#: (Dask's default 8787) warns "Port 8787 is already in use" whenever another cluster
#: or dashboard runs; ``None`` does not help, it falls back to 8787.
LOCAL_DASHBOARD = "127.0.0.1:0"


class connect:
    """Context manager: the given client, one connected to ``scheduler``, or a LocalCluster.

    The LocalCluster has ``n_workers`` (default: one per core) single-thread worker
    processes, each pinned to one core's worth of threads
    (:func:`flyarchive.config.worker_environment`), or, with ``gpu_workers``, one
    single-thread worker process per GPU (:class:`flyarchive.distribute.gpus.GpuWorker`:
    its GPU, resource ``GPU=1``, its cores); its
    scheduler serves HTTP on a free loopback port (:data:`LOCAL_DASHBOARD`), never on a
    fixed one. Clients and clusters it made are closed on exit; a given client is left
    open. A local cluster's workers have joined when it enters (``wait=False``: the
    caller waits, :func:`wait_for_local_workers`, doing other work meanwhile).

    Ctrl-C reaches every process of the terminal's process group, worker processes
    included, and each would print a traceback. The worker processes are started while
    this process ignores SIGINT, so they inherit it ignored (the disposition survives
    ``exec``; a signal mask does not: subprocesses start with none blocked); workers
    restarted later ignore it once they run (:mod:`flyarchive.distribute.worker_setup`). This
    process alone handles Ctrl-C, and closes the cluster. Worker logs are silenced below
    CRITICAL: a task's error comes back to this process, and a worker shut down with its
    cluster would log the lost connection.
    """

    def __init__(self, client: Any = None, scheduler: str | None = None,
                 n_workers: int | None = None, *, gpu_workers: list[Any] | None = None,
                 wait: bool = True) -> None:
        self._given, self._scheduler, self._n = client, scheduler, n_workers
        self._gpu_workers, self._wait = gpu_workers, wait
        self._own: list[Any] = []

    def __enter__(self) -> Any:
        if self._given is not None:
            if self._wait:
                wait_for_local_workers(self._given)
            return self._given
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise missing_dependency("distributed", "dask", "Rendering on a Dask cluster") from None
        try:
            if self._scheduler:
                self._own.append(_client(Client, self._scheduler))
            else:
                self._own.append(_start_local(LocalCluster, self._n, self._gpu_workers))
                self._own.insert(0, Client(self._own[0]))
                if self._wait:
                    wait_for_local_workers(self._own[0])
        except BaseException as err:  # also Ctrl-C while the cluster starts
            if isinstance(err, KeyboardInterrupt):  # a Client cut off mid-way complains when
                warnings.filterwarnings(  # collected; the process is on its way out
                    "ignore", message="coroutine .* was never awaited", category=RuntimeWarning)
            self.__exit__(*sys.exc_info())
            raise
        return self._own[0]

    def __exit__(self, *exc: object) -> None:
        own_cluster = self._scheduler is None and bool(self._own)
        while self._own:
            thing = self._own.pop(0)
            try:
                thing.close()
            except Exception:  # closing after Ctrl-C can fail inside Dask: keep that error
                if not exc or exc[0] is None:
                    raise
        if own_cluster:  # its workers were stopped: remove their scratch folders
            sweep_local(tempfile.gettempdir(), SCRATCH_PREFIX)


#: Seconds a render waits for its local cluster's workers to join before it goes on with
#: those that did (a worker process that died as it started is never replaced).
WORKERS_JOIN_S = 60.0


def wait_for_local_workers(client: Any, timeout_s: float | None = None) -> None:
    """Wait until the workers that the client's own cluster asked for (a LocalCluster's
    ``worker_spec``, e.g. one of :func:`local_cluster`, still starting them) have joined,
    at most ``timeout_s`` (:data:`WORKERS_JOIN_S`); then go on with those that joined;
    nothing for a client of a scheduler elsewhere.

    Raises:
        RenderFailedError: none joined in that time.
    """
    expected = local_workers_expected(client)
    if not expected:
        return
    wait = WORKERS_JOIN_S if timeout_s is None else timeout_s
    try:
        client.wait_for_workers(expected, timeout=wait)
    except TimeoutError:
        joined = len(client.scheduler_info().get("workers", {}))
        if not joined:
            raise RenderFailedError(
                f"None of the {expected} worker processes of the local Dask cluster joined "
                f"within {wait:g} s: they died as they started (out of memory? a crash "
                "importing flyarchive? see the lines Dask printed above). Try again with "
                "fewer --workers, or --workers 0 to render in this process.") from None
        log.warning("%d of the local cluster's %d workers joined within %g s (the others "
                    "died as they started); the render goes on with them", joined, expected,
                    wait)


def local_workers_expected(client: Any) -> int:
    """How many workers the client's own cluster (a LocalCluster, on this host) asked
    for; 0 for a client of a scheduler elsewhere."""
    return len(getattr(getattr(client, "cluster", None), "worker_spec", None) or ())


def started_cold(client: Any) -> bool:
    """Whether the client's cluster is a local one that flyarchive started
    (:class:`connect`, :func:`local_cluster`) and that nothing asked this of before: its
    workers joined as soon as their processes imported Dask, and their first task still
    imports the renderer and the store and opens the archive. The answer is True once
    per cluster (a second render on it finds its workers warm)."""
    cluster = getattr(client, "cluster", None)
    if not getattr(cluster, _STARTED_HERE, False):
        return False
    setattr(cluster, _STARTED_HERE, False)
    return True


def _start_local(cls: Any, n_workers: int | None, gpu_workers: list[Any] | None) -> Any:
    if gpu_workers:
        return _local_gpu_cluster(cls, gpu_workers)
    return _local_cluster(cls, n_workers or os.cpu_count() or 1)


@contextlib.contextmanager
def local_cluster(n_workers: int | None = None, *,
                  gpu_workers: list[Any] | None = None) -> Iterator[Any]:
    """A LocalCluster started now, as :class:`connect` would start it (``n_workers``
    single-core worker processes, default one per core, or one per GPU of
    ``gpu_workers``), and a client of it, yielded without waiting for its workers; closed
    on exit. None when ``distributed`` is missing (the render that gets no client says so).

    The command line starts its cluster this way before importing xarray, zarr and the
    renderer and opening the archive, and passes the client to
    :func:`flyarchive.render_videos`, so that the worker processes start (import Dask,
    the renderer, Warp; create a CUDA context) on their own cores meanwhile instead of
    after (measured on 2 H200s: the render's first frame came 4 s later on a local
    cluster than in one process); :class:`connect` given that client waits for its
    workers (:func:`wait_for_local_workers`).
    """
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        yield None
        return
    cluster = _start_local(LocalCluster, n_workers, gpu_workers)
    try:
        with Client(cluster) as client:
            yield client
    finally:
        try:
            cluster.close()
        except Exception as err:  # noqa: BLE001 - e.g. Ctrl-C while its workers started:
            # Dask's close then fails (UnboundLocalError in its sync), and that error
            # replaced the interrupt, which is what the user is to be told
            log.info("closing the local cluster failed: %r", err)
        sweep_local(tempfile.gettempdir(), SCRATCH_PREFIX)


@contextlib.contextmanager
def scheduler_client(scheduler: str, warm: str | None = None) -> Iterator[Any]:
    """A client of ``scheduler``, connected now, whose workers start importing the Warp
    renderer and initializing ``warm`` (``"cuda"``: on the workers offering ``GPU``;
    ``"cpu"``: on every worker) without waiting for them; closed on exit. None when
    ``distributed`` is missing (the render that gets no client says so).

    Workers started by hand (``dask worker ADDRESS --resources GPU=1``) import Warp at
    their first render, after the command's own imports and the archive's opening; so
    started, they import it meanwhile, on their own cores.

    Raises:
        RenderBackendError: the scheduler cannot be reached (waited for once).
    """
    try:
        from distributed import Client
    except ImportError:
        yield None
        return
    with _client(Client, scheduler) as client:
        if warm is not None:
            from flyarchive.distribute.worker_setup import warm_worker

            with contextlib.suppress(Exception):  # the render works without it
                client.run(warm_worker, warm)  # returns at once: each starts a thread
        yield client


#: Seconds to reach a scheduler given by address, unless Dask's configuration sets
#: ``distributed.comm.timeouts.connect`` (its default, 30 s, kept a scheduler that is down
#: waiting half a minute before the error).
CONNECT_TIMEOUT_S = 10.0


def _client(cls: Any, scheduler: str) -> Any:
    """A client of ``scheduler``; one that cannot be reached is a RenderBackendError."""
    import dask

    configured = dask.config.get("distributed.comm.timeouts.connect", None)
    timeout = {} if configured not in (None, "30s", 30) else {"timeout": CONNECT_TIMEOUT_S}
    try:
        return cls(scheduler, **timeout)
    except (OSError, TimeoutError, ValueError) as err:
        raise RenderBackendError(
            f"Cannot connect to the Dask scheduler at {scheduler!r} ({type(err).__name__}: "
            f"{err}). Check the address and that the scheduler runs (`dask scheduler`, its "
            "workers started with `dask worker ADDRESS --nthreads 1 --resources GPU=1` for "
            "GPUs); without --scheduler the render starts a local cluster."
        ) from None


def _local_cluster(cls: Any, n_workers: int) -> Any:
    """A LocalCluster whose ``n_workers`` worker processes ignore SIGINT (see :class:`connect`).

    This process ignores SIGINT only until the worker processes exist (a fraction of a
    second: they import in their own time), not while the whole cluster starts.
    """
    cluster = _empty_cluster(cls, worker_environment())
    return _start_workers(cluster, lambda: cluster.scale(n_workers), n_workers)


def _local_gpu_cluster(cls: Any, workers: list[Any]) -> Any:
    """A LocalCluster of one worker process per :class:`~flyarchive.distribute.gpus.GpuWorker`,
    each with its own environment (GPU, cores, encoders) and the resource ``GPU=1``.

    The workers are Dask nannies' processes, as the LocalCluster's own, with per-worker
    options (what ``dask-cuda``'s LocalCUDACluster does); a worker that dies is started
    again by its nanny with the same environment. Each pins itself to its cores and
    imports the Warp renderer as it starts (:mod:`flyarchive.distribute.worker_setup`),
    so that the first group of videos finds it ready.
    """
    env = {"MUJOCO_GL": gl_backend()} if gl_backend() else {}
    cluster = _empty_cluster(cls, env)
    template = cluster.new_spec
    for worker in workers:
        options = {**template["options"], "name": worker.name, "resources": worker.resources,
                   "env": {**template["options"].get("env", {}), **worker.env}}
        cluster.worker_spec[worker.name] = {"cls": template["cls"], "options": options}
    return _start_workers(cluster, lambda: cluster.scale(len(workers)), len(workers))


def _empty_cluster(cls: Any, env: dict[str, str]) -> Any:
    """A LocalCluster without workers yet, quiet, on loopback, single-thread workers."""
    return cls(n_workers=0, threads_per_worker=1, processes=True,
               dashboard_address=LOCAL_DASHBOARD, scheduler_kwargs={"dashboard": False},
               env=env, silence_logs=logging.CRITICAL,
               preload=["flyarchive.distribute.worker_setup"])


def _start_workers(cluster: Any, scale: Any, n_workers: int) -> Any:
    """Start the cluster's worker processes with SIGINT ignored until they exist."""
    import psutil

    try:
        me = psutil.Process()
        before = {c.pid for c in me.children()}
        with _sigint_ignored():
            scale()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and _new_workers(me, before) < n_workers:
                time.sleep(0.01)
    except BaseException:
        cluster.close()
        raise
    setattr(cluster, _STARTED_HERE, True)
    return cluster


#: The attribute that marks a LocalCluster flyarchive started (:func:`started_cold`).
_STARTED_HERE = "flyarchive_started_cold"


def _new_workers(me: Any, before: set[int]) -> int:
    """Child processes started since ``before``, but multiprocessing's resource tracker."""
    import psutil

    count = 0
    for child in me.children():
        if child.pid in before:
            continue
        try:
            count += not any("resource_tracker" in part for part in child.cmdline())
        except psutil.Error:
            continue
    return count


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """Ignore SIGINT for the duration, so that processes started meanwhile ignore it;
    the handler is restored after. Only in the main thread (elsewhere: nothing)."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def task_result(future: Any, what: str) -> Any:
    """The result of a Dask future; a failure that is not a flyarchive error (a worker
    that died, an unexpected exception) becomes a :class:`RenderFailedError` naming
    ``what`` (e.g. ``"world 3, frames 0..99"``)."""
    try:
        return future.result()
    except FlyarchiveError:
        raise
    except Exception as err:  # KilledWorker names the last worker that ran the task
        again = ("No partial video was written under a final name, and the videos finished "
                 "before are kept: run the same command again with --resume (resume=True).")
        if "scheduler-connection-lost" in str(err):
            raise RenderFailedError(
                f"The connection to the Dask scheduler was lost while rendering {what}. {again} "
                "Start the scheduler (and its workers) again first.") from err
        if "already forgotten" in str(err):
            raise RenderFailedError(
                f"Rendering {what} was cancelled by the Dask cluster: what it needed (the "
                f"model sent to the workers) was lost with a worker that died "
                f"({type(err).__name__}: {err}). {again}") from err
        raise RenderFailedError(
            f"Rendering {what} failed on the Dask cluster ({type(err).__name__}: {err}) "
            "No partial video of it was written under its final name. Read that worker's "
            "log for the cause (memory limit, crash), then run the same command again with "
            "--resume (resume=True)."
        ) from err


def cancel_quietly(client: Any, futures: list[Any]) -> None:
    """Cancel what is left of a failed or interrupted run (best effort)."""
    try:
        client.cancel(futures)
    except Exception:
        pass

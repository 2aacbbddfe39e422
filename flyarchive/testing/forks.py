"""Many capped jobs through one child process: it imports once, then forks a grandchild per
job under an address-space limit and a timeout (:func:`run_forked`).

A Python process that imports flyarchive, xarray, Dask and zarr spends about 3 s of CPU
before it does anything; a check that runs each command on a hostile archive in a process
of its own pays that per command. Here the child (``python -m MODULE --forked``) imports
once and forks: each job still runs in an address space of its own, capped, and is killed
when it outlives its time, so a regression fails that job (a ``MemoryError``, a kill)
instead of exhausting the machine, hanging the suite or touching the next job. Used by
:mod:`flyarchive.testing.hostile` and :mod:`flyarchive.testing.ways_in`.

Nothing here is needed to record or replay.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import select
import signal
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["run_forked", "serve_forked", "FORKED"]

#: The first argument that makes a module's ``main`` serve jobs (:func:`serve_forked`).
FORKED = "--forked"


def run_forked(module: str, jobs: Sequence[Any], *, memory_bytes: int, timeout_s: float,
               warm: Sequence[Any] = (), env: Mapping[str, str] | None = None
               ) -> list[dict[str, Any]]:
    """Run every job in one child, ``python -m module --forked``, whose ``main`` passes them
    to :func:`serve_forked`.

    Args:
        module: A module whose ``main`` serves jobs.
        jobs: JSON values, one per job.
        memory_bytes: Address-space limit of each job's process, bytes.
        timeout_s: Seconds each job may take (the child's imports excluded).
        warm: Jobs the child runs itself first, their answers dropped, so that what a job
            does once per process (loading codecs, xarray's and zarr's first-use work) is
            done before the forks: jobs on sound archives only, that write nothing and
            open no OpenGL context.
        env: The child's environment (default: this one's).

    Returns:
        Per job, in order: ``{"result": what the job returned, "wall_s": s}``, or
        ``{"died": why, "wall_s": s}`` when its process died or was killed, or the child
        ended before it.
    """
    argv = [sys.executable, "-m", module, FORKED, str(memory_bytes), str(timeout_s)]
    try:
        done = subprocess.run(argv, input=json.dumps({"warm": list(warm), "jobs": list(jobs)}),
                              capture_output=True, text=True,
                              timeout=120 + timeout_s * len(jobs),
                              env=dict(env if env is not None else os.environ))
        stdout, why = done.stdout, f"exit {done.returncode}: {done.stderr.strip()[-500:]}"
    except subprocess.TimeoutExpired as err:
        stdout, why = _text(err.stdout), "it did not finish (killed)"
    found = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            found[row.pop("job")] = row
    return [found.get(i, {"died": f"the child ended before this job ({why})", "wall_s": 0.0})
            for i in range(len(jobs))]


def _text(data: str | bytes | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


def serve_forked(run: Callable[[Any], Any], argv: Sequence[str]) -> int:
    """The child's side of :func:`run_forked`: read the jobs from stdin, run the warm-up
    jobs here, then print, per job, ``{"job": i, ...}`` on a line of its own, each job run
    as ``run(job)`` in a forked process of its own.

    The warm-up runs with Dask's synchronous scheduler: a thread pool made here would reach
    the forked processes without its threads (zarr and fsspec start their event loops
    again after a fork).

    Args:
        run: Runs one job; returns a JSON value. Import what it needs before calling this.
        argv: ``[memory_bytes, timeout_s]``.
    """
    import dask

    memory_bytes, timeout_s = int(argv[0]), float(argv[1])
    request = json.load(sys.stdin)
    with dask.config.set(scheduler="synchronous"):
        for job in request["warm"]:
            try:
                run(job)
            except Exception:  # noqa: BLE001 - a warm-up; the jobs say what goes wrong
                traceback.print_exc()
    gc.collect()
    gc.freeze()  # the collector leaves what is here alone: fewer pages copied per fork
    warnings.filterwarnings("ignore", "This process .* is multi-threaded", DeprecationWarning)
    for i, job in enumerate(request["jobs"]):
        print(json.dumps({"job": i, **_fork(run, job, memory_bytes, timeout_s)}), flush=True)
    return 0


def _fork(run: Callable[[Any], Any], job: Any, memory_bytes: int, timeout_s: float
          ) -> dict[str, Any]:
    """Run ``run(job)`` in a forked process, capped; what it returned, or why it did not."""
    start = time.perf_counter()
    sys.stdout.flush()
    sys.stderr.flush()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the job's process: its answer goes through the pipe, never stdout
        os.close(read)
        code = 1
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
            answer = json.dumps(run(job)).encode()
            _write_all(write, answer)
            code = 0
        except BaseException:  # noqa: BLE001 - said on stderr; the parent sees no answer
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(code)
    os.close(write)
    answer = _read_until(read, pid, start + timeout_s)
    _, status = os.waitpid(pid, 0)
    wall = time.perf_counter() - start
    if answer is None:
        return {"died": f"did not finish within {timeout_s} s (killed)", "wall_s": wall}
    if not answer:
        return {"died": f"the job's process died ({_status(status)})", "wall_s": wall}
    return {"result": json.loads(answer), "wall_s": wall}


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _read_until(fd: int, pid: int, deadline: float) -> bytes | None:
    """Everything the job's process writes to the pipe ``fd`` until it closes it; None
    (and the process killed) when the deadline comes first."""
    parts = []
    try:
        while True:
            left = deadline - time.perf_counter()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                return None
            part = os.read(fd, 1 << 16)
            if not part:
                return b"".join(parts)
            parts.append(part)
    finally:
        os.close(fd)


def _status(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit {os.waitstatus_to_exitcode(status)}"

"""Whole-process benchmark rows: ``flyarchive render`` run as a subprocess and timed from
start to exit (imports, cluster start-up, kernel loading, model preparation included).

Used by ``bench_gpu_replay.py`` (rows ``cli``, ``cli_all_gpus``, ``cli_s3``,
``cli_scheduler``) and ``bench_cpu_replay.py`` (case ``cli-warp-cpu``). Helpers:

- :func:`run_render`: one ``python -m flyarchive render ...`` timed; a failure raises
  :class:`CliRowError` with the command and the last lines of its stderr;
- :func:`save_mjb`: a compiled model to an ``.mjb`` file for ``--model``;
- :class:`S3Copy`: a loopback S3 server (moto, :mod:`flyarchive.testing.s3`) holding a
  copy of a local archive, and a bucket prefix for the videos;
- :class:`HandStartedCluster`: ``dask scheduler`` plus one ``dask worker --nthreads 1
  --resources GPU=1`` per GPU (``CUDA_VISIBLE_DEVICES`` set to it), as a user starts
  them by hand; its address goes to ``--scheduler``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["CliRowError", "run_render", "save_mjb", "S3Copy", "HandStartedCluster"]

#: The ``flyarchive`` command, run by this interpreter (what the console script runs;
#: ``PYTHONPATH`` decides which flyarchive).
FLYARCHIVE = (sys.executable, "-c", "from flyarchive.cli import run; run()")  # the console script
#: Seconds a whole-process row may take before it is stopped and reported.
TIMEOUT_S = 3600


class CliRowError(RuntimeError):
    """A ``flyarchive`` subprocess (or a helper process of a row) failed."""


def save_mjb(model: Any, folder: Path) -> str:
    """``model`` saved as ``folder/model.mjb``; its path."""
    import mujoco

    path = folder / "model.mjb"
    mujoco.mj_saveModel(model, str(path), None)
    return str(path)


def run_render(url: str, out: str, *, camera: str, size: tuple[int, int], backend: str,
               model: str | None = None, extra: list[str] | tuple[str, ...] = (),
               storage_options: dict[str, Any] | None = None,
               env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``flyarchive render URL ...`` (quiet, overwrite) and time it whole.

    Returns:
        ``{"wall_s": seconds, "command": the command line}``.

    Raises:
        CliRowError: non-zero exit (its stderr's last lines), or past :data:`TIMEOUT_S`.
    """
    command = [*FLYARCHIVE, "render", url, "--camera", camera,
               "--size", f"{size[0]}x{size[1]}", "--backend", backend, "--out", out,
               "--quiet", "--overwrite", *(["--model", model] if model else []), *extra]
    if storage_options:
        command += ["--storage-options", json.dumps(storage_options)]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S,
                              env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        raise CliRowError(f"{' '.join(command)} ran past {TIMEOUT_S} s") from None
    wall = time.perf_counter() - start
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise CliRowError(f"exit {done.returncode}: {tail} (command: {' '.join(command)})")
    return {"wall_s": wall, "command": " ".join(command)}


class S3Copy:
    """A loopback S3 server holding a copy of a local archive (``with``-block).

    Attributes (inside the block):
        url: The archive's ``s3://`` URL.
        out: An ``s3://`` prefix for videos.
        storage_options: s3fs options for both.
        upload_s: Seconds the copy took.
    """

    def __init__(self, local_archive: str) -> None:
        self._local = local_archive
        self._server: Any = None

    def __enter__(self) -> S3Copy:
        from flyarchive.testing.s3 import S3Server

        self._server = S3Server().start()
        self._server.create_bucket("bench")
        self.storage_options = self._server.storage_options()
        self.url = "s3://bench/archive.zarr"
        self.out = "s3://bench/videos"
        start = time.perf_counter()
        self._server.filesystem().put(self._local.rstrip("/") + "/", self.url, recursive=True)
        self.upload_s = time.perf_counter() - start
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.stop()


class HandStartedCluster:
    """``dask scheduler`` and ``n`` ``dask worker --nthreads 1 --resources GPU=1``
    processes, worker ``i`` with ``CUDA_VISIBLE_DEVICES=gpus[i]`` (``with``-block).

    Attributes (inside the block):
        address: The scheduler's address, for ``--scheduler``.
        start_s: Seconds until every worker had joined.
    """

    def __init__(self, gpus: list[str], *, timeout_s: float = 180.0) -> None:
        self._gpus = gpus
        self._timeout = timeout_s
        self._procs: list[subprocess.Popen[bytes]] = []
        self._tmp = tempfile.TemporaryDirectory(prefix="bench-dask-")

    def __enter__(self) -> HandStartedCluster:
        from distributed import Client

        file = str(Path(self._tmp.name) / "scheduler.json")
        start = time.perf_counter()
        try:
            self._spawn(["scheduler", "--scheduler-file", file, "--host", "127.0.0.1",
                         "--port", "0", "--dashboard-address", "127.0.0.1:0"], {})
            deadline = time.monotonic() + self._timeout
            while not Path(file).exists():
                self._check_alive()
                if time.monotonic() > deadline:
                    raise CliRowError(f"dask scheduler wrote no {file} in {self._timeout} s")
                time.sleep(0.1)
            for gpu in self._gpus:
                self._spawn(["worker", "--scheduler-file", file, "--nthreads", "1",
                             "--nworkers", "1", "--resources", "GPU=1", "--no-dashboard"],
                            {"CUDA_VISIBLE_DEVICES": gpu})
            with Client(scheduler_file=file, timeout=self._timeout) as client:
                client.wait_for_workers(len(self._gpus), timeout=self._timeout)
                self.address = client.scheduler.address
        except BaseException:
            self.__exit__()
            raise
        self.start_s = time.perf_counter() - start
        return self

    def _spawn(self, args: list[str], env: dict[str, str]) -> None:
        command = [sys.executable, "-m", "distributed.cli.dask_" + args[0], *args[1:]]
        self._procs.append(subprocess.Popen(command, env={**os.environ, **env},
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def _check_alive(self) -> None:
        for proc in self._procs:
            if proc.poll() is not None:
                raise CliRowError(f"{' '.join(map(str, proc.args))} exited with {proc.returncode}")

    def __exit__(self, *exc: Any) -> None:
        for proc in reversed(self._procs):
            proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        self._tmp.cleanup()


def gpu_ids() -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` values of this machine's GPUs (UUIDs when nvidia-smi
    names them), found as ``flyarchive render --backend gpu`` finds them."""
    from flyarchive.distribute.gpus import visible_gpus

    return [gpu.visible for gpu in visible_gpus()]


def cli_rows(url: str, model: str, *, camera: str, size: tuple[int, int], backend: str,
             n_images: int, folder: Path, measure: Any, which: tuple[str, ...]
             ) -> dict[str, dict[str, Any]]:
    """The whole-process rows of ``which`` (each timed by ``measure(n_images, run)``,
    which reports a failure in the row):

    - ``cli``: ``flyarchive render`` on one GPU (``--gpus 0``; ``warp-cpu``: as is);
    - ``cli_all_gpus``: on every GPU (the default; only with two or more GPUs);
    - ``cli_s3``: the archive on a loopback S3 server, the videos to it (one GPU);
    - ``cli_scheduler``: ``--scheduler`` of hand-started ``dask worker --resources
      GPU=1`` processes, one per GPU (``warp-cpu``: two workers); the workers' start-up
      is not timed (``start_s``).
    """
    one = ["--gpus", "0"] if backend == "gpu" else []
    gpus = gpu_ids() if backend == "gpu" else ["", ""]
    rows: dict[str, dict[str, Any]] = {}

    def render(name: str, **kwargs: Any) -> dict[str, Any]:
        row = measure(n_images, lambda: run_render(**{
            "url": url, "out": str(folder / name), "camera": camera, "size": size,
            "backend": backend, "model": model, **kwargs}))
        print(f"{name}: {row}", flush=True)
        return row

    if "cli" in which:
        rows["cli"] = render("cli", extra=one)
    if "cli_all_gpus" in which and backend == "gpu" and len(gpus) >= 2:
        rows["cli_all_gpus"] = render("cli_all_gpus")
        rows["cli_all_gpus"]["gpus"] = len(gpus)
    if "cli_s3" in which:
        try:
            with S3Copy(url) as s3:
                rows["cli_s3"] = render("cli_s3", url=s3.url, out=s3.out, extra=one,
                                        storage_options=s3.storage_options)
                rows["cli_s3"]["upload_s"] = round(s3.upload_s, 2)
        except Exception as err:  # the server did not start: reported, not raised
            rows["cli_s3"] = {"error": f"{type(err).__name__}: {err}"[:300]}
    if "cli_scheduler" in which:
        try:
            with HandStartedCluster(gpus) as cluster:
                rows["cli_scheduler"] = render("cli_scheduler",
                                               extra=["--scheduler", cluster.address])
                rows["cli_scheduler"].update(workers=len(gpus), start_s=round(cluster.start_s, 2))
        except Exception as err:
            rows["cli_scheduler"] = {"error": f"{type(err).__name__}: {err}"[:300]}
    return rows

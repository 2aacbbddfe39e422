"""Concurrency harnesses: writers started at the same instant, and a reader polling a writer.

Used by ``tests/test_concurrent_creation.py`` and ``scripts/reliability_report.py``.

:class:`RecorderPool` keeps ``n`` child processes (``python -m
flyarchive.testing.concurrency``) that have imported everything and wait on their
stdin. A trial writes one job line to every child in a tight loop, so they all
start recording within microseconds of each other (the slow part, starting Python
and importing MuJoCo, is done once per pool). Each child reports its outcome,
then keeps its recorder open (holding its claim) until every child has reported,
so the outcomes do not depend on which process the scheduler runs first.

- :func:`creators_trial`: ``n`` recorders create one URL at once (``mode="w-"`` or
  ``"w"``). Expected: one winner, the others refused cleanly, and the archive left
  is exactly the winner's recording.
- :func:`appenders_trial`: ``n`` recorders append to one archive at once (``mode="a"``,
  no world block). Expected: one writer, the others refused.
- :func:`reader_trial`: a child appends small commits while this process polls
  :func:`flyarchive.open_archive`. Expected: no open reports damage, and every frame
  read inside ``n_frames`` equals the final data.

Children print protocol lines only (``READY``, ``RESULT <json>``, ``CLOSED <json>``);
nothing here is needed to record or replay, and nothing is pickled.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "Attempt", "RaceResult", "ReaderResult", "RecorderPool", "creators_trial",
    "appenders_trial", "reader_trial", "REFUSALS",
]

#: The error a clean refusal raises, per mode of the competing recorders.
REFUSALS = {"w-": ("ArchiveExistsError",), "w": ("ArchiveInUseError",), "a": ("ArchiveInUseError",)}


@dataclass(frozen=True)
class Attempt:
    """What one child's recorder did: ``outcome`` is ``"ok"`` or the error's class name."""

    outcome: str
    message: str = ""
    committed: int = 0


@dataclass
class RaceResult:
    """One trial of recorders started at the same instant.

    Attributes:
        mode: The recorders' mode.
        attempts: One per child.
        winners: Children whose recording succeeded.
        refused: Children refused with the expected error (naming the URL).
        unexpected: ``"Type: message"`` of every other failure.
        problems: What is wrong with the archive left behind (empty when it is exactly
            the winner's recording and passes ``verify``).
    """

    mode: str
    attempts: list[Attempt] = field(default_factory=list)
    winners: int = 0
    refused: int = 0
    unexpected: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """One winner, every other child refused cleanly, the archive intact."""
        return self.winners == 1 and not self.unexpected and not self.problems

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "clean": self.clean}


@dataclass
class ReaderResult:
    """A reader polling ``open_archive`` while a writer appends.

    Attributes:
        opens: Successful opens.
        damaged: Opens that reported the archive as damaged (or failed otherwise).
        errors: Their messages (first 200 characters).
        frames_read: Committed (world, frame) pairs read over all opens.
        frames_differing: Of those, pairs that differ from the final data.
        commits_seen: Distinct ``n_frames`` values seen.
        writer: The writer's outcome.
        plain_ahead: Plain ``xarray.open_zarr(url)`` opens (with ``plain=True``) that
            showed more frames than the ``n_frames`` read right after them: consolidated
            metadata ahead of the commit markers.
    """

    opens: int = 0
    damaged: int = 0
    errors: list[str] = field(default_factory=list)
    frames_read: int = 0
    frames_differing: int = 0
    commits_seen: int = 0
    writer: str = ""
    plain_ahead: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ----------------------------------------------------------------------------- child
def _attempt(job: dict[str, Any]) -> tuple[Any, Attempt]:
    from flyarchive import TrajectoryRecorder
    from flyarchive.testing import simulate, tiny_model

    model = tiny_model()
    recorder = None
    try:
        recorder = TrajectoryRecorder(job["url"], model, chunk_frames=job["chunk_frames"],
                                      mode=job["mode"], storage_options=job.get("storage_options"))
        simulate(model, job["n_worlds"], job["n_steps"], recorder.record_as_needed,
                 seed=job["seed"])
        recorder.flush()
        return recorder, Attempt("ok", committed=recorder.committed_frames)
    except Exception as err:  # reported to the parent, which judges it
        return recorder, Attempt(type(err).__name__, str(err)[:500])


def _child() -> int:
    """Serve jobs from stdin: one JSON line per attempt, ``CLOSE`` to close, ``EXIT``."""
    import flyarchive  # noqa: F401  (imports done before READY)
    from flyarchive.testing import tiny_model

    tiny_model()
    print("READY", flush=True)
    for line in sys.stdin:
        if line.strip() == "EXIT":
            break
        recorder, attempt = _attempt(json.loads(line))
        print("RESULT", json.dumps(asdict(attempt)), flush=True)
        sys.stdin.readline()  # CLOSE: every child has reported
        closed = "ok"
        try:
            if recorder is not None:
                recorder.close()
        except Exception as err:
            closed = f"{type(err).__name__}: {err}"
        print("CLOSED", json.dumps(closed), flush=True)
    return 0


# ----------------------------------------------------------------------------- parent
class RecorderPool:
    """``n`` child processes ready to record on command (a context manager).

    Args:
        n: Children.
        timeout_s: Seconds to wait for any one answer.
    """

    def __init__(self, n: int, *, timeout_s: float = 120.0) -> None:
        self.timeout_s = timeout_s
        self._procs = [
            subprocess.Popen([sys.executable, "-m", "flyarchive.testing.concurrency"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for _ in range(n)
        ]
        self._lines: list[queue.Queue[str]] = []
        for proc in self._procs:
            lines: queue.Queue[str] = queue.Queue()
            threading.Thread(target=self._pump, args=(proc, lines), daemon=True).start()
            self._lines.append(lines)
        for i in range(n):
            self._expect(i, "READY")

    @staticmethod
    def _pump(proc: subprocess.Popen[str], lines: queue.Queue[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put("")  # end of output

    def _expect(self, i: int, tag: str) -> Any:
        while True:
            try:
                line = self._lines[i].get(timeout=self.timeout_s)
            except queue.Empty:
                raise TimeoutError(f"child {i} did not answer {tag} in {self.timeout_s} s") from None
            if line == "":
                raise RuntimeError(f"child {i} exited (code {self._procs[i].poll()}) before {tag}")
            if line.startswith(tag):
                rest = line[len(tag):].strip()
                return json.loads(rest) if rest else None

    def _send(self, i: int, line: str) -> None:
        stdin = self._procs[i].stdin
        assert stdin is not None
        stdin.write(line + "\n")
        stdin.flush()

    def __len__(self) -> int:
        return len(self._procs)

    def start(self, jobs: Sequence[dict[str, Any]]) -> None:
        """Hand every child its job at once (``len(jobs)`` of them, one each)."""
        lines = [json.dumps(job) for job in jobs]
        for i, line in enumerate(lines):
            self._send(i, line)

    def results(self, n: int) -> list[Attempt]:
        """The outcomes of the first ``n`` children's jobs."""
        return [Attempt(**self._expect(i, "RESULT")) for i in range(n)]

    def result_ready(self, i: int) -> bool:
        return not self._lines[i].empty()

    def close(self, n: int) -> list[str]:
        """Let the first ``n`` children close their recorders; their close outcomes."""
        for i in range(n):
            self._send(i, "CLOSE")
        return [self._expect(i, "CLOSED") for i in range(n)]

    def race(self, jobs: Sequence[dict[str, Any]]) -> list[Attempt]:
        """Start ``jobs`` at once, wait for every outcome, then let them all close."""
        self.start(jobs)
        attempts = self.results(len(jobs))
        closes = self.close(len(jobs))
        return [a if c == "ok" else Attempt(a.outcome, f"{a.message} (close: {c})", a.committed)
                for a, c in zip(attempts, closes)]

    def __enter__(self) -> "RecorderPool":
        return self

    def __exit__(self, *exc: object) -> None:
        for i, proc in enumerate(self._procs):
            try:
                self._send(i, "EXIT")
            except (BrokenPipeError, OSError):
                pass
        for proc in self._procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def writer_job(url: str, mode: str, seed: int, n_worlds: int, n_steps: int, chunk_frames: int,
               storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """What one writer process of a race is told: its archive, mode, seed and sizes."""
    return {"url": url, "mode": mode, "seed": seed, "n_worlds": n_worlds, "n_steps": n_steps,
            "chunk_frames": chunk_frames, "storage_options": storage_options}


def _judge(result: RaceResult, url: str) -> None:
    allowed = REFUSALS[result.mode]
    for a in result.attempts:
        if a.outcome == "ok":
            result.winners += 1
        elif a.outcome in allowed and repr(url) in a.message:
            result.refused += 1
        else:
            result.unexpected.append(f"{a.outcome}: {a.message[:300]}")


def _compare(url: str, expected: dict[str, np.ndarray], problems: list[str],
             storage_options: dict[str, Any] | None = None) -> None:
    """Check the archive at ``url`` against ``expected`` frames (all of them)."""
    from flyarchive import open_archive
    from flyarchive.store.integrity import verify

    report = verify(url, storage_options)
    problems += [f"verify: {p}" for p in report.problems]
    if not report.ok:
        return
    ds = open_archive(url, storage_options)
    n = expected["time"].shape[0]
    if list(ds.n_frames.values) != [n] * ds.sizes["world"]:
        problems.append(f"n_frames is {ds.n_frames.values.tolist()}, expected {n} per world")
        return
    for name in ("qpos", "mocap_pos", "mocap_quat"):
        if not np.array_equal(ds[name].values, expected[name]):
            problems.append(f"{name} differs from the winner's recording")
    if not np.array_equal(ds.sim_time.values, expected["time"]):  # the simulation times
        problems.append("sim_time differs from the winner's recording")


def creators_trial(pool: RecorderPool, url: str, *, mode: str = "w-", n_worlds: int = 2,
                   n_steps: int = 40, chunk_frames: int = 5,
                   storage_options: dict[str, Any] | None = None) -> RaceResult:
    """Every child of ``pool`` creates ``url`` at the same instant, each with its own seed.

    ``url`` may hold an archive already (for ``mode="w"``). The archive left must be
    exactly the winner's recording; with no winner, that is a problem too.
    """
    from flyarchive.testing import reference_frames, tiny_model

    seeds = [100 * (i + 1) for i in range(len(pool))]
    result = RaceResult(mode, pool.race([writer_job(url, mode, s, n_worlds, n_steps, chunk_frames,
                                              storage_options) for s in seeds]))
    _judge(result, url)
    winners = [s for s, a in zip(seeds, result.attempts) if a.outcome == "ok"]
    if len(winners) == 1:
        _compare(url, reference_frames(tiny_model(), n_worlds, n_steps, seed=winners[0]),
                 result.problems, storage_options)
    elif not winners:
        result.problems.append("no recorder succeeded")
    return result


def appenders_trial(pool: RecorderPool, url: str, *, n_worlds: int = 2, first_steps: int = 20,
                    n_steps: int = 60, chunk_frames: int = 5) -> RaceResult:
    """Record ``first_steps`` into ``url``, then every child appends at the same instant.

    Each child reruns the same simulation from t=0 with ``mode="a"`` (the recorder skips
    the committed frames after checking that the rerun reaches the same state there, and
    would refuse another run) and goes on to ``n_steps``. Exactly one child may write;
    the archive left must hold the whole run once.
    """
    from flyarchive import TrajectoryRecorder
    from flyarchive.testing import reference_frames, simulate, tiny_model

    model = tiny_model()
    with TrajectoryRecorder(url, model, chunk_frames=chunk_frames) as recorder:
        simulate(model, n_worlds, first_steps, recorder.record_as_needed)
    result = RaceResult("a", pool.race([writer_job(url, "a", 0, n_worlds, n_steps, chunk_frames)
                                        for _ in range(len(pool))]))
    _judge(result, url)
    if result.winners == 1:
        _compare(url, reference_frames(model, n_worlds, n_steps), result.problems)
    elif not result.winners:
        result.problems.append("no appender succeeded")
    return result


def reader_trial(pool: RecorderPool, url: str, *, n_worlds: int = 2, first_steps: int = 8,
                 n_steps: int = 1200, chunk_frames: int = 2, max_opens: int = 10_000,
                 storage_options: dict[str, Any] | None = None, plain: bool = False) -> ReaderResult:
    """A child appends to ``url`` (one commit per ``chunk_frames`` frames) while this
    process opens it again and again; every frame read is checked against the final data.

    With ``plain=True`` each poll also opens ``url`` with plain ``xarray.open_zarr`` (which
    trusts the consolidated metadata) and counts the opens that show more frames than
    the commit markers read after them."""
    from flyarchive import TrajectoryRecorder, open_archive
    from flyarchive.errors import FlyarchiveError
    from flyarchive.testing import simulate, tiny_model

    model = tiny_model()
    with TrajectoryRecorder(url, model, chunk_frames=chunk_frames,
                            storage_options=storage_options) as recorder:
        simulate(model, n_worlds, first_steps, recorder.record_as_needed)
    out = ReaderResult()
    snapshots: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    pool.start([writer_job(url, "a", 0, n_worlds, n_steps, chunk_frames, storage_options)])
    while not pool.result_ready(0) and out.opens + out.damaged < max_opens:
        try:
            if plain:
                out.plain_ahead += _plain_ahead(url, storage_options)
            ds = open_archive(url, storage_options)
            snapshots.append((ds.n_frames.values.copy(), ds.qpos.values, ds.sim_time.values))
            out.opens += 1
        except FlyarchiveError as err:
            out.damaged += 1
            out.errors.append(f"{type(err).__name__}: {str(err)[:200]}")
    attempt = pool.results(1)[0]
    pool.close(1)
    out.writer = attempt.outcome if attempt.outcome == "ok" else f"{attempt.outcome}: {attempt.message}"
    final = open_archive(url, storage_options)
    qpos, times = final.qpos.values, final.sim_time.values
    out.commits_seen = len({tuple(s[0]) for s in snapshots})
    for n_frames, values, seen_times in snapshots:
        for w, n in enumerate(n_frames):
            same = (values[w, :n] == qpos[w, :n]).all(axis=-1)
            same &= seen_times[:n] == times[:n]
            out.frames_read += int(n)
            out.frames_differing += int((~same).sum())
    return out


def _plain_ahead(url: str, storage_options: dict[str, Any] | None) -> int:
    """1 if ``xarray.open_zarr(url)`` shows more frames than ``n_frames`` read after it."""
    import xarray as xr
    import zarr

    frames = xr.open_zarr(url, storage_options=storage_options).sizes["time"]
    n_frames = zarr.open_array(f"{url.rstrip('/')}/n_frames", mode="r", zarr_format=3,
                               storage_options=storage_options)[:]
    return int(frames > int(n_frames.max(initial=0)))


if __name__ == "__main__":
    sys.exit(_child())

"""Concurrency harnesses: writers started at the same instant, and a writer whose commits
wait for readers (a gated job).

Used by ``tests/reliability/test_concurrent_creation.py``,
:mod:`~flyarchive.testing.verify_beside` (readers beside a writer) and
``scripts/reliability_report.py``.

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

A gated job (:meth:`RecorderPool.gated`) makes the reads of a trial meet the writer's
commits without polling: before each commit the child says ``COMMIT`` and waits; the
parent lets it through as it starts a read (:meth:`CommitGate.reading`), so every read
begins as a commit begins, and commits go on only while the parent reads. Once the
parent has read enough it stops the job (:meth:`CommitGate.stop`): no commit is made
that no read meets, and no read starves the writer (2 cores).

Children print protocol lines only (``READY``, ``COMMIT <frames>``, ``COMMITTED
<frames>``, ``RESULT <json>``, ``CLOSED <json>``) and read ``GO``/``STOP`` (gated
commits), ``CLOSE`` and ``EXIT``; nothing here is needed to record or replay, and
nothing is pickled.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "Attempt", "CommitGate", "RaceResult", "RecorderPool", "creators_trial", "appenders_trial",
    "writer_job", "REFUSALS",
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


# ----------------------------------------------------------------------------- child
class _Stopped(Exception):
    """The parent answered ``STOP``: the job ends after the commit it let through."""


class _ChildGate:
    """The child's side of a gated job: before each commit it says ``COMMIT <frames>`` and
    waits for ``GO`` (commit) or ``STOP`` (commit, then end the job); after it, it says
    ``COMMITTED <frames>``. Closed (no more words) once the job's simulation is over."""

    def __init__(self) -> None:
        self.open, self.stopped = True, False

    def commit(self, writer: Any, block: Any, options: dict[str, Any]) -> None:
        told = self.open
        if told:
            print("COMMIT", writer.n_frames, flush=True)
            if sys.stdin.readline().strip() == "STOP":
                self.open, self.stopped = False, True
        writer.write(block, **options)
        if told:
            print("COMMITTED", writer.n_frames, flush=True)


class _GatedWriter:
    """An archive writer (:class:`flyarchive.record.sink.ArchiveSink`) whose commits pass
    through a :class:`_ChildGate`; everything else is the writer's."""

    def __init__(self, writer: Any, gate: _ChildGate) -> None:
        self._writer, self._gate = writer, gate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._writer, name)

    def write(self, block: Any, **options: Any) -> None:
        self._gate.commit(self._writer, block, options)


def _recorder_class(gate: _ChildGate | None) -> Any:
    """flyarchive's recorder, or one whose archive writers pass through ``gate``."""
    from flyarchive import TrajectoryRecorder
    from flyarchive.recorders import StoredArchives

    if gate is None:
        return TrajectoryRecorder

    class GatedArchives(StoredArchives):
        def create(self, url: str, spec: Any, **options: Any) -> Any:
            return _GatedWriter(super().create(url, spec, **options), gate)

        def append(self, url: str, layout: Any, **options: Any) -> Any:
            return _GatedWriter(super().append(url, layout, **options), gate)

    return type("GatedRecorder", (TrajectoryRecorder,), {"archives": GatedArchives()})


def _attempt(job: dict[str, Any]) -> tuple[Any, Attempt]:
    from flyarchive.testing import simulate, tiny_model

    model = tiny_model()
    gate = _ChildGate() if job.get("gated") else None
    recorder = None

    def on_step(datas: Any) -> None:
        if gate is not None and gate.stopped:
            raise _Stopped
        recorder.record_as_needed(datas)

    try:
        recorder = _recorder_class(gate)(
            job["url"], model, chunk_frames=job["chunk_frames"], mode=job["mode"],
            storage_options=job.get("storage_options"))
        try:
            simulate(model, job["n_worlds"], job["n_steps"], on_step, seed=job["seed"])
        except _Stopped:
            pass
        if gate is not None:
            gate.open = False  # the last commits go unannounced
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
class CommitGate:
    """The parent's side of a gated job of one child (:meth:`RecorderPool.gated`).

    The child waits at each commit until the gate lets it through: at once while a
    :meth:`reading` block runs (up to its ``max_commits``), else when the next block
    starts; after :meth:`stop` it commits what it holds and ends its job.

    Attributes:
        commits: Commits the child made through the gate.
        mid_commit: Whether a commit overlapped the last :meth:`reading` block (one let
            through ended during it, or was still going on at its end, as the child's
            ``COMMITTED`` lines tell).
    """

    def __init__(self, send: Any, timeout_s: float) -> None:
        self._send, self.timeout_s = send, timeout_s
        self._cond = threading.Condition()
        self._held = self._stopped = self._ended = False
        self._room = 0  # commits let through without holding them, in this block
        self._let_through = self.commits = 0
        self.mid_commit = False

    def on_line(self, line: str) -> None:
        """A line of the child (its pump thread): ``COMMIT``, ``COMMITTED`` or ``RESULT``."""
        with self._cond:
            if line.startswith("COMMITTED"):
                self.commits += 1
            elif line.startswith("COMMIT"):
                self._held = True
                if self._stopped or self._room:
                    self._answer()
            else:
                self._ended = True
            self._cond.notify_all()

    def _answer(self) -> None:
        self._held = False
        if not self._stopped:
            self._room -= 1
            self._let_through += 1
        self._send("STOP" if self._stopped else "GO")

    @contextmanager
    def reading(self, max_commits: int | None = None) -> Iterator[bool]:
        """Wait until the child holds its next commit, then let it through, and the commits
        after it (``max_commits`` in all, default: every one), while the block runs;
        yields False instead when the job has ended.

        Raises:
            TimeoutError: if the child neither commits nor ends in ``timeout_s``.
        """
        with self._cond:
            if not self._cond.wait_for(lambda: self._held or self._ended, self.timeout_s):
                raise TimeoutError(f"the writer neither committed nor ended in {self.timeout_s} s")
            running = not self._ended
            if running:
                self._room = sys.maxsize if max_commits is None else max_commits
                self._answer()
            done_before = self.commits
        try:
            yield running
        finally:
            with self._cond:
                self._room = 0
                # a commit let through ended during the block, or is still going on
                self.mid_commit = running and (self.commits > done_before
                                               or self._let_through > self.commits)

    def stop(self) -> None:
        """End the job: the commit held (or the next one) is the child's last."""
        with self._cond:
            self._stopped = True
            if self._held:
                self._answer()


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
        self._send_lock = threading.Lock()
        self._gates: dict[int, CommitGate] = {}
        self._lines: list[queue.Queue[str]] = []
        for i, proc in enumerate(self._procs):
            lines: queue.Queue[str] = queue.Queue()
            threading.Thread(target=self._pump, args=(i, proc, lines), daemon=True).start()
            self._lines.append(lines)
        for i in range(n):
            self._expect(i, "READY")

    def _pump(self, i: int, proc: subprocess.Popen[str], lines: queue.Queue[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            gate = self._gates.get(i)
            if gate is not None and line.startswith(("COMMIT", "RESULT")):
                gate.on_line(line)
            if not line.startswith("COMMIT"):
                lines.put(line)
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
        with self._send_lock:
            stdin.write(line + "\n")
            stdin.flush()

    @contextmanager
    def gated(self, i: int = 0) -> Iterator[CommitGate]:
        """A :class:`CommitGate` for the gated job (``writer_job(..., gated=True)``) that child
        ``i`` is given inside the block; the job is stopped when the block ends."""
        gate = CommitGate(lambda line: self._send(i, line), self.timeout_s)
        self._gates[i] = gate  # until the next gated job: it answers STOP to late commits
        try:
            yield gate
        finally:
            gate.stop()

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
               storage_options: dict[str, Any] | None = None, *,
               gated: bool = False) -> dict[str, Any]:
    """What one writer process of a race is told: its archive, mode, seed and sizes; with
    ``gated``, to wait at each commit for the parent's :class:`CommitGate`."""
    return {"url": url, "mode": mode, "seed": seed, "n_worlds": n_worlds, "n_steps": n_steps,
            "chunk_frames": chunk_frames, "storage_options": storage_options, "gated": gated}


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


if __name__ == "__main__":
    sys.exit(_child())

"""Fault harnesses: kill a recording process and check what it left behind.

Used by ``tests/test_reliability.py`` and ``scripts/reliability_report.py``.
:func:`kill_trial` starts a recording in a child process (``python -m
flyarchive.faults``), SIGKILLs it at a seeded random point, reopens the archive,
compares every committed frame with a deterministic regeneration of the
simulation, runs :func:`flyarchive.verify.verify`, resumes the recording with
``mode="a"`` and checks that the resumed archive equals the full reference.

The child prints one line per recorded frame, ``<recorded> <committed>``, so the
parent knows how many frames the process had recorded when it died; frames lost
by a kill are those minus the frames the archive committed.

Nothing here is needed to record or replay.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = ["KillConfig", "KillResult", "kill_trial", "kill_trials", "BACKENDS"]

#: Recording backends the harness can kill: CPU MuJoCo and mujoco-warp on Warp's CPU device.
BACKENDS = ("cpu", "warp")
_STATE = ("qpos", "mocap_pos", "mocap_quat")


@dataclass(frozen=True)
class KillConfig:
    """One kill trial.

    Attributes:
        backend: ``"cpu"`` (TrajectoryRecorder) or ``"warp"`` (WarpTrajectoryRecorder on
            Warp's CPU device).
        seed: Seeds the kill point (frames to wait for, then a delay).
        n_worlds: Simulated worlds (tiny model, nq=13, one mocap body).
        chunk_frames: Frames per flush; a kill may lose at most this many.
        max_wait_frames: The kill comes after 1..max_wait_frames recorded frames...
        max_delay_s: ...plus a uniform random delay in [0, max_delay_s] seconds.
        resume_extra_frames: Frames the resumed recording adds after the last committed one.
        timeout_s: Seconds to wait for the child to reach its kill point.
    """

    backend: str = "cpu"
    seed: int = 0
    n_worlds: int = 3
    chunk_frames: int = 5
    max_wait_frames: int = 40
    max_delay_s: float = 0.05
    resume_extra_frames: int = 12
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}.")


@dataclass
class KillResult:
    """What one kill trial found.

    Attributes:
        config: The trial.
        killed: True if the child was still running when SIGKILL was sent.
        recorded: Frames the child reported as recorded before it died.
        reported_committed: Frames the child reported as committed before it died.
        committed: Committed frames in the reopened archive (``n_frames``, all worlds).
        frames_lost: ``recorded - committed``.
        problems: One sentence per check that failed; empty when the archive survived.
    """

    config: KillConfig
    killed: bool = False
    recorded: int = 0
    reported_committed: int = 0
    committed: int = 0
    frames_lost: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def survived(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["survived"] = self.survived
        return out


# ----------------------------------------------------------------------------- child
def _dtype(backend: str) -> Any:
    return np.float64 if backend == "cpu" else np.float32


def _child_cpu(url: str, n_worlds: int, chunk_frames: int) -> None:
    from flyarchive import TrajectoryRecorder
    from flyarchive.testing import simulate, tiny_model

    model = tiny_model()
    recorder = TrajectoryRecorder(url, model, chunk_frames=chunk_frames, mode="a")

    def on_step(datas: list[Any]) -> None:
        if recorder.record_as_needed(datas):
            print(recorder.n_frames, recorder.committed_frames, flush=True)

    simulate(model, n_worlds, 10_000_000, on_step)


def _child_warp(url: str, n_worlds: int, chunk_frames: int) -> None:
    from flyarchive.faults_warp import record_warp

    record_warp(url, n_worlds, chunk_frames, 10_000_000,
                on_frame=lambda rec, com: print(rec, com, flush=True))


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Recording child of the kill harness.")
    parser.add_argument("backend", choices=BACKENDS)
    parser.add_argument("url")
    parser.add_argument("--worlds", type=int, default=3)
    parser.add_argument("--chunk-frames", type=int, default=5)
    args = parser.parse_args(argv)
    child = _child_cpu if args.backend == "cpu" else _child_warp
    child(args.url, args.worlds, args.chunk_frames)
    return 0


# ----------------------------------------------------------------------------- parent
def _run_and_kill(url: str, config: KillConfig) -> KillResult:
    rng = np.random.default_rng(config.seed)
    wait_frames = int(rng.integers(1, config.max_wait_frames + 1))
    delay = float(rng.uniform(0.0, config.max_delay_s))
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    cmd = [sys.executable, "-m", "flyarchive.faults", config.backend, url,
           "--worlds", str(config.n_worlds), "--chunk-frames", str(config.chunk_frames)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    result = KillResult(config)
    deadline = time.monotonic() + config.timeout_s
    try:
        assert proc.stdout is not None
        last = "0 0"
        while int(last.split()[0]) < wait_frames and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            last = line
        time.sleep(delay)
        result.killed = proc.poll() is None
        if result.killed:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        rest = proc.stdout.read().split()  # lines printed before the process died
        if len(rest) >= 2:
            last = " ".join(rest[-2:])
        result.recorded, result.reported_committed = (int(v) for v in last.split())
        if not result.killed:
            err = proc.stderr.read() if proc.stderr else ""
            result.problems.append(f"The recording child exited before the kill: {err[-2000:]}")
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    return result


def _reference(config: KillConfig, n_frames: int) -> dict[str, np.ndarray]:
    if config.backend == "warp":
        from flyarchive.faults_warp import warp_reference

        return warp_reference(config.n_worlds, n_frames)
    from flyarchive.testing import reference_frames, tiny_model

    ref = reference_frames(tiny_model(), config.n_worlds, 4 * max(n_frames - 1, 0))
    return {k: v[:n_frames] if k == "time" else v[:, :n_frames] for k, v in ref.items()}


def _compare(ds: Any, ref: dict[str, np.ndarray], n: int, what: str, problems: list[str]) -> None:
    actual = {"time": np.asarray(ds.time.values[:n])}
    actual.update({k: np.asarray(ds[k].values[:, :n]) for k in _STATE})
    for key, expected in ref.items():
        got = actual[key]
        if got.shape != expected.shape or not np.array_equal(got, expected.astype(got.dtype)):
            problems.append(
                f"{what}: {key} of the first {n} frames differs from the regenerated simulation "
                f"(shape {got.shape} vs {expected.shape})."
            )


def _check_archive(url: str, result: KillResult) -> int:
    from flyarchive import open_archive
    from flyarchive.verify import verify

    from flyarchive.store import open_group

    try:
        ds = open_archive(url)
    except Exception as err:  # the archive must reopen whatever the kill point
        result.problems.append(f"Reopening after the kill failed: {err!r}")
        try:
            n = int(np.min(open_group(url)["n_frames"][:]))
        except Exception:
            return -1
        result.committed, result.frames_lost = n, result.recorded - n
        return n
    n_frames = ds.n_frames.values
    n = int(n_frames.min()) if n_frames.size else 0
    result.committed = n
    result.frames_lost = result.recorded - n
    if (n_frames != n).any():
        result.problems.append(f"n_frames differs between worlds after the kill: {n_frames.tolist()}.")
    if n < result.reported_committed:
        result.problems.append(
            f"The child reported {result.reported_committed} committed frames; the archive holds {n}."
        )
    if result.frames_lost > result.config.chunk_frames:
        result.problems.append(
            f"{result.frames_lost} frames lost, more than one flush ({result.config.chunk_frames})."
        )
    if n > ds.sizes["time"]:
        result.problems.append(f"n_frames {n} exceeds the time extent {ds.sizes['time']}.")
    _compare(ds, _reference(result.config, n), n, "After the kill", result.problems)
    report = verify(url)
    result.problems += [f"verify after the kill: {p}" for p in report.problems]
    return n


def _resume(url: str, result: KillResult, committed: int) -> None:
    from flyarchive import open_archive

    total = committed + result.config.resume_extra_frames
    try:
        if result.config.backend == "warp":
            from flyarchive.faults_warp import record_warp

            record_warp(url, result.config.n_worlds, result.config.chunk_frames, 4 * (total - 1))
        else:
            from flyarchive import TrajectoryRecorder
            from flyarchive.testing import simulate, tiny_model

            model = tiny_model()
            with TrajectoryRecorder(url, model, chunk_frames=result.config.chunk_frames,
                                    mode="a") as recorder:
                simulate(model, result.config.n_worlds, 4 * (total - 1), recorder.record_as_needed)
        ds = open_archive(url)
    except Exception as err:
        result.problems.append(f"Resuming with mode='a' failed: {err!r}")
        return
    if ds.n_frames.values.tolist() != [total] * result.config.n_worlds:
        result.problems.append(
            f"After resuming, n_frames is {ds.n_frames.values.tolist()}; expected {total} per world."
        )
        return
    _compare(ds, _reference(result.config, total), total, "After resuming", result.problems)


def kill_trial(url: str, config: KillConfig) -> KillResult:
    """Record in a child process, SIGKILL it at a seeded random point, check, resume, check.

    Args:
        url: Where the child records (an empty location; a local path is best).
        config: Backend, seed and sizes.

    Returns:
        The result; ``problems`` lists every check that failed.
    """
    result = _run_and_kill(url, config)
    if result.problems:
        return result
    committed = _check_archive(url, result)
    if committed >= 0:
        _resume(url, result, committed)
    return result


def kill_trials(
    make_url: Callable[[int], str], configs: Sequence[KillConfig],
    on_result: Callable[[KillResult], None] | None = None,
) -> list[KillResult]:
    """Run :func:`kill_trial` for each config, recording trial ``i`` at ``make_url(i)``."""
    results = []
    for i, config in enumerate(configs):
        result = kill_trial(make_url(i), config)
        if on_result is not None:
            on_result(result)
        results.append(result)
    return results


if __name__ == "__main__":
    sys.exit(_main())

"""Kill harness: kill a recording process and check what it left behind.

Used by ``tests/reliability/test_reliability.py``, ``tests/store/test_consolidated.py`` and
``scripts/reliability_report.py``.
:func:`kill_trial` starts a recording in a child process (``python -m
flyarchive.testing.kills``), SIGKILLs it at a seeded random point, reopens the archive,
compares every committed frame with a deterministic regeneration of the
simulation, runs :func:`flyarchive.verify`, resumes the recording with
``mode="a"`` and checks that the resumed archive equals the full reference.

The child prints one line per recorded frame, ``FRAME <recorded> <committed>``, so the
parent knows how many frames the process had recorded when it died; frames lost
by a kill are those minus the frames the archive committed. The child process and the
comparison of frames come from :mod:`~flyarchive.testing.trials`, the seeded Warp worlds
from :mod:`~flyarchive.testing.warp_recording`.

Nothing here is needed to record or replay.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flyarchive.testing.trials import (
    Child,
    TrialOutcome,
    archive_frames,
    compare_frames,
    first_frames,
)
from flyarchive.testing.warp_recording import WarpFrames, record_warp, warp_reference

__all__ = ["KillConfig", "KillResult", "kill_trial", "BACKENDS"]

#: Recording backends the harness can kill: CPU MuJoCo and mujoco-warp on Warp's CPU device.
BACKENDS = ("cpu", "warp")
_FRAME = "FRAME"  # prefix of the child's progress lines: FRAME <recorded> <committed>


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
        host_states: ``"warp"`` only: the worlds are CPU MuJoCo's, their state set into
            Warp arrays at each step (:mod:`flyarchive.testing.warp_states`) instead of
            stepped by mujoco-warp: the same recorder on Warp's CPU device, without the
            ~5 s of CPU per process of importing mujoco-warp and loading its kernels.
    """

    backend: str = "cpu"
    seed: int = 0
    n_worlds: int = 3
    chunk_frames: int = 5
    max_wait_frames: int = 40
    max_delay_s: float = 0.05
    resume_extra_frames: int = 12
    timeout_s: float = 120.0
    host_states: bool = False

    @property
    def max_lost(self) -> int:
        """Frames a kill may lose: one flush on CPU; the device buffer and both host
        buffers (three chunks) for mujoco-warp."""
        return self.chunk_frames * (1 if self.backend == "cpu" else 3)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}.")


@dataclass
class KillResult(TrialOutcome):
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


# ----------------------------------------------------------------------------- child
def _child_cpu(url: str, n_worlds: int, chunk_frames: int) -> None:
    from flyarchive import TrajectoryRecorder
    from flyarchive.testing import simulate, tiny_model

    model = tiny_model()
    recorder = TrajectoryRecorder(url, model, chunk_frames=chunk_frames, mode="a")

    def on_step(datas: list[Any]) -> None:
        if recorder.record_as_needed(datas):
            print(_FRAME, recorder.n_frames, recorder.committed_frames, flush=True)

    simulate(model, n_worlds, 10_000_000, on_step)


def _child_warp(url: str, n_worlds: int, chunk_frames: int, host_states: bool = False) -> None:
    record_warp(url, n_worlds, chunk_frames, 10_000_000,
                on_frame=lambda recorded, committed: print(_FRAME, recorded, committed, flush=True),
                host_states=host_states)


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Recording child of the kill harness.")
    parser.add_argument("backend", choices=BACKENDS)
    parser.add_argument("url")
    parser.add_argument("--worlds", type=int, default=3)
    parser.add_argument("--chunk-frames", type=int, default=5)
    parser.add_argument("--host-states", action="store_true",
                        help="warp: CPU MuJoCo worlds in Warp arrays, not mujoco-warp's")
    args = parser.parse_args(argv)
    if args.backend == "cpu":
        _child_cpu(args.url, args.worlds, args.chunk_frames)
    else:
        _child_warp(args.url, args.worlds, args.chunk_frames, args.host_states)
    return 0


# ----------------------------------------------------------------------------- parent
def _progress(line: str, last: tuple[int, int]) -> tuple[int, int]:
    parts = line.split()
    if len(parts) == 3 and parts[0] == _FRAME:
        return int(parts[1]), int(parts[2])
    return last


def _run_and_kill(url: str, config: KillConfig) -> KillResult:
    rng = np.random.default_rng(config.seed)
    wait_frames = int(rng.integers(1, config.max_wait_frames + 1))
    delay = float(rng.uniform(0.0, config.max_delay_s))
    cmd = [sys.executable, "-m", "flyarchive.testing.kills", config.backend, url,
           "--worlds", str(config.n_worlds), "--chunk-frames", str(config.chunk_frames),
           *(["--host-states"] if config.host_states else [])]
    result = KillResult(config)
    deadline = time.monotonic() + config.timeout_s
    with Child(cmd) as child:
        last = (0, 0)
        while last[0] < wait_frames and time.monotonic() < deadline:
            line = child.readline()
            if not line:
                break
            last = _progress(line, last)
        time.sleep(delay)
        result.killed, lines = child.kill()
        for line in lines:  # printed before the process died
            last = _progress(line, last)
        result.recorded, result.reported_committed = last
        if not result.killed:
            result.problems.append(
                f"The recording child exited before the kill: {child.stderr_tail()}")
    return result


def _reference(config: KillConfig, n_frames: int) -> dict[str, np.ndarray]:
    if config.backend == "warp":
        ref = warp_reference(config.n_worlds, n_frames, config.host_states)
    else:
        from flyarchive.testing import reference_frames, tiny_model

        ref = reference_frames(tiny_model(), config.n_worlds, 4 * max(n_frames - 1, 0))
    return first_frames(ref, n_frames)


def _check_archive(url: str, result: KillResult) -> tuple[int, dict[str, np.ndarray]] | None:
    """Check the archive a kill left; its committed frames and their states (compared with
    the simulation later, once it is regenerated), or None if it cannot be read."""
    from flyarchive import open_archive
    from flyarchive.store import open_for_reading
    from flyarchive.store.integrity import verify

    try:
        ds = open_archive(url)
    except Exception as err:  # the archive must reopen whatever the kill point
        result.problems.append(f"Reopening after the kill failed: {err!r}")
        try:
            n = int(np.min(open_for_reading(url, attributes_only=True)["n_frames"][:]))
        except Exception:
            return None
        result.committed, result.frames_lost = n, result.recorded - n
        return None
    n_frames = ds.n_frames.values
    n = int(n_frames.min()) if n_frames.size else 0
    result.committed = n
    # A frame committed was recorded, though the child may have died before saying so.
    result.recorded = max(result.recorded, n)
    result.frames_lost = result.recorded - n
    if (n_frames != n).any():
        result.problems.append(
            f"n_frames differs between worlds after the kill: {n_frames.tolist()}."
        )
    if n < result.reported_committed:
        result.problems.append(
            f"The child reported {result.reported_committed} committed frames; "
            f"the archive holds {n}."
        )
    if result.frames_lost > result.config.max_lost:
        result.problems.append(
            f"{result.frames_lost} frames lost, more than the recorder's bound "
            f"({result.config.max_lost} for {result.config.backend})."
        )
    state = archive_frames(ds, n)
    _check_plain_open(url, result.problems)
    report = verify(url)
    result.problems += [f"verify after the kill: {p}" for p in report.problems]
    return n, state


def _check_plain_open(url: str, problems: list[str]) -> None:
    """``xarray.open_zarr(url)``, no arguments: no warning (the consolidated metadata is
    there), and no frame beyond the commit markers."""
    import warnings

    import xarray as xr

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ds = xr.open_zarr(url)
    except Exception as err:
        problems.append(f"xarray.open_zarr(url) after the kill: {err!r}")
        return
    if ds.sizes["time"] > int(ds.n_frames.values.max(initial=0)):
        problems.append(
            f"xarray.open_zarr(url) after the kill shows {ds.sizes['time']} frames; n_frames "
            f"commits {ds.n_frames.values.tolist()}: the consolidated metadata is ahead.")


def _resume(url: str, result: KillResult, committed: int) -> dict[str, np.ndarray] | None:
    """Resume the recording with ``mode="a"`` up to ``resume_extra_frames`` more frames and
    compare; the regenerated simulation's frames (mujoco-warp: read while the resumed
    recording steps it), or None if the resume failed."""
    from flyarchive import open_archive

    config = result.config
    total = committed + config.resume_extra_frames
    try:
        if config.backend == "warp":
            frames = WarpFrames()
            record_warp(url, config.n_worlds, config.chunk_frames, 4 * (total - 1),
                        observe=frames, host_states=config.host_states)
            ref = frames.arrays()
        else:
            from flyarchive import TrajectoryRecorder
            from flyarchive.testing import simulate, tiny_model

            model = tiny_model()
            with TrajectoryRecorder(url, model, chunk_frames=config.chunk_frames,
                                    mode="a") as recorder:
                simulate(model, config.n_worlds, 4 * (total - 1), recorder.record_as_needed)
            ref = _reference(config, total)
        ds = open_archive(url)
    except Exception as err:
        result.problems.append(f"Resuming with mode='a' failed: {err!r}")
        return None
    if ds.n_frames.values.tolist() != [total] * config.n_worlds:
        result.problems.append(
            f"After resuming, n_frames is {ds.n_frames.values.tolist()}; "
            f"expected {total} per world."
        )
        return ref
    compare_frames(archive_frames(ds, total), ref, total, "After resuming", result.problems)
    return ref


def kill_trial(url: str, config: KillConfig) -> KillResult:
    """Record in a child process, SIGKILL it at a seeded random point, check, resume, check.

    The frames the kill left are compared with the simulation regenerated by the resumed
    recording (one simulation, not two).

    Args:
        url: Where the child records (an empty location; a local path is best).
        config: Backend, seed and sizes.

    Returns:
        The result; ``problems`` lists every check that failed.
    """
    result = _run_and_kill(url, config)
    if result.problems:
        return result
    checked = _check_archive(url, result)
    if checked is not None:
        committed, state = checked
        ref = _resume(url, result, committed)
        compare_frames(state, ref if ref is not None else _reference(config, committed), committed,
                 "After the kill", result.problems)
    return result


if __name__ == "__main__":
    sys.exit(_main())

"""Fault harnesses: kill a recording process and check what it left behind.

Used by ``tests/test_reliability.py`` and ``scripts/reliability_report.py``.
:func:`kill_trial` starts a recording in a child process (``python -m
flyarchive.testing.kills``), SIGKILLs it at a seeded random point, reopens the archive,
compares every committed frame with a deterministic regeneration of the
simulation, runs :func:`flyarchive.verify`, resumes the recording with
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
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "Child", "KillConfig", "KillResult", "kill_trial", "BACKENDS", "record_warp", "warp_reference",
    "WarpFrames",
    "S3_OUTCOMES",
    "S3FaultResult", "s3_record_trial", "s3_read_trial", "s3_render_trial",
]

#: Recording backends the harness can kill: CPU MuJoCo and mujoco-warp on Warp's CPU device.
BACKENDS = ("cpu", "warp")
_STATE = ("qpos", "mocap_pos", "mocap_quat")
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


class TrialOutcome:
    """What the trial results of the harnesses share: a trial survived when no check failed.

    Subclasses are dataclasses with a ``problems`` field (one sentence per failed
    check); ``VERDICT`` names the JSON key of the verdict.
    """

    VERDICT = "survived"
    problems: list[str]

    @property
    def survived(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)  # type: ignore[call-overload]
        out[self.VERDICT] = self.survived
        return out


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


def _warp_sim(n_worlds: int) -> tuple[Any, Any, Any]:
    """The tiny model on the host, on Warp's CPU device, and ``n_worlds`` seeded worlds."""
    import warnings

    import warp as wp

    wp.config.log_level = wp.LOG_WARNING  # no start-up and module-load messages on stdout
    import mujoco_warp as mjw

    from flyarchive.testing import tiny_model

    model = tiny_model()
    rng = np.random.default_rng(0)
    with wp.ScopedDevice("cpu"), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # mujoco-warp's notices about the model
        mjw_model = mjw.put_model(model)
        data = mjw.make_data(model, nworld=n_worlds)
        data.qvel.assign(rng.normal(0.0, 1.0, (n_worlds, model.nv)).astype(np.float32))
        data.ctrl.assign(rng.normal(0.0, 0.3, (n_worlds, model.nu)).astype(np.float32))
    return model, mjw_model, data


def _warp_steps(n_worlds: int, n_steps: int, on_step: Callable[[int, Any], None],
                host_states: bool = False) -> Any:
    """Step the seeded Warp worlds ``n_steps`` times; ``on_step(step, data)`` at 0..n_steps.

    ``host_states``: the worlds of :func:`flyarchive.testing.warp_states.host_warp_steps`
    (CPU MuJoCo's, in Warp arrays) instead of mujoco-warp's."""
    if host_states:
        from flyarchive.testing import tiny_model
        from flyarchive.testing.warp_states import host_warp_steps

        model = tiny_model()
        host_warp_steps(model, n_worlds, n_steps, on_step)
        return model
    import mujoco_warp as mjw
    import warp as wp

    model, mjw_model, data = _warp_sim(n_worlds)
    with wp.ScopedDevice("cpu"):
        on_step(0, data)
        for step in range(1, n_steps + 1):
            mjw.step(mjw_model, data)
            on_step(step, data)
    return model


def record_warp(url: str, n_worlds: int, chunk_frames: int, n_steps: int,
                on_frame: Callable[[int, int], None] | None = None, *,
                observe: Callable[[int, Any], None] | None = None,
                host_states: bool = False) -> None:
    """Record ``n_steps`` steps of the seeded Warp worlds with ``WarpTrajectoryRecorder``.

    Uses ``mode="a"``: a rerun from step 0 into an archive skips its committed frames.
    ``on_frame(recorded, committed)`` is called after each recorded frame;
    ``observe(step, data)`` at every step, before the recorder (e.g. a :class:`WarpFrames`).
    ``host_states``: see :func:`_warp_steps`.
    """
    from flyarchive.recorders import WarpTrajectoryRecorder
    from flyarchive.testing import tiny_model

    recorder = WarpTrajectoryRecorder(url, tiny_model(), n_worlds, chunk_frames=chunk_frames,
                                      mode="a")

    def on_step(step: int, data: Any) -> None:
        if observe is not None:
            observe(step, data)
        if recorder.record_as_needed(data) and on_frame is not None:
            on_frame(recorder.n_frames, recorder.committed_frames)

    with recorder:
        _warp_steps(n_worlds, n_steps, on_step, host_states)


class WarpFrames:
    """``observe(step, data)`` of the seeded Warp worlds: their state at each frame of the
    recorders' schedule (25 fps at 0.2x), read back on the host beside any recorder."""

    def __init__(self) -> None:
        from flyarchive.clock import FrameClock, Timing
        from flyarchive.testing import tiny_model

        self._clock = FrameClock(Timing(float(tiny_model().opt.timestep), 25, 0.2))
        self._frames: dict[str, list[np.ndarray]] = {k: [] for k in ("time", *_STATE)}

    def __call__(self, step: int, data: Any) -> None:
        if self._clock.is_due(step):
            self._frames["time"].append(np.float64(data.time.numpy()[0]))
            for key in _STATE:
                self._frames[key].append(getattr(data, key).numpy().copy())

    def arrays(self) -> dict[str, np.ndarray]:
        """``time`` (frames,) and each state (worlds, frames, ...)."""
        return {k: np.array(v) if k == "time" else np.stack(v, axis=1)
                for k, v in self._frames.items()}


def warp_reference(n_worlds: int, n_frames: int, host_states: bool = False
                   ) -> dict[str, np.ndarray]:
    """The first ``n_frames`` frames of the seeded Warp worlds, read back on the host."""
    frames = WarpFrames()
    _warp_steps(n_worlds, 4 * max(n_frames - 1, 0), frames, host_states)
    return frames.arrays()


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


class Child:
    """A harness's child process to SIGKILL mid-way (``with``-block: always reaped).

    Its stdout is a text pipe of progress lines; its stderr goes to a temporary file (a
    pipe left unread could block the child); ``MUJOCO_GL`` defaults to ``egl``.
    """

    def __init__(self, cmd: Sequence[str]) -> None:
        env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=self._stderr,
                                     text=True, env=env)

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()

    def readline(self) -> str:
        """The next progress line; "" once the child's stdout is closed."""
        assert self.proc.stdout is not None
        return self.proc.stdout.readline()

    def kill(self) -> tuple[bool, list[str]]:
        """SIGKILL the child if it still runs; (whether it did, the lines it printed before)."""
        killed = self.proc.poll() is None
        if killed:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        assert self.proc.stdout is not None
        return killed, self.proc.stdout.read().splitlines()

    def stderr_tail(self, n: int = 2000) -> str:
        """The last ``n`` characters the child wrote to stderr."""
        self._stderr.seek(0)
        return self._stderr.read()[-n:]


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
    return _first(ref, n_frames)


def _first(ref: dict[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
    return {k: v[:n] if k == "time" else v[:, :n] for k, v in ref.items()}


def _state(ds: Any, n: int) -> dict[str, np.ndarray]:
    """The first ``n`` frames of an opened archive: ``time`` (the simulation time of each
    frame) and the states, loaded."""
    actual = {"time": np.asarray(ds.sim_time.values[:n])}
    actual.update({k: np.asarray(ds[k].values[:, :n]) for k in _STATE})
    return actual


def _compare(actual: dict[str, np.ndarray], ref: dict[str, np.ndarray], n: int, what: str,
             problems: list[str]) -> None:
    """Compare the first ``n`` frames of an archive (:func:`_state`) with the reference."""
    for key, expected in _first(ref, n).items():
        got = actual[key]
        if got.shape != expected.shape or not np.array_equal(got, expected.astype(got.dtype)):
            problems.append(
                f"{what}: {key} of the first {n} frames differs from the regenerated simulation "
                f"(shape {got.shape} vs {expected.shape})."
            )


def _check_archive(url: str, result: KillResult) -> tuple[int, dict[str, np.ndarray]] | None:
    """Check the archive a kill left; its committed frames and their states (compared with
    the simulation later, once it is regenerated), or None if it cannot be read."""
    from flyarchive import open_archive
    from flyarchive.store import open_group
    from flyarchive.store.integrity import verify

    try:
        ds = open_archive(url)
    except Exception as err:  # the archive must reopen whatever the kill point
        result.problems.append(f"Reopening after the kill failed: {err!r}")
        try:
            n = int(np.min(open_group(url)["n_frames"][:]))
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
    state = _state(ds, n)
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
    _compare(_state(ds, total), ref, total, "After resuming", result.problems)
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
        _compare(state, ref if ref is not None else _reference(config, committed), committed,
                 "After the kill", result.problems)
    return result


# ----------------------------------------------------------------------------- flaky S3
#: Outcomes of an operation through the fault proxy; the first two are acceptable.
S3_OUTCOMES = (
    "equal", "clean-failure", "wrong-error", "unclear-error", "lost-commit", "silent-hole",
    "wrong-data",
)


@dataclass
class S3FaultResult:
    """One operation (record, read, render) through :class:`~flyarchive.testing.faultproxy.FaultProxy`.

    Attributes:
        operation: ``"record"``, ``"read"`` or ``"render"``.
        seed: The fault plan's seed.
        faults: The proxy's counts (requests, faults per kind).
        outcome: One of :data:`S3_OUTCOMES`: ``equal`` (same result as without faults),
            ``clean-failure`` (a StorageError, and the archive holds exactly its last
            commit), ``wrong-error`` (another FlyarchiveError, e.g. a storage fault
            reported as damaged metadata), ``unclear-error`` (not a FlyarchiveError),
            ``lost-commit`` (frames committed before the error are gone or the archive
            does not reopen),
            ``silent-hole`` (NaN inside ``n_frames``), ``wrong-data`` (other differences).
        error: The exception, as ``repr``, if the operation raised.
        committed: Frames committed (``n_frames``) after the operation, record only.
    """

    operation: str
    seed: int
    faults: dict[str, int]
    outcome: str
    error: str = ""
    committed: int = 0

    @property
    def acceptable(self) -> bool:
        return self.outcome in ("equal", "clean-failure")


def _error_outcome(error: BaseException) -> str:
    """A storage fault must surface as a StorageError; other errors mislead or are unclear."""
    from flyarchive.errors import FlyarchiveError, StorageError

    if isinstance(error, StorageError):
        return "clean-failure"
    return "wrong-error" if isinstance(error, FlyarchiveError) else "unclear-error"


def _clean_options(server: Any) -> dict[str, Any]:
    return server.storage_options(skip_instance_cache=True)


def _archive_outcome(url: str, options: dict[str, Any], ref: dict[str, np.ndarray],
                     min_committed: int) -> tuple[str, int]:
    """Judge an archive after a (possibly failed) recording, through a clean connection."""
    from flyarchive import open_archive
    from flyarchive.store.integrity import verify

    try:
        ds = open_archive(url, options)
    except Exception:
        return "lost-commit", 0
    n = int(ds.n_frames.values.min())
    if n < min_committed or (ds.n_frames.values != n).any():
        return "lost-commit", n
    state = _state(ds, n)
    if any(np.isnan(state[k]).any() for k in _STATE):
        return "silent-hole", n
    problems: list[str] = []
    _compare(state, ref, n, "", problems)
    if problems or not verify(url, options).ok:
        return "wrong-data", n
    return "equal", n


def s3_record_trial(server: Any, plan: Any, url: str, *, n_worlds: int = 2, n_frames: int = 30,
                    chunk_frames: int = 5) -> S3FaultResult:
    """Record ``n_frames`` tiny frames to ``url`` through a fault proxy, then judge the archive.

    Args:
        server: A running :class:`~flyarchive.testing.s3.S3Server` (the bucket must exist).
        plan: The :class:`~flyarchive.testing.faultproxy.FaultPlan` for the proxy.
        url: ``s3://bucket/key`` of a new archive.
    """
    from flyarchive import TrajectoryRecorder
    from flyarchive.testing import reference_frames, simulate, tiny_model
    from flyarchive.testing.faultproxy import FaultProxy

    model = tiny_model()
    steps = 4 * (n_frames - 1)
    error: BaseException | None = None
    committed = 0
    with FaultProxy(server.endpoint_url, plan) as proxy:
        try:
            recorder = TrajectoryRecorder(url, model, chunk_frames=chunk_frames,
                                          storage_options=proxy.storage_options())
            try:
                simulate(model, n_worlds, steps, recorder.record_as_needed)
            finally:
                committed = recorder.committed_frames
                recorder.close()
            committed = recorder.committed_frames
        except Exception as err:
            error = err
        stats = proxy.stats()
    ref = reference_frames(model, n_worlds, steps)
    outcome, n = _archive_outcome(url, _clean_options(server), ref, committed)
    if error is None and outcome == "equal" and n != n_frames:
        outcome = "lost-commit"
    if error is not None and outcome == "equal":
        outcome = _error_outcome(error)
    if error is not None and outcome == "lost-commit" and committed == 0:
        # failed before the first commit: acceptable if nothing or an empty archive is there
        outcome = _error_outcome(error)
    return S3FaultResult("record", plan.seed, stats, outcome,
                         "" if error is None else repr(error), n)


def s3_read_trial(server: Any, plan: Any, url: str) -> S3FaultResult:
    """Open an archive through a fault proxy and load every variable; compare with a clean read."""
    from flyarchive import open_archive

    expected = open_archive(url, _clean_options(server)).load()
    return _through_proxy(server, plan, "read",
                          lambda options: open_archive(url, options).load(), expected)


def s3_render_trial(server: Any, plan: Any, url: str, camera: str = "front",
                    size: tuple[int, int] = (48, 64)) -> S3FaultResult:
    """Render the frames of an archive through a fault proxy; compare with a clean render."""
    from flyarchive.distribute.frames import render_frames
    from flyarchive.testing import tiny_model

    model = tiny_model()

    def render(options: dict[str, Any]) -> Any:
        import dask

        with dask.config.set(scheduler="synchronous"):
            return render_frames(url, model, camera, size=size, block_frames=8,
                                 storage_options=options).values

    return _through_proxy(server, plan, "render", render, render(_clean_options(server)))


def _through_proxy(server: Any, plan: Any, operation: str, run: Callable[[dict[str, Any]], Any],
                   expected: Any) -> S3FaultResult:
    import xarray as xr

    from flyarchive.testing.faultproxy import FaultProxy

    with FaultProxy(server.endpoint_url, plan) as proxy:
        try:
            actual = run(proxy.storage_options(skip_instance_cache=True))
            error = None
        except Exception as err:
            actual, error = None, err
        stats = proxy.stats()
    if error is not None:
        outcome = _error_outcome(error)
        return S3FaultResult(operation, plan.seed, stats, outcome, repr(error))
    if isinstance(expected, xr.Dataset):
        same = expected.identical(actual)
        holes = any(np.isnan(actual[k].values).sum() > np.isnan(expected[k].values).sum()
                    for k in _STATE if k in expected)
    else:
        same, holes = np.array_equal(actual, expected), False
    outcome = "equal" if same else "silent-hole" if holes else "wrong-data"
    return S3FaultResult(operation, plan.seed, stats, outcome)


if __name__ == "__main__":
    sys.exit(_main())

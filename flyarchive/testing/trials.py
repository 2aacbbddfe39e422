"""What the fault harnesses share: the child process a harness SIGKILLs (:class:`Child`),
the verdict of a trial (:class:`TrialOutcome`), and the comparison of an archive's
committed frames with a regenerated simulation (:func:`archive_frames`,
:func:`compare_frames`).

Used by :mod:`~flyarchive.testing.kills`, :mod:`~flyarchive.testing.flaky_s3`,
:mod:`~flyarchive.testing.render_kills` and :mod:`~flyarchive.testing.interop_kills`.

Nothing here is needed to record or replay.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

__all__ = ["Child", "TrialOutcome", "STATE", "first_frames", "archive_frames", "compare_frames"]

#: The state variables the harnesses compare, besides ``time``.
STATE = ("qpos", "mocap_pos", "mocap_quat")


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


def first_frames(ref: dict[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
    """The first ``n`` frames of reference frames: ``time`` (frames,), states (worlds, frames, ...)."""
    return {k: v[:n] if k == "time" else v[:, :n] for k, v in ref.items()}


def archive_frames(ds: Any, n: int) -> dict[str, np.ndarray]:
    """The first ``n`` frames of an opened archive: ``time`` (the simulation time of each
    frame) and the states, loaded."""
    actual = {"time": np.asarray(ds.sim_time.values[:n])}
    actual.update({k: np.asarray(ds[k].values[:, :n]) for k in STATE})
    return actual


def compare_frames(actual: dict[str, np.ndarray], ref: dict[str, np.ndarray], n: int, what: str,
                   problems: list[str]) -> None:
    """Compare the first ``n`` frames of an archive (:func:`archive_frames`) with the
    reference; one sentence per differing variable is appended to ``problems``."""
    for key, expected in first_frames(ref, n).items():
        got = actual[key]
        if got.shape != expected.shape or not np.array_equal(got, expected.astype(got.dtype)):
            problems.append(
                f"{what}: {key} of the first {n} frames differs from the regenerated simulation "
                f"(shape {got.shape} vs {expected.shape})."
            )

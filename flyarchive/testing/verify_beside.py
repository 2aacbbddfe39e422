"""``verify`` run again and again beside a real writer process that appends.

Used by ``tests/reliability/test_verify_beside_writer.py`` and
``scripts/reliability_report.py``. :func:`verify_trial` records a few frames, optionally
damages a committed shard (flipped bits: a checksum that no writer can explain), then
has a child of a :class:`~flyarchive.testing.concurrency.RecorderPool` append small
commits while this process runs :func:`flyarchive.store.integrity.verify` ``n_runs``
times. The child's job is gated (:class:`~flyarchive.testing.concurrency.CommitGate`):
each run starts as a commit starts, the child commits only while a run reads (as fast
as it can, so commits meet every stage of a run), and it stops after the last run; when
its job ends first, another, longer one starts (each job reruns the simulation from t=0
with ``mode="a"`` and goes further). The loop waits on the child's words, never on a
timer.

Expected: on a sound archive no run reports a problem; on a damaged one every run
reports the damage, and nothing else; no run advises restoring or deleting metadata
while the writer holds its claim.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["VerifyTrial", "verify_trial", "METADATA_ADVICE", "flip_object"]

#: Advice that must never be given while a writer holds a claim.
METADATA_ADVICE = ("restore the root zarr.json", "delete its 'consolidated_metadata'")


@dataclass
class VerifyTrial:
    """What ``n_runs`` runs of ``verify`` beside an appending writer reported.

    Attributes:
        runs: Runs of verify while the writer's job ran.
        runs_with_writer: Of those, runs that saw the writer's claim (``report.writer``).
        runs_moved: Runs that read the archive more than once (a commit moved ``n_frames``
            while they read it, or the writer held its claim when they found a problem).
        false_alarms: Problems reported that are not the damage planted (first 300
            characters each).
        damage_reported: Runs that reported the planted damage.
        damage_missed: Runs that did not (their problems, first 300 characters).
        metadata_advice: Texts that advised restoring or deleting metadata while a writer
            held its claim.
        commits_seen: Distinct committed frame counts seen.
        runs_mid_commit: Runs that a commit overlapped.
        jobs: Writer jobs started.
        writer: The writer's last outcome: ``"ok"`` or ``"Type: message"``.
    """

    runs: int = 0
    runs_with_writer: int = 0
    runs_moved: int = 0
    false_alarms: list[str] = field(default_factory=list)
    damage_reported: int = 0
    damage_missed: list[str] = field(default_factory=list)
    metadata_advice: list[str] = field(default_factory=list)
    commits_seen: int = 0
    runs_mid_commit: int = 0
    jobs: int = 0
    writer: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def flip_object(url: str, key: str, storage_options: Mapping[str, Any] | None = None,
                mask: int = 0x40) -> None:
    """Flip bits in the middle of the object ``key`` of the archive at ``url`` (any fsspec
    URL), as :func:`flyarchive.testing.flip_bits` does to a local file."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    path = f"{root.rstrip('/')}/{key}"
    data = bytearray(fs.cat_file(path))
    data[len(data) // 2] ^= mask
    fs.pipe_file(path, bytes(data))


def verify_trial(pool: Any, url: str, *, n_runs: int = 12, damaged: bool = False,
                 n_worlds: int = 2, first_steps: int = 60, more_steps: int = 600,
                 chunk_frames: int = 2, commits_per_run: int | None = None, max_jobs: int = 50,
                 storage_options: Mapping[str, Any] | None = None) -> VerifyTrial:
    """Run verify ``n_runs`` times while a child of ``pool`` appends to ``url``.

    Args:
        pool: A :class:`~flyarchive.testing.concurrency.RecorderPool` of one child.
        url: A new archive's URL (recorded here first: ``first_steps`` of the tiny model).
        n_runs: Runs of verify wanted beside the writer.
        damaged: Flip bits in the first shard of ``qpos`` (committed frames) first.
        first_steps: Steps recorded before (4 steps a frame).
        more_steps: Steps each further writer job adds (it stops after the last run).
        chunk_frames: Frames per commit.
        commits_per_run: Commits the writer may make while one run reads, the first as
            it starts (None: as many as it can).
        max_jobs: Writer jobs at most (each adds ``more_steps``).
        storage_options: Passed to fsspec.
    """
    from flyarchive import TrajectoryRecorder
    from flyarchive.store.integrity import verify
    from flyarchive.testing import simulate, tiny_model
    from flyarchive.testing.concurrency import writer_job

    model = tiny_model()
    options = dict(storage_options or {}) or None
    with TrajectoryRecorder(url, model, chunk_frames=chunk_frames,
                            storage_options=options) as recorder:
        simulate(model, n_worlds, first_steps, recorder.record_as_needed)
    if damaged:
        flip_object(url, "qpos/c/0/0/0", options)
    out, commits, steps = VerifyTrial(), set(), first_steps
    while out.runs < n_runs and out.jobs < max_jobs:
        steps += more_steps
        out.jobs += 1
        with pool.gated(0) as gate:
            pool.start([writer_job(url, "a", 0, n_worlds, steps, chunk_frames, options,
                                   gated=True)])
            while out.runs < n_runs:
                with gate.reading(commits_per_run) as running:
                    report = verify(url, options) if running else None
                if report is None:
                    break
                out.runs += 1
                out.runs_mid_commit += gate.mid_commit
                _judge(report, damaged, out)
                commits.add(tuple(report.n_frames))
        attempt = pool.results(1)[0]
        pool.close(1)
        out.writer = "ok" if attempt.outcome == "ok" else f"{attempt.outcome}: {attempt.message}"
        if attempt.outcome != "ok":
            break
    out.commits_seen = len(commits)
    return out


def _judge(report: Any, damaged: bool, out: VerifyTrial) -> None:
    """Count one verify report into ``out``."""
    out.runs_with_writer += report.writer is not None
    out.runs_moved += report.passes > 1
    planted = [p for p in report.problems if "qpos" in p and "c/0/0/0" in p
               and ("checksum" in p or "CRC-32C" in p)]
    out.false_alarms += [p[:300] for p in report.problems if p not in planted]
    if damaged:
        if planted:
            out.damage_reported += 1
        else:
            out.damage_missed.append(" | ".join(report.problems)[:300])
    if report.writer is not None:
        texts = report.problems + report.being_written
        out.metadata_advice += [t[:300] for t in texts if any(a in t for a in METADATA_ADVICE)]

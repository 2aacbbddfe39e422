"""Readers beside a real writer process that appends: :func:`flyarchive.open_archive`
(:func:`reader_trial`) and :func:`flyarchive.store.integrity.verify` (:func:`verify_trial`).

Used by ``tests/reliability/test_concurrent_creation.py``,
``tests/store/test_consolidated.py``, ``tests/reliability/test_verify_beside_writer.py``
and ``scripts/reliability_report.py``. Each trial records a few frames, then has a child
of a :class:`~flyarchive.testing.concurrency.RecorderPool` append small commits in a
gated job (:class:`~flyarchive.testing.concurrency.CommitGate`): each read (or each run of
verify) starts as a commit starts, the child commits only while this process reads (as
fast as it can, so commits meet every stage of a read), and it stops after the last
read. The loops wait on the child's words, never on a timer.

- :func:`reader_trial`: opens with ``open_archive`` (and, with ``plain=True``, plain
  ``xarray.open_zarr``). Expected: no open reports damage, every frame read inside
  ``n_frames`` equals the final data, and plain xarray never shows more frames than
  ``n_frames``.
- :func:`verify_trial`: runs ``verify``, optionally after damaging a committed shard
  (flipped bits: a checksum that no writer can explain); when the child's job ends
  first, another, longer one starts (each job reruns the simulation from t=0 with
  ``mode="a"`` and goes further). Expected: on a sound archive no run reports a
  problem; on a damaged one every run reports the damage, and nothing else; no run
  advises restoring or deleting metadata while the writer holds its claim.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = ["ReaderResult", "reader_trial", "VerifyTrial", "verify_trial", "METADATA_ADVICE",
           "flip_object"]

#: Advice that must never be given while a writer holds a claim.
METADATA_ADVICE = ("restore the root zarr.json", "delete its 'consolidated_metadata'")


@dataclass
class ReaderResult:
    """A reader opening an archive with ``open_archive`` while a writer appends.

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
        reads_mid_commit: Reads that began as a commit began and that the commit (or one
            after it) overlapped
            (:meth:`~flyarchive.testing.concurrency.CommitGate.reading`).
    """

    opens: int = 0
    damaged: int = 0
    errors: list[str] = field(default_factory=list)
    frames_read: int = 0
    frames_differing: int = 0
    commits_seen: int = 0
    writer: str = ""
    plain_ahead: int = 0
    reads_mid_commit: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def reader_trial(pool: Any, url: str, *, n_worlds: int = 2, first_steps: int = 8,
                 n_steps: int = 1200, chunk_frames: int = 2, max_opens: int = 10_000,
                 reads_per_commit: int = 2, storage_options: dict[str, Any] | None = None,
                 plain: bool = False) -> ReaderResult:
    """A child of ``pool`` appends to ``url`` (one commit per ``chunk_frames`` frames,
    gated) while this process opens it ``max_opens`` times at most, then the writer
    stops. Every frame read is checked against the final data.

    The reads go by ``reads_per_commit``: the first as a commit starts
    (:meth:`~flyarchive.testing.concurrency.CommitGate.reading`), the others right after it
    while the writer goes on committing, ``reads_per_commit`` commits at most (so they
    meet commits at every stage, and the writer's commits last for ``max_opens`` reads);
    then the reader waits for the next commit to start. So groups of reads two apart
    see different commits, however slow or fast the writer is beside them.

    With ``plain=True`` each read also opens ``url`` with plain ``xarray.open_zarr`` (which
    trusts the consolidated metadata) and counts the opens that show more frames than
    the commit markers read after them."""
    from flyarchive import TrajectoryRecorder, open_archive
    from flyarchive.testing import simulate, tiny_model
    from flyarchive.testing.concurrency import writer_job

    model = tiny_model()
    with TrajectoryRecorder(url, model, chunk_frames=chunk_frames,
                            storage_options=storage_options) as recorder:
        simulate(model, n_worlds, first_steps, recorder.record_as_needed)
    out = ReaderResult()
    snapshots: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    with pool.gated(0) as gate:
        pool.start([writer_job(url, "a", 0, n_worlds, n_steps, chunk_frames, storage_options,
                               gated=True)])
        while out.opens + out.damaged < max_opens:
            # at most reads_per_commit commits a block: the writer's commits last for
            # max_opens reads however fast it is beside them
            with gate.reading(max_commits=reads_per_commit) as running:
                if not running:
                    break
                for _ in range(min(reads_per_commit, max_opens - out.opens - out.damaged)):
                    snapshot = _read_once(url, storage_options, plain, out)
                    if snapshot is not None:
                        snapshots.append(snapshot)
            out.reads_mid_commit += gate.mid_commit
    attempt = pool.results(1)[0]
    pool.close(1)
    out.writer = attempt.outcome if attempt.outcome == "ok" else f"{attempt.outcome}: {attempt.message}"
    _compare(open_archive(url, storage_options), snapshots, out)
    return out


def _compare(final: Any, snapshots: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
             out: ReaderResult) -> None:
    """Count into ``out`` the commits seen and the frames read (inside their ``n_frames``)
    that differ from the ``final`` dataset."""
    qpos, times = final.qpos.values, final.sim_time.values
    out.commits_seen = len({tuple(s[0]) for s in snapshots})
    for n_frames, values, seen_times in snapshots:
        for w, n in enumerate(n_frames):
            same = (values[w, :n] == qpos[w, :n]).all(axis=-1)
            same &= seen_times[:n] == times[:n]
            out.frames_read += int(n)
            out.frames_differing += int((~same).sum())


def _read_once(url: str, storage_options: dict[str, Any] | None, plain: bool,
               out: ReaderResult) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Open ``url`` (with ``plain``: plain xarray first) and read it: its n_frames, qpos
    and sim_time; None (counted as damaged in ``out``) when open_archive refuses it."""
    from flyarchive import open_archive
    from flyarchive.errors import FlyarchiveError

    try:
        if plain:
            out.plain_ahead += _plain_ahead(url, storage_options)
        ds = open_archive(url, storage_options)
        snapshot = (ds.n_frames.values.copy(), ds.qpos.values, ds.sim_time.values)
    except FlyarchiveError as err:
        out.damaged += 1
        out.errors.append(f"{type(err).__name__}: {str(err)[:200]}")
        return None
    out.opens += 1
    return snapshot


def _plain_ahead(url: str, storage_options: dict[str, Any] | None) -> int:
    """1 if ``xarray.open_zarr(url)`` shows more frames than ``n_frames`` read after it."""
    import xarray as xr
    import zarr

    frames = xr.open_zarr(url, storage_options=storage_options).sizes["time"]
    n_frames = zarr.open_array(f"{url.rstrip('/')}/n_frames", mode="r", zarr_format=3,
                               storage_options=storage_options)[:]
    return int(frames > int(n_frames.max(initial=0)))


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

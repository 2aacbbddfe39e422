"""Operations through a flaky S3 (:class:`~flyarchive.testing.faultproxy.FaultProxy`),
judged: record, read and render, each compared with the same operation without faults.

Used by ``tests/reliability/test_flaky_s3.py`` and ``scripts/reliability_report.py``.
Either the result equals the fault-free run, or the operation fails with a
:class:`~flyarchive.errors.StorageError` and the archive holds exactly its last commit;
every other outcome (:data:`S3_OUTCOMES`) is a failure of flyarchive.

Nothing here is needed to record or replay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from flyarchive.testing.trials import STATE, archive_frames, compare_frames

__all__ = ["S3_OUTCOMES", "S3FaultResult", "s3_record_trial", "s3_read_trial", "s3_render_trial"]

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
    state = archive_frames(ds, n)
    if any(np.isnan(state[k]).any() for k in STATE):
        return "silent-hole", n
    problems: list[str] = []
    compare_frames(state, ref, n, "", problems)
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
                    for k in STATE if k in expected)
    else:
        same, holes = np.array_equal(actual, expected), False
    outcome = "equal" if same else "silent-hole" if holes else "wrong-data"
    return S3FaultResult(operation, plan.seed, stats, outcome)

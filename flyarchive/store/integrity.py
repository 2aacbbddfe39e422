"""Check an archive end to end: schema, commit markers, and every committed byte."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zarr

from flyarchive import codecs
from flyarchive.errors import FlyarchiveError, StorageError
from flyarchive.schema import (
    STATE_VARS,
    finite_frames,
    import_status,
    n_frames_problem,
    sizes_problem,
    times_problem,
    validate,
)
from flyarchive.store.consolidated import consolidated_problems, root_document
from flyarchive.store.models import model_problems
from flyarchive.store.reader import chunk_file, damaged_chunks, open_checked, open_stored, time_extents

__all__ = ["verify", "VerifyReport"]


@dataclass
class VerifyReport:
    """What :func:`verify` found.

    Attributes:
        url: The archive checked.
        n_worlds: Worlds in the archive.
        n_frames: Committed frames per world.
        frames_checked: Committed (world, frame) pairs read and found finite.
        problems: One sentence per problem; empty when the archive is sound.
    """

    url: str
    n_worlds: int = 0
    n_frames: list[int] = field(default_factory=list)
    frames_checked: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(url: str, storage_options: Mapping[str, Any] | None = None) -> VerifyReport:
    """Read every committed frame of an archive and report what is wrong.

    Checks: every array's metadata against what flyarchive writes (codec pipelines,
    chunk sizes); its consolidated copy in the root ``zarr.json`` (no shape larger than
    the array's own, no ``time`` extent beyond the largest ``n_frames`` in archives of
    one writer, nothing else different); every chunk of the coordinates and commit
    markers readable; the schema; ``n_frames`` within the time extent; committed times
    finite and increasing; every chunk holding committed frames readable (CRC-32C
    checksums catch flipped bits; files that are not regular files inside the archive
    are refused) and finite (a missing chunk reads as NaN); for bounded-error archives,
    values on the quantization grid; the model kept beside the archive, if any, hashing
    to its name and loading safely in a child process (the check of
    :mod:`~flyarchive.store.model_check`, its verdict kept by hash).

    Raises:
        ArchiveNotFoundError: nothing at ``url``.
    """
    report = VerifyReport(str(url))
    try:
        group = open_checked(url, storage_options, consolidated=False)
    except FlyarchiveError as err:
        if isinstance(err, (FileNotFoundError, StorageError)):  # interop: not the archive's fault
            raise
        report.problems.append(f"Schema: {err}")
        return report
    except Exception as err:  # unreadable metadata
        report.problems.append(f"Metadata unreadable: {err!r}")
        return report
    for name, arr in sorted(group.arrays()):
        if name not in STATE_VARS:  # coordinates, commit markers, world variables
            for bad in damaged_chunks(arr):
                report.problems.append(
                    f"Unreadable: {bad.describe()}: {getattr(bad.error, 'reason', bad.error)}")
    if report.problems:
        return report
    sizes = sizes_problem({n: (tuple(a.metadata.dimension_names or ()), a.shape)
                           for n, a in group.arrays()})  # as readers check it
    if sizes is not None:
        report.problems.append(f"Schema: {sizes}")
        return report
    try:
        validate(open_stored(group))
    except FlyarchiveError as err:
        report.problems.append(f"Schema: {err}")
        return report
    except Exception as err:  # unreadable metadata or coordinates
        report.problems.append(f"Metadata unreadable: {err!r}")
        return report

    report.problems += model_problems(group, str(url))  # the model kept by content, if any
    status = import_status(group.attrs.asdict())
    if status is not None and status != "complete":
        report.problems.append(status)
    n_time = min(time_extents(group).values())
    n_frames = np.asarray(group["n_frames"][:])
    report.n_worlds, report.n_frames = len(n_frames), [int(n) for n in n_frames]
    committed = n_frames_problem(n_frames, n_time)  # readers refuse what this finds
    if committed is not None:
        report.problems.append(committed)
        n_frames = n_frames.clip(0, n_time)
    _check_time(group, int(n_frames.max(initial=0)), report)
    one_writer = not group["claims"].attrs.get("world_blocks", False) if "claims" in group else True
    report.problems += consolidated_problems(root_document(group), group,
                                             n_frames if one_writer else None)
    spec = group.attrs.get("codec", {}).get("spec", "lossless")
    for name in STATE_VARS:
        if name in group:
            _check_state(group[name], name, n_frames, report, spec)
    return report


def _check_time(group: zarr.Group, n: int, report: VerifyReport) -> None:
    try:
        time = np.asarray(group["time"][:n])
        sim_time = np.asarray(group["sim_time"][:n]) if "sim_time" in group else None
    except Exception as err:
        report.problems.append(f"time is unreadable ({err!r}).")
        return
    problem = times_problem(time, sim_time)  # readers refuse what this finds
    if problem is not None:
        report.problems.append(problem)


def _check_state(
    arr: zarr.Array, name: str, n_frames: np.ndarray, report: VerifyReport, spec: str
) -> None:
    block_w = (arr.shards or arr.chunks)[0]
    block_t = arr.chunks[1]
    for w0 in range(0, arr.shape[0], block_w):
        w1 = min(w0 + block_w, arr.shape[0])
        for t0 in range(0, int(n_frames[w0:w1].max(initial=0)), block_t):
            t1 = t0 + block_t
            try:
                values = np.asarray(arr[w0:w1, t0:t1])
            except Exception as err:
                shard_t = (arr.shards or arr.chunks)[1]
                where = chunk_file(arr, (w0 // block_w, t0 // shard_t) + (0,) * (arr.ndim - 2))
                report.problems.append(
                    f"{name}[worlds {w0}..{w1 - 1}, frames {t0}..{t1 - 1}] (file {where}) is "
                    f"unreadable: {getattr(err, 'reason', err)} (corrupt bytes: checksum "
                    "mismatch or damaged chunk)."
                )
                continue
            committed = np.arange(t0, t0 + values.shape[1])[None, :] < n_frames[w0:w1, None]
            finite = finite_frames(values, frame_dims=2)
            bad = committed & ~finite
            if bad.any():
                w, t = np.argwhere(bad)[0]
                report.problems.append(
                    f"{name} has {int(bad.sum())} committed frames that are missing or not finite "
                    f"in worlds {w0}..{w1 - 1}, frames {t0}..{t1 - 1} (first: world index "
                    f"{w0 + w}, frame {t0 + t}); a chunk inside n_frames is missing or damaged."
                )
            if spec != "lossless" and not codecs.on_grid(values[committed & finite], spec).all():
                report.problems.append(
                    f"{name} in worlds {w0}..{w1 - 1}, frames {t0}..{t1 - 1} holds values off the "
                    f"quantization grid of codec {spec!r}: the error bound is not guaranteed."
                )
            if name == "qpos":
                report.frames_checked += int((committed & finite).sum())

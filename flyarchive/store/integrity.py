"""Check an archive end to end: schema, commit markers, and every committed byte.

``verify`` may run while a writer appends. It reads one consistent state: the root
``zarr.json`` (with the consolidated copy) first, then ``n_frames``, then each array's
metadata and chunks; writers grow arrays, then commit ``n_frames``, then rewrite the copy,
so nothing read later is behind what was read earlier. When it finds a problem while
``n_frames`` moved or a writer holds a claim, it reads again (at most :data:`PASSES`
times). What remains and a commit in progress can explain (the copy ahead of ``n_frames``,
an import not finished...) is reported as being written, not as damage, while a live
writer holds a claim (:func:`flyarchive.store.claims.live_claims`), and then no advice to
restore or delete metadata is given. Damage that no writer makes (a checksum that fails
inside the committed frames, metadata flyarchive does not write) stays damage.
"""

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
from flyarchive.store.claims import live_claims
from flyarchive.store.consolidated import WHILE_WRITING, consolidated_findings, root_document
from flyarchive.store.kept_models import model_problems
from flyarchive.store.reader import chunk_file, damaged_chunks, open_checked, open_stored, time_extents

#: Most passes over an archive that a writer changes while it is read.
PASSES = 3
#: What a refusal of metadata flyarchive does not write says (:mod:`~flyarchive.store.hardening`).
_NOT_WRITTEN_BY_US = ("flyarchive reads only what it writes", "disagrees with itself")


@dataclass
class VerifyReport:
    """What :func:`verify` found.

    Attributes:
        url: The archive checked.
        n_worlds: Worlds in the archive.
        n_frames: Committed frames per world.
        frames_checked: Committed (world, frame) pairs read and found finite.
        problems: One sentence per problem; empty when the archive is sound.
        writer: The writer that held a claim on the archive while it was read (e.g.
            ``"process 1234 on this host (still running) since ..."``); None when none did.
        being_written: What a commit in progress explains while ``writer`` writes (not
            damage, not in ``problems``).
        passes: Reads of the archive (more than one when a writer changed it meanwhile).
    """

    url: str
    n_worlds: int = 0
    n_frames: list[int] = field(default_factory=list)
    frames_checked: int = 0
    problems: list[str] = field(default_factory=list)
    writer: str | None = None
    being_written: list[str] = field(default_factory=list)
    passes: int = 1

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class _Finding:
    """One problem: its sentence, and what to say instead while a writer holds the
    archive (None: damage whatever a writer does)."""

    text: str
    while_writing: str | None = None


class _Pass:
    """What one pass over the archive found, and the commit markers at its start and end."""

    def __init__(self, report: VerifyReport) -> None:
        self.report = report
        self.findings: list[_Finding] = []
        self.n_frames: np.ndarray | None = None
        self.moved = False

    def add(self, text: str, while_writing: str | None = None) -> None:
        self.findings.append(_Finding(text, while_writing))

    def schema(self, err: BaseException, prefix: str = "Schema") -> None:
        """A refusal: damage if flyarchive never writes what was refused, else possibly an
        archive still being created."""
        text = f"{prefix}: {err}" if prefix == "Schema" else f"{prefix}: {err!r}"
        certain = any(mark in str(err) for mark in _NOT_WRITTEN_BY_US)
        self.add(text, None if certain else f"{text} ({WHILE_WRITING})")


def verify(url: str, storage_options: Mapping[str, Any] | None = None) -> VerifyReport:
    """Read every committed frame of an archive and report what is wrong.

    Checks: every array's metadata against what flyarchive writes (codec pipelines,
    each ending in CRC-32C; chunk sizes); its consolidated copy in the root ``zarr.json``
    (the same checks, the same decoding as the array's own, no ``time`` extent beyond the
    largest ``n_frames`` in archives of one writer); every chunk of the coordinates and
    commit markers readable; the schema; ``n_frames`` within the time extent; committed
    times finite and increasing; every chunk holding committed frames readable (CRC-32C
    checksums catch flipped bits; files that are not regular files inside the archive
    are refused) and finite (a missing chunk reads as NaN); for bounded-error archives,
    values on the quantization grid; the model kept beside the archive, if any, hashing
    to its name and loading safely in a child process (the check of
    :mod:`~flyarchive.store.model_check`, its verdict kept by hash). Safe beside a writer
    (see the module's text).

    Raises:
        ArchiveNotFoundError: nothing at ``url``.
    """
    for attempt in range(1, PASSES + 1):
        writers = _writers(url, storage_options)
        found = _one_pass(url, storage_options)
        writers = writers or _writers(url, storage_options)
        if not found.findings or not (found.moved or writers) or attempt == PASSES:
            break
    report = found.report
    report.passes = attempt
    report.writer = writers[0] if writers else None
    for finding in found.findings:
        if writers and finding.while_writing is not None:
            report.being_written.append(finding.while_writing)
        else:
            report.problems.append(finding.text)
    return report


def _writers(url: str, storage_options: Mapping[str, Any] | None) -> list[str]:
    """Who holds a claim on the archive and may be writing it, described."""
    from flyarchive.store.location import open_store

    try:
        store = open_store(url, storage_options, read_only=True)
        return [claim.describe() + ("" if claim.alive() else " (perhaps: from here it cannot be "
                                    "told whether it still runs)")
                for claim in live_claims(store, str(url))]
    except (OSError, FlyarchiveError):  # no claims to read: verify reports the storage
        return []


def _one_pass(url: str, storage_options: Mapping[str, Any] | None) -> _Pass:
    found = _Pass(VerifyReport(str(url)))
    try:
        group = open_checked(url, storage_options, consolidated=False, check_copy=False)
        document = root_document(group)  # the copy first: then nothing read later is behind it
    except FlyarchiveError as err:
        if isinstance(err, (FileNotFoundError, StorageError)):  # interop: not the archive's fault
            raise
        found.schema(err)
        return found
    except Exception as err:  # unreadable metadata
        found.schema(err, "Metadata unreadable")
        return found
    for name, arr in sorted(group.arrays()):
        if name not in STATE_VARS:  # coordinates, commit markers, world variables
            for bad in damaged_chunks(arr):
                found.add(
                    f"Unreadable: {bad.describe()}: {getattr(bad.error, 'reason', bad.error)}")
    if found.findings:
        return found
    sizes = sizes_problem({n: (tuple(a.metadata.dimension_names or ()), a.shape)
                           for n, a in group.arrays()})  # as readers check it
    if sizes is not None:
        found.add(f"Schema: {sizes}", f"Schema: {sizes} {WHILE_WRITING}")
        return found
    try:
        validate(open_stored(group))
    except FlyarchiveError as err:
        found.schema(err)
        return found
    except Exception as err:  # unreadable metadata or coordinates
        found.schema(err, "Metadata unreadable")
        return found
    _check_committed(group, document, str(url), found)
    return found


def _check_committed(group: zarr.Group, document: Mapping[str, Any] | None, url: str,
                     found: _Pass) -> None:
    """Everything that depends on ``n_frames``: read once, before the arrays' extents and
    chunks, and again at the end (``found.moved``: a writer committed meanwhile)."""
    report = found.report
    report.problems += model_problems(group, str(url))  # the model kept by content, if any
    status = import_status(group.attrs.asdict())
    if status is not None and status != "complete":
        found.add(status, f"{status} ({WHILE_WRITING})")
    n_frames = np.asarray(group["n_frames"][:])
    n_time = min(time_extents(group).values())  # read after n_frames: never behind it
    report.n_worlds, report.n_frames = len(n_frames), [int(n) for n in n_frames]
    committed = n_frames_problem(n_frames, n_time)  # readers refuse what this finds
    if committed is not None:
        found.add(committed, f"{committed} {WHILE_WRITING}")
        n_frames = n_frames.clip(0, n_time)
    _check_time(group, int(n_frames.max(initial=0)), report)
    one_writer = not group["claims"].attrs.get("world_blocks", False) if "claims" in group else True
    for text, while_writing in consolidated_findings(document, group,
                                                     n_frames if one_writer else None, url):
        found.add(text, while_writing)
    spec = group.attrs.get("codec", {}).get("spec", "lossless")
    for name in STATE_VARS:
        if name in group:
            _check_state(group[name], name, n_frames, report, spec)
    found.findings += [_Finding(text) for text in report.problems]
    report.problems.clear()
    found.moved = not np.array_equal(np.asarray(group["n_frames"][:]), report.n_frames)


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

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

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zarr

from flyarchive import codecs
from flyarchive.errors import ArchiveNotFoundError, FlyarchiveError, StorageError
from flyarchive.schema import (
    DERIVED_ATTR,
    STATE_VARS,
    damage_advice,
    derived_source_url,
    import_status,
    is_state,
    is_world_var,
    n_frames_problem,
    sizes_problem,
    times_problem,
    validate,
    validate_derived,
)
from flyarchive.store.claims import live_claims
from flyarchive.store.consolidated import (
    WHILE_WRITING,
    consolidated_behind,
    consolidated_findings,
    root_document,
)
from flyarchive.store.coordinates import lost_markers_problem
from flyarchive.models.kept import model_problems
from flyarchive.zarr_internals import default_buffer_prototype
from flyarchive.store.chunk_holes import missing_chunks, stored_whole
from flyarchive.store.opener import open_for_reading
from flyarchive.store.reader import (
    block_damage,
    damaged_chunks,
    state_blocks,
    stored_dataset,
    time_extents,
)

_PROTOTYPE = default_buffer_prototype()
#: Most passes over an archive that a writer changes while it is read.
PASSES = 3
#: What a refusal of metadata flyarchive does not write says (:mod:`~flyarchive.store.allowlist`).
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
        derived: The derived groups checked (``derived/<name>``, each as a derived group is
            checked), or, for a derived group, ``[]``.
        is_derived: True when ``url`` is a derived group (checked against the archive it
            is kept beside, when it is kept beside one).
        notes: What is worth knowing and is not damage (a derived group computed with a
            model the caller passed, one whose creation was interrupted...).
    """

    url: str
    n_worlds: int = 0
    n_frames: list[int] = field(default_factory=list)
    frames_checked: int = 0
    problems: list[str] = field(default_factory=list)
    writer: str | None = None
    being_written: list[str] = field(default_factory=list)
    passes: int = 1
    derived: list[str] = field(default_factory=list)
    is_derived: bool = False
    notes: list[str] = field(default_factory=list)

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
    """Read every committed frame of an archive, and of every derived group kept beside it,
    and report what is wrong.

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
    :mod:`~flyarchive.models.check`, its verdict kept by hash). Safe beside a writer
    (see the module's text).

    Each derived group under ``derived/`` (kept positions...) gets the same checks, its
    labels and provenance checked (:func:`flyarchive.schema.validate_derived`), and is
    held to the archive (:func:`flyarchive.store.derived.source_problems`: the same
    ``archive_id``, layout and worlds, no frame committed that the archive has not, the
    same times); its problems are listed as ``derived/<name>: ...``, with what to do. A
    derived group's own URL (``<archive>/derived/<name>``) is verified the same way.

    Raises:
        ArchiveNotFoundError: nothing at ``url``.
        StorageError: the storage did not answer, or refused access (one line, the fix).
    """
    from flyarchive.store.derived import BESIDE
    from flyarchive.store.storage_errors import translated

    with translated(url, storage_options):  # a stalled server said as flyarchive says it
        report = _verify_one(url, storage_options, BESIDE)
        if report.problems and not report.is_derived and _interrupted(url, storage_options):
            report.problems = [
                "Its creation was interrupted before anything was committed (no n_frames "
                "marker, no recorded frame): nothing is lost. Record into it with mode='a' "
                "(it is created anew), or replace it with mode='w'."]
            return report
        if not report.is_derived:
            _verify_derived(url, storage_options, report)
        elif report.problems:
            report.problems.append(_advice(url, storage_options))
    return report


def _verify_one(url: str, storage_options: Mapping[str, Any] | None,
                source: Any) -> VerifyReport:
    """One archive or derived group (``source``: what it is checked against, see
    :func:`flyarchive.store.derived.open_derived`), read again while a writer changes it."""
    for attempt in range(1, PASSES + 1):
        writers = _writers(url, storage_options)
        found = _one_pass(url, storage_options, source)
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


def _verify_derived(url: str, storage_options: Mapping[str, Any] | None,
                    report: VerifyReport) -> None:
    """Each derived group kept beside the archive at ``url``, verified; its findings added
    to ``report`` as ``derived/<name>: ...``."""
    from flyarchive.store.derived import DerivedSource, derived_names, derived_url

    names = derived_names(url, storage_options)
    if not names:
        return
    try:
        source = DerivedSource.read(url, storage_options)
    except (FlyarchiveError, OSError):  # the archive's own findings say why
        source = None
    for name in names:
        group_url, where = derived_url(url, name), f"derived/{name}"
        report.derived.append(where)
        try:
            sub = _verify_one(group_url, storage_options, source)
        except ArchiveNotFoundError:
            if _interrupted(group_url, storage_options):
                report.notes.append(f"{where} is empty (a creation that was undone); it can "
                                    "be deleted.")
                continue
            report.problems.append(
                f"{where}: it is not a derived group (no zarr.json); flyarchive keeps only "
                f"derived groups in {url.rstrip('/')}/derived/. Delete it, or restore its "
                "zarr.json from a backup.")
            continue
        if sub.problems and _interrupted(group_url, storage_options):
            report.notes.append(f"{where}: its creation was interrupted before anything was "
                                "committed; the command that made it makes it anew.")
            continue
        report.problems += [f"{where}: {problem}" for problem in sub.problems]
        report.being_written += [f"{where}: {text}" for text in sub.being_written]
        report.notes += [f"{where}: {note}" for note in sub.notes]
        if sub.problems:
            report.problems.append(f"{where}: {_advice(group_url, storage_options)}")


def _interrupted(url: str, storage_options: Mapping[str, Any] | None) -> bool:
    """Whether the archive or derived group at ``url`` is a creation that never committed: no
    ``n_frames`` and no chunk of a state array (an empty folder, or one whose arrays were
    being made when its writer died)."""
    from flyarchive.store.location import open_store, sync

    store = open_store(url, storage_options, read_only=True)

    async def look() -> bool:
        if await store.exists("n_frames/zarr.json"):
            return False
        names = [n async for n in store.list_dir("")
                 if n not in ("claims", "zarr.json") and not n.endswith(".partial")]
        if not await store.exists("zarr.json"):
            return not names  # an empty folder (a creation undone), or something else
        for name in names:
            raw = await store.get(f"{name}/zarr.json", prototype=_PROTOTYPE)
            if raw is None and name in ("n_frames", "models"):  # written with their zarr.json:
                continue  # n_frames' zeros, the kept models' bytes
            if raw is None:  # not an array of a creation: anything in it but a temporary
                async for key in store.list_prefix(f"{name}/"):  # file is something else
                    if not key.endswith(".partial"):
                        return False
                continue
            try:
                dims = json.loads(raw.to_bytes()).get("dimension_names")
            except (ValueError, AttributeError):
                return False  # damaged metadata is not an interrupted creation
            if not isinstance(dims, list) or is_state(dims):
                async for _ in store.list_prefix(f"{name}/c/"):
                    return False
        return True

    try:
        return bool(sync(look()))
    except (OSError, FlyarchiveError):
        return False


def _advice(url: str, storage_options: Mapping[str, Any] | None) -> str:
    """What to do about a damaged derived group (its attributes read if they can be)."""
    try:
        attrs = open_for_reading(url, storage_options, consolidated=False,
                                 attributes_only=True).attrs.asdict()
    except Exception:  # noqa: BLE001 - unreadable: the positions keeper's advice
        attrs = {DERIVED_ATTR: {"kind": "positions"}}
    if not isinstance(attrs.get(DERIVED_ATTR), Mapping):
        attrs = {DERIVED_ATTR: {"kind": "positions"}}
    return damage_advice(url, attrs)


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


def _one_pass(url: str, storage_options: Mapping[str, Any] | None, source: Any) -> _Pass:
    found = _Pass(VerifyReport(str(url)))
    try:
        group = open_for_reading(url, storage_options, consolidated=False, check_copy=False)
        document = root_document(group)  # the copy first: then nothing read later is behind it
    except FlyarchiveError as err:
        if isinstance(err, (FileNotFoundError, StorageError)):  # interop: not the archive's fault
            raise
        found.schema(err)
        return found
    except Exception as err:  # unreadable metadata
        found.schema(err, "Metadata unreadable")
        return found
    derived = DERIVED_ATTR in group.attrs
    found.report.is_derived = derived
    try:
        arrays = sorted(group.arrays())
    except Exception:  # a member's zarr.json that is not JSON (zarr raises what it hit)
        found.add(f"Metadata unreadable: {_unreadable_members(group)}")
        return found
    for name, arr in arrays:
        if not is_state(_dims(arr)):  # coordinates, commit markers, world variables
            for bad in damaged_chunks(arr):
                found.add(
                    f"Unreadable: {bad.describe()}: {getattr(bad.error, 'reason', bad.error)}")
        if is_world_var(name, _dims(arr)):
            _check_whole(arr, name, str(url), found)
    if found.findings:
        return found
    sizes = sizes_problem({n: (_dims(a), a.shape) for n, a in group.arrays()})  # as readers check it
    if sizes is not None:
        found.add(f"Schema: {sizes}", f"Schema: {sizes} {WHILE_WRITING}")
        return found
    try:
        (validate_derived if derived else validate)(stored_dataset(group))
    except FlyarchiveError as err:
        found.schema(err)
        return found
    except Exception as err:  # unreadable metadata or coordinates
        found.schema(err, "Metadata unreadable")
        return found
    _check_committed(group, document, str(url), found)
    if derived:
        _check_source(group, str(url), storage_options, source, found)
    return found


def _unreadable_members(group: zarr.Group) -> str:
    """The members of ``group`` whose metadata cannot be read, in a sentence with the fix."""
    bad = []
    for name in sorted(_member_names(group)):
        try:
            group[name]
        except KeyError:
            continue
        except Exception as err:
            bad.append(f"{name}/zarr.json ({type(err).__name__}: {str(err)[:120]})")
    where = ", ".join(bad) if bad else "a member's zarr.json"
    return (f"{where} cannot be read as zarr metadata. Restore the file from a backup (or the "
            "member, if flyarchive can write it again: `flyarchive positions` for a derived "
            "group).")


def _member_names(group: zarr.Group) -> list[str]:
    from flyarchive.store.location import sync

    async def names() -> list[str]:
        return [name async for name in group.store.list_dir(group.path)]

    try:
        return [n for n in sync(names()) if n != "zarr.json"]
    except Exception:
        return []


def _dims(arr: zarr.Array) -> tuple[str, ...]:
    return tuple(arr.metadata.dimension_names or ())


def _check_whole(arr: zarr.Array, name: str, url: str, found: _Pass) -> None:
    """A world variable's chunks, each there: a missing one is damage when the variable is
    stored whole (:data:`~flyarchive.schema.WHOLE_ATTR`), else (written before flyarchive
    marked them) a note: its reads give the fill value there."""
    for file, start, stop in missing_chunks(arr):
        worlds = (f"world indices {start}..{stop - 1}" if stop - start > 1
                  else f"world index {start}")
        if stored_whole(arr):
            found.add(
                f"Missing: world variable {name!r} [{worlds}] (file {file}): world "
                "variables are stored whole, so the file was deleted or lost. Restore it from "
                f"a backup, or store the variable again: `flyarchive set-world-var {url} "
                f"{name}=V1,V2,... --overwrite` (flyarchive.add_world_vars(..., overwrite=True); "
                f"gait measures: `flyarchive gait {url} --save`).")
        else:
            found.report.notes.append(
                f"World variable {name!r} has no file {file} ({worlds}): it was "
                f"written before flyarchive stored world variables whole, and reads there "
                f"give its fill value ({arr.fill_value!r}), which is what its writer skipped "
                "storing, or a lost file. If those worlds' values were not all "
                f"{arr.fill_value!r}, restore the file from a backup; storing the variable "
                "again (add_world_vars(..., overwrite=True)) protects it.")


def _check_source(group: zarr.Group, url: str, storage_options: Mapping[str, Any] | None,
                  source: Any, found: _Pass) -> None:
    """A sound derived group held to the archive it is kept beside (``source``; the
    default ``"beside"``: read here when ``url`` is ``<archive>/derived/<name>``)."""
    from flyarchive.store.dataset import read_header
    from flyarchive.store.derived import (
        BESIDE,
        DerivedSource,
        foreign_problem,
        model_note,
        source_problems,
    )

    if source == BESIDE:
        archive = derived_source_url(url)
        try:
            source = DerivedSource.read(archive, storage_options) if archive else None
        except (FlyarchiveError, OSError) as err:
            found.report.notes.append(f"Its archive at {archive!r} could not be read to check it "
                                      f"against ({err}); verify the archive.")
            return
    if source is None:
        return
    foreign = foreign_problem(group.attrs.asdict(), source)
    if foreign is not None:
        found.add(f"It {foreign}")
        return
    try:
        kept = read_header(url, storage_options, group)
    except FlyarchiveError as err:  # found above, or moved since it was read
        if not found.findings:
            found.add(str(err), f"{err} ({WHILE_WRITING})")
        return
    for problem in source_problems(kept, source):
        found.add(problem)
    note = model_note(group.attrs.asdict(), source)
    if note is not None:
        found.report.notes.append(f"{note[0].upper()}{note[1:]}")


def _check_committed(group: zarr.Group, document: Mapping[str, Any] | None, url: str,
                     found: _Pass) -> None:
    """Everything that depends on ``n_frames``: read once, before the arrays' extents and
    chunks, and again at the end (``found.moved``: a writer committed meanwhile)."""
    report = found.report
    if DERIVED_ATTR not in group.attrs:  # a derived group keeps no model of its own
        report.problems += model_problems(group, str(url))  # the model kept by content, if any
    status = import_status(group.attrs.asdict())
    if status is not None and status != "complete":
        found.add(status, f"{status} ({WHILE_WRITING})")
    n_frames = np.asarray(group["n_frames"][:])
    n_time = min(time_extents(group).values())  # read after n_frames: never behind it
    report.n_worlds, report.n_frames = len(n_frames), [int(n) for n in n_frames]
    committed = n_frames_problem(n_frames, n_time)  # readers refuse what this finds
    lost = lost_markers_problem(dict(group.arrays()), n_frames) if committed is None else None
    if lost is not None:
        found.add(f"{lost[0].upper()}{lost[1:]} Restore the file from a backup.")
    if committed is not None:
        found.add(committed, f"{committed} {WHILE_WRITING}")
        n_frames = n_frames.clip(0, n_time)
    _check_time(group, int(n_frames.max(initial=0)), report)
    one_writer = not group["claims"].attrs.get("world_blocks", False) if "claims" in group else True
    trusted = one_writer and lost is None  # else the copy cannot be checked against them
    for text, while_writing in consolidated_findings(document, group,
                                                     n_frames if trusted else None, url):
        found.add(text, while_writing)
    behind = consolidated_behind(document, n_frames) if trusted else None
    if behind is not None:
        report.notes.append(
            f"Its consolidated metadata gives {behind} frames of 'time' of the "
            f"{int(n_frames.max(initial=0))} committed (a writer stopped between a commit "
            "and its last step): xarray.open_zarr and other readers of that copy show "
            f"{behind} until the archive is next appended to (mode='a'), which rewrites it; "
            "flyarchive's readers read every committed frame.")
    # (a derived group's values are not quantized: one kept before it stopped copying its
    # archive's codec attribute says the archive's)
    spec = "lossless" if DERIVED_ATTR in group.attrs else \
        group.attrs.get("codec", {}).get("spec", "lossless")
    for i, name in enumerate(state_names(group)):
        _check_state(group[name], name, n_frames, report, spec, count=i == 0)
    found.findings += [_Finding(text) for text in report.problems]
    report.problems.clear()
    found.moved = not np.array_equal(np.asarray(group["n_frames"][:]), report.n_frames)


def state_names(group: zarr.Group) -> list[str]:
    """The group's state arrays, dims ``(world, time, ...)``
    (:func:`flyarchive.schema.is_state`): an archive's ``qpos`` and mocap poses in
    that order, a derived group's ``position``, ``orientation``..."""
    found = {name for name, arr in group.arrays() if is_state(_dims(arr))}
    return [n for n in STATE_VARS if n in found] + sorted(found - set(STATE_VARS))


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


def _check_state(arr: zarr.Array, name: str, n_frames: np.ndarray, report: VerifyReport,
                 spec: str, *, count: bool) -> None:
    for w0, w1, t0, t1, values in state_blocks(arr, n_frames):
        damage, good = block_damage(arr, name, n_frames, w0, w1, t0, t1, values)
        if damage is not None:
            report.problems.append(damage.text)
        if isinstance(values, Exception):
            continue
        if spec != "lossless" and not codecs.on_grid(values[good], spec).all():
            report.problems.append(
                f"{name} in worlds {w0}..{w1 - 1}, frames {t0}..{t1 - 1} holds values off the "
                f"quantization grid of codec {spec!r}: the error bound is not guaranteed."
            )
        if count:
            report.frames_checked += int(good.sum())

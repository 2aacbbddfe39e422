"""NWB files of an archive's worlds (``flyarchive export-poses --format nwb``): one file per
world, which NWB's own checker (nwbinspector) passes when the lab's metadata is given.

Each ``world<id>.nwb`` holds:

- the session: ``session_start_time`` the recording's start (the archive's ``created``
  attribute, set when the archive was created: UTC, seconds), ``identifier``
  ``world<id>-<archive_id>`` (unique per archive and world; movement names the individual
  after it), and the NWBFile fields of the metadata;
- the subject: ``subject_id`` ``world<id>-<first 8 hex digits of archive_id>`` (or the
  metadata's ``subject_id`` with ``-world<id>`` appended: one file is one world is one
  subject), species "Drosophila melanogaster" for NeuroMechFly (its joints are named
  ``nmf/...``) and none otherwise, sex ``"U"`` (unknown), no age; the metadata's fields
  replace these;
- in the ``behavior`` processing module: ``ndx_pose.Skeletons`` and ``PoseEstimation``
  (one ``PoseEstimationSeries`` per keypoint, ``/`` in a label becomes ``.``, unit
  ``meters`` with the ``conversion`` of the model's length unit, a ``rate`` when the
  frames are evenly spaced, else ``timestamps``); ``JointAngles`` (a
  ``BehavioralTimeSeries``: one ``TimeSeries`` per hinge joint, radians, read from the
  archive's ``qpos``), ``JointDisplacements`` (one per slide joint, meters with the
  ``conversion`` of the model's length unit) and ``JointOrientations`` (one per ball
  joint, its quaternion ``(T, 4)`` w, x, y, z) when the source is an archive (a free
  joint's pose is its body's: a keypoint); ``world_variables`` (a one-row
  ``DynamicTable`` of the world's ``(world,)`` variables: seed, success, gait measures...);
- ``intervals/leg_phases``: every stance and swing of each leg as a ``TimeIntervals``
  table (columns ``leg``, ``phase``, ``complete``; :func:`flyarchive.gait_epochs`), for
  NeuroMechFly, unless no leg changed phase (every interval would start at the first
  frame, which NWB's checker calls an error).

**Metadata** (:class:`NwbMetadata`, a YAML file or a mapping) uses pynwb's own names:
NWBFile fields at the top (:data:`NWBFILE_FIELDS`), the subject's under ``subject``
(:data:`SUBJECT_FIELDS`)::

    session_description: NeuroMechFly walking on flat ground, 4096 worlds
    experimenter: [Doe, Jane]
    lab: Fly Lab
    institution: Example University
    subject: {species: Drosophila melanogaster, age: P3D, sex: F, genotype: wild type}

An age is an ISO 8601 duration (``P3D``) or a range (``P2D/P5D``, ``P2D/``); a date of
birth a YAML date or ISO 8601 text. Unknown fields, wrong types, another age and a sex
that is not ``M``, ``F``, ``U`` or ``O`` are refused before anything is written.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from flyarchive.clock import frame_rate
from flyarchive.errors import OptionsError

if TYPE_CHECKING:
    import pandas as pd
    import xarray as xr

#: NWBFile fields a metadata file may set: name -> what it must be.
NWBFILE_FIELDS: dict[str, str] = {
    "session_description": "text", "experiment_description": "text",
    "experimenter": "text or list of text", "lab": "text", "institution": "text",
    "session_id": "text", "keywords": "list of text",
    "related_publications": "text or list of text", "protocol": "text", "notes": "text",
    "data_collection": "text", "stimulus_notes": "text", "pharmacology": "text",
    "surgery": "text", "virus": "text", "source_script": "text",
}
#: Subject fields a metadata file may set under ``subject``: name -> what it must be.
SUBJECT_FIELDS: dict[str, str] = {
    "subject_id": "text", "species": "text",
    "age": "text (ISO 8601 duration, e.g. P3D, or a range P2D/P5D, or P2D/ with no upper bound)",
    "date_of_birth": "a date (2026-12-01) or date and time (2026-12-01T09:00:00+01:00)",
    "sex": "M, F, U or O", "genotype": "text", "strain": "text", "description": "text",
    "weight": "text (e.g. 0.8 mg)",
}
_SEXES = ("M", "F", "U", "O")
_AGE = re.compile(r"^P(?!$)(\d+(\.\d+)?Y)?(\d+(\.\d+)?M)?(\d+(\.\d+)?W)?(\d+(\.\d+)?D)?"
                  r"(T(?=\d)(\d+(\.\d+)?H)?(\d+(\.\d+)?M)?(\d+(\.\d+)?S)?)?$")
NMF_SPECIES = "Drosophila melanogaster"


@dataclass(frozen=True)
class NwbMetadata:
    """What a lab says about its NWB files, checked.

    Attributes:
        nwbfile: NWBFile fields (:data:`NWBFILE_FIELDS`), lists as lists.
        subject: Subject fields (:data:`SUBJECT_FIELDS`).
        source: Where they came from (a file name, or ``"metadata"``), for messages.
    """

    nwbfile: dict[str, Any] = field(default_factory=dict)
    subject: dict[str, Any] = field(default_factory=dict)
    source: str = "metadata"

    @classmethod
    def load(cls, metadata: str | os.PathLike[str] | Mapping[str, Any] | None) -> NwbMetadata:
        """From a YAML file or a mapping (None: none).

        Raises:
            OptionsError: a file that cannot be read or parsed, not a mapping at the
                top, unknown fields, or values of the wrong type or form.
        """
        if metadata is None:
            return cls()
        if isinstance(metadata, Mapping):
            return cls._checked(dict(metadata), "metadata")
        path = Path(metadata).expanduser()
        try:
            import yaml
        except ImportError as err:
            from flyarchive.errors import missing_dependency

            raise missing_dependency("pyyaml", "nwb", "Reading NWB metadata", cause=err) from None
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as err:
            raise OptionsError(f"Cannot read the metadata file {str(path)!r}: "
                               f"{err.strerror or err}.") from None
        except UnicodeDecodeError as err:
            raise OptionsError(
                f"The metadata file {str(path)!r} is not UTF-8 text (byte {err.start}: "
                f"{err.object[err.start:err.start + 1]!r}). Save it as UTF-8.") from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            raise OptionsError(f"The metadata file {str(path)!r} is not valid YAML{where}: "
                               f"{getattr(err, 'problem', None) or err}.") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise OptionsError(
                f"The metadata file {str(path)!r} holds a {type(loaded).__name__}; it must be "
                "a mapping of NWBFile fields (session_description: ..., subject: {...}).")
        return cls._checked(loaded, repr(str(path)))

    @classmethod
    def _checked(cls, raw: dict[str, Any], source: str) -> NwbMetadata:
        subject = raw.pop("subject", None) or {}
        if not isinstance(subject, dict):
            raise OptionsError(f"{source}: subject must be a mapping of Subject fields "
                               f"({', '.join(SUBJECT_FIELDS)}), got {subject!r}.")
        for given, allowed, where in ((raw, NWBFILE_FIELDS, ""), (subject, SUBJECT_FIELDS,
                                                                  "subject.")):
            unknown = [str(k) for k in given if k not in allowed]
            if unknown:
                from flyarchive.errors import did_you_mean

                raise OptionsError(
                    f"{source}: unknown field {where}{unknown[0]}"
                    f"{'' if len(unknown) == 1 else f' (and {len(unknown) - 1} more)'}."
                    f"{did_you_mean(unknown[0], allowed)} Fields{' of subject' if where else ''}"
                    f": {', '.join(allowed)}{'' if where else ', subject'} (pynwb's names).")
        nwbfile = {name: _value(source, name, value, NWBFILE_FIELDS[name])
                   for name, value in raw.items()}
        checked = {name: _value(source, f"subject.{name}", value, SUBJECT_FIELDS[name])
                   for name, value in subject.items()}
        if "sex" in checked and checked["sex"] not in _SEXES:
            raise OptionsError(f"{source}: subject.sex must be one of {', '.join(_SEXES)} (NWB's "
                               f"codes), got {checked['sex']!r}.")
        if "age" in checked and not _is_age(checked["age"]):
            raise OptionsError(f"{source}: subject.age must be an ISO 8601 duration such as "
                               f"'P3D' (3 days) or 'P1W2D', or a range of two, the shorter first "
                               f"('P2D/P5D'; 'P2D/' without an upper bound), got "
                               f"{checked['age']!r}.")
        return cls(nwbfile, checked, source)


def _is_age(text: str) -> bool:
    """An ISO 8601 duration, or a range ``lower/upper`` (``lower/``: no upper bound), as NWB
    gives an age; a range's upper bound longer than its lower one (as nwbinspector asks)."""
    lower, slash, upper = text.partition("/")
    if not _AGE.match(lower) or (slash and upper and not _AGE.match(upper)):
        return False
    return not (slash and upper) or _seconds(upper) > _seconds(lower)


#: Seconds of each ISO 8601 duration unit (a year and a month on average).
_UNIT_S = {"Y": 365.2425 * 86400, "M": 30.436875 * 86400, "W": 7 * 86400, "D": 86400,
           "H": 3600, "TM": 60, "S": 1}


def _seconds(duration: str) -> float:
    """About how long an ISO 8601 duration (matched by ``_AGE``) is, in seconds."""
    date, _, time = duration[1:].partition("T")
    total = 0.0
    for part, prefix in ((date, ""), (time, "T")):
        for number, unit in re.findall(r"(\d+(?:\.\d+)?)([YMWDHS])", part):
            key = "TM" if prefix and unit == "M" else unit
            total += float(number) * _UNIT_S[key]
    return total


def _birth(source: str, value: Any) -> datetime:
    """A date of birth (a YAML date or datetime, or ISO 8601 text) as an aware datetime (a
    day at midnight; UTC when no zone is given), as pynwb's Subject takes it."""
    from datetime import date

    when = value
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value)
        except ValueError:
            when = None
    elif isinstance(value, date) and not isinstance(value, datetime):
        when = datetime(value.year, value.month, value.day)
    if not isinstance(when, datetime):
        raise OptionsError(f"{source}: subject.date_of_birth must be "
                           f"{SUBJECT_FIELDS['date_of_birth']}, got {value!r}.")
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def _value(source: str, name: str, value: Any, kind: str) -> Any:
    """``value`` if it is what ``kind`` says (text, or a list of text), else an error."""
    if name.endswith("date_of_birth"):
        return _birth(source, value)
    lists = kind.startswith("list") or "or list" in kind
    if isinstance(value, str) and not kind.startswith("list"):
        return value
    if lists and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise OptionsError(f"{source}: {name} must be {kind}, got {type(value).__name__} {value!r}."
                       + (" Quote it in YAML to make it text." if isinstance(
                           value, (int, float, bool)) else ""))


@dataclass(frozen=True)
class ArchiveFacts:
    """What an NWB file says about the archive it came from.

    Attributes:
        url: The source's URL.
        archive_id: The archive's id (its ``archive_id`` attribute, or one made from the
            URL and ``created`` for an archive without it).
        created: When the recording started (UTC).
        neuromechfly: Its model is NeuroMechFly (joints named ``nmf/...``).
        qpos: The archive's ``qpos`` ``(world, time, dof)`` (lazy), or None (positions
            kept as an archive of their own).
        hinges: The hinge joints' dof labels.
        slides: The slide joints' dof labels.
        balls: The ball joints' names (their dofs ``<name>/qw`` ... ``<name>/qz``).
        world_vars: ``{name: (values by world, description)}``.
        epochs: Stance and swing intervals (:func:`flyarchive.gait_epochs`), or None.
        recorded: ``created`` is when the states were recorded (False: when positions
            were kept as an archive of their own; the recording's start is unknown).
    """

    url: str
    archive_id: str
    created: datetime
    neuromechfly: bool
    qpos: xr.DataArray | None = None
    hinges: tuple[str, ...] = ()
    slides: tuple[str, ...] = ()
    balls: tuple[str, ...] = ()
    world_vars: dict[str, tuple[dict[int, Any], str]] = field(default_factory=dict)
    epochs: pd.DataFrame | None = None
    recorded: bool = True


def archive_facts(url: str, ds: xr.Dataset, epochs: pd.DataFrame | None, *,
                  recorded: bool = True) -> ArchiveFacts:
    """The facts of an opened archive, or of positions kept as an archive of their own
    (``recorded=False``: no qpos, no world variables, ``created`` is when they were kept)."""
    attrs = ds.attrs
    created = _created(attrs.get("created"))
    archive_id = str(attrs.get("archive_id") or hashlib.sha256(
        f"{url}\0{attrs.get('created')}".encode()).hexdigest()[:32])
    layout = attrs.get("layout") if isinstance(attrs.get("layout"), dict) else {}
    names = [str(n) for n in layout.get("joint_names", [])]
    kinds = [str(k) for k in layout.get("joint_types", [])]
    nmf = any(n.startswith("nmf/") for n in names) or \
        any(str(k).startswith("nmf/") for k in ds.coords.get("keypoint", []))
    hinges, slides, balls = (tuple(n for n, k in zip(names, kinds) if k == kind)
                             for kind in ("hinge", "slide", "ball"))
    qpos = ds["qpos"] if "qpos" in ds and (hinges or slides or balls) else None
    world_vars: dict[str, tuple[dict[int, Any], str]] = {}
    for name, var in ds.data_vars.items():
        if var.dims == ("world",) and name != "n_frames":
            values = {int(w): v.item() if hasattr(v, "item") else v
                      for w, v in zip(ds.world.values, var.values)}
            text = str(var.attrs.get("description") or f"world variable {name!r} of the archive")
            units = var.attrs.get("units")
            world_vars[str(name)] = (values, f"{text} ({units})" if units else text)
    if qpos is None:
        hinges, slides, balls = (), (), ()
    return ArchiveFacts(url, archive_id, created, nmf, qpos, hinges, slides, balls,
                        world_vars, epochs, recorded)


def _created(text: Any) -> datetime:
    try:
        when = datetime.fromisoformat(str(text))
    except (TypeError, ValueError):
        return datetime(1970, 1, 1, tzinfo=timezone.utc)  # unknown: said in the description
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def nwb_file(path: str, world: int, values: np.ndarray, times: np.ndarray, labels: Sequence[str],
             conversion: float, facts: ArchiveFacts, metadata: NwbMetadata) -> None:
    """Write one world's NWB file at ``path`` (see the module's docstring).

    Args:
        path: The file to write.
        world: The world's id.
        values: ``(T, K, 3)`` its positions.
        times: ``(T,)`` their times, s.
        labels: The keypoints' labels.
        conversion: Metres per unit of ``values``.
        facts: The archive's.
        metadata: The lab's.
    """
    import ndx_pose
    import pynwb
    from pynwb.behavior import BehavioralTimeSeries

    names = [label.replace("/", ".") for label in labels]
    short = facts.archive_id[:8]
    defaults = {
        "session_description": f"Simulated kinematics of world {world} of the flyarchive "
                               f"archive {facts.url!r} (archive_id {facts.archive_id}), "
                               "positions by forward kinematics" + (
                                   "" if facts.recorded else "; session_start_time is when "
                                   "these positions were kept: the recording's is unknown"),
    }
    nwbfile = pynwb.NWBFile(identifier=f"world{world}-{facts.archive_id}",
                            session_start_time=facts.created,
                            **{**defaults, **metadata.nwbfile})
    subject = {"subject_id": f"world{world}-{short}", "sex": "U",
               "description": f"world {world} of a simulation (flyarchive archive "
                              f"{facts.archive_id})",
               **({"species": NMF_SPECIES} if facts.neuromechfly else {})}
    subject.update(metadata.subject)
    if "subject_id" in metadata.subject:
        subject["subject_id"] = f"{metadata.subject['subject_id']}-world{world}"
    nwbfile.subject = pynwb.file.Subject(**subject)
    timing = _timing(times)
    # The poses are built here, not by movement.io.save_poses.to_nwb_file: movement (0.17,
    # and main at ae9a240) always gives each PoseEstimationSeries the frames' timestamps
    # (movement/io/nwb.py, ``timestamps=timestamps`` in _ds_to_pose_and_skeletons) and its
    # NWBFileSaveConfig cannot give a rate instead (pynwb: "Specifying rate and timestamps is
    # not supported."). nwbinspector (0.7) calls evenly spaced timestamps a best-practice
    # violation (check_regular_timestamps), once per keypoint; a simulation's frames are
    # evenly spaced, so its files would not be clean. Units, conversion and reference frame
    # it would carry (pose_estimation_series_kwargs).
    skeleton = ndx_pose.Skeleton(name=f"world{world}_skeleton", nodes=names,
                                 subject=nwbfile.subject)
    series = [ndx_pose.PoseEstimationSeries(
        name=name, description=f"keypoint {label!r} by forward kinematics of the model",
        data=values[:, k], confidence=np.ones(len(times)),
        confidence_definition="computed, not estimated: always 1",
        unit="meters", conversion=conversion,
        reference_frame="the model's world frame (MuJoCo, z up)", **timing)
        for k, (name, label) in enumerate(zip(names, labels))]
    pose = ndx_pose.PoseEstimation(name="PoseEstimation", pose_estimation_series=series,
                                   description=f"Positions of world {world} by forward kinematics",
                                   source_software="flyarchive", skeleton=skeleton)
    behavior = nwbfile.create_processing_module("behavior", "Simulated behaviour: keypoint "
                                                "positions, joint angles, world variables")
    behavior.add(ndx_pose.Skeletons(skeletons=[skeleton]))
    behavior.add(pose)
    if facts.qpos is not None:
        balls = [[f"{ball}/q{c}" for c in "wxyz"] for ball in facts.balls]
        dofs = [*facts.hinges, *facts.slides, *(d for ball in balls for d in ball)]
        qpos = np.asarray(facts.qpos.sel(world=world, dof=dofs)
                          .sel(time=times, method="nearest").values)
        column = {dof: k for k, dof in enumerate(dofs)}
        for kind, joints_, unit, extra in (
                ("JointAngles", facts.hinges, "radians", {}),
                ("JointDisplacements", facts.slides, "meters", {"conversion": conversion})):
            if joints_:
                joints = BehavioralTimeSeries(name=kind)
                for joint in joints_:
                    what = "angle of hinge" if unit == "radians" else "displacement of slide"
                    joints.add_timeseries(pynwb.TimeSeries(
                        name=joint.replace("/", "."), data=qpos[:, column[joint]], unit=unit,
                        description=f"{what} joint {joint!r} (qpos)", **extra, **timing))
                behavior.add(joints)
        if balls:
            joints = BehavioralTimeSeries(name="JointOrientations")
            for ball, quat in zip(facts.balls, balls):
                joints.add_timeseries(pynwb.TimeSeries(
                    name=ball.replace("/", "."), data=qpos[:, [column[d] for d in quat]],
                    unit="n.a.", description=f"orientation of ball joint {ball!r}: its unit "
                    "quaternion (w, x, y, z) in its parent's frame (qpos)", **timing))
            behavior.add(joints)
    if facts.world_vars:
        behavior.add(_world_table(world, facts.world_vars))
    if facts.epochs is not None and (facts.epochs.world == world).any() and \
            facts.epochs.start_time[facts.epochs.world == world].nunique() > 1:
        nwbfile.add_time_intervals(_leg_phases(facts.epochs, world))
    with pynwb.NWBHDF5IO(path, "w") as io:
        io.write(nwbfile)


def _timing(times: np.ndarray) -> dict[str, Any]:
    """``starting_time`` and ``rate`` when frames are evenly spaced, else ``timestamps``."""
    times = np.asarray(times, dtype=np.float64)
    if len(times) > 1:
        steps = np.diff(times)
        step = float(np.median(steps))
        if step > 0 and np.allclose(steps, step, rtol=1e-6, atol=1e-9):
            return {"starting_time": float(times[0]), "rate": frame_rate(step)}
    return {"timestamps": times}


def _world_table(world: int, variables: Mapping[str, tuple[dict[int, Any], str]]) -> Any:
    from hdmf.common import DynamicTable, VectorData

    columns = []
    for name, (values, text) in variables.items():
        value = values[world]
        value = value.decode() if isinstance(value, bytes) else value
        columns.append(VectorData(name=name, description=text, data=[value]))
    return DynamicTable(name="world_variables", description=(
        f"The archive's per-world variables (seed, success, gait measures...) of world "
        f"{world}"), columns=columns)


def _leg_phases(epochs: pd.DataFrame, world: int) -> Any:
    from pynwb.epoch import TimeIntervals

    rows = epochs[epochs.world == world].sort_values(["start_time", "leg"], kind="stable")
    table = TimeIntervals(name="leg_phases", description=(
        "Stance and swing of each leg: the tip low and still, or swinging (flyarchive.gait_epochs,"
        " thresholds of flyarchive.GaitParams)"))
    table.add_column("leg", "the leg (lf, lm, lh, rf, rm, rh)")
    table.add_column("phase", "stance or swing")
    table.add_column("complete", "both ends are events (not the recording's edge or a gap)")
    for r in rows.itertuples():
        table.add_row(start_time=float(r.start_time), stop_time=float(r.stop_time),
                      leg=str(r.leg), phase=str(r.phase), complete=bool(r.complete))
    return table

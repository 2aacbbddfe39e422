"""The ``flyarchive`` subcommands of analysis: ``positions``, ``gait`` and ``export-poses``
(added to the parser by :func:`add_commands`; :mod:`flyarchive.cli` runs them and gives
them its parsers of worlds, times and storage options, as :class:`CliTools`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flyarchive.errors import SelectionError


@dataclass(frozen=True)
class CliTools:
    """The command line's parsers the commands use (see :mod:`flyarchive.cli`)."""

    parse_worlds: Callable[[str], list[int]]
    parse_time: Callable[[str], tuple[float | None, float | None]]
    storage_options: Callable[[str | None], dict[str, Any] | None]

_KEYPOINTS_HELP = (
    "comma-separated keypoints: body names (nmf/c_thorax), site:NAME for a site, "
    "'tarsus-tips' for NeuroMechFly's six tarsus tips (nmf/lf_tip...), 'gait' for the points "
    "the gait functions and the viewer's gait panels read (flyarchive.gait_points: the thorax, "
    "its heading and the tips), 'bodies' for every body (the default when nothing is asked); "
    "repeatable")
_POINT_HELP = ("a point fixed in a body's frame: LABEL=BODY@X,Y,Z (offset in the model's length "
               "unit) or LABEL=BODY@tip (the end of the body's geoms); repeatable")


def parse_keypoints(keypoints: list[str] | None, points: list[str] | None) -> dict[str, Any]:
    """``--keypoints`` and ``--point`` texts as ``bodies``, ``sites``, ``points`` arguments.

    Raises:
        SelectionError: a point that is not ``LABEL=BODY@X,Y,Z`` or ``LABEL=BODY@tip``.
    """
    from flyarchive.analyze.gait import gait_points
    from flyarchive.analyze.keypoints import tarsus_tips

    bodies: list[str] = []
    sites: list[str] = []
    found: dict[str, Any] = {}
    for text in keypoints or []:
        for item in (part.strip() for part in text.split(",")):
            if item == "bodies":
                bodies.append("*")
            elif item == "tarsus-tips":
                found.update(tarsus_tips())
            elif item == "gait":
                found.update(gait_points())
            elif item.startswith("site:"):
                sites.append(item[len("site:"):])
            elif item:
                bodies.append(item)
    for text in points or []:
        label, eq, rest = text.partition("=")
        body, at, offset = rest.rpartition("@")
        if not eq or not at or not label.strip() or not body.strip():
            raise SelectionError(
                f"Cannot read the point {text!r}; write LABEL=BODY@X,Y,Z (e.g. "
                "lf_claw=nmf/lf_tarsus5@0,0,-0.1) or LABEL=BODY@tip.")
        if offset.strip() == "tip":
            found[label.strip()] = (body.strip(), "tip")
            continue
        try:
            xyz = tuple(float(v) for v in offset.split(","))
        except ValueError:
            xyz = ()
        if len(xyz) != 3:
            raise SelectionError(
                f"The point {text!r} has offset {offset!r}; write three numbers X,Y,Z or 'tip'.")
        found[label.strip()] = (body.strip(), xyz)
    # none named: None each, so that a call asks for its default (every kept keypoint...)
    return {"bodies": bodies or None, "sites": sites or None, "points": found or None}


def _path(text: str) -> str:
    return text if "://" in text else os.path.expanduser(text)


def _options(args: argparse.Namespace, name: str = "storage_options") -> dict[str, Any] | None:
    return args.tools.storage_options(getattr(args, name, None))


def _model(args: argparse.Namespace) -> Any:
    from flyarchive.models import load_model_file

    return load_model_file(_path(args.model)) if getattr(args, "model", None) else None


def _keypoint_args(args: argparse.Namespace) -> dict[str, Any]:
    return {**parse_keypoints(args.keypoints, args.point), "leg": args.leg,
            "segment": args.segment}


def _window(args: argparse.Namespace) -> dict[str, Any]:
    tools = args.tools
    return {"worlds": tools.parse_worlds(args.worlds) if args.worlds is not None else None,
            "time": tools.parse_time(args.time) if args.time else None}


def cmd_positions(args: argparse.Namespace) -> int:
    from flyarchive.analyze import keep_positions
    from flyarchive.render.diagnostics import progress_bar

    bars: list[Any] = []  # made at the first block (none drawn for a call that fails first)

    def progress(done: int, total: int) -> None:
        if not bars and not args.quiet:
            bars.append(progress_bar(total, True, what="positions"))  # tqdm: on stderr
        for bar in bars:
            bar.total = total
            bar.update(done - bar.n)

    repairs: list[str] = []

    def repairing(text: str) -> None:
        repairs.append(text)
        print(f"repairing: {text}", file=sys.stderr, flush=True)

    try:
        url = keep_positions(_path(args.url), **_keypoint_args(args),
                             to=_path(args.to) if args.to else None,
                             model=_model(args), storage_options=_options(args),
                             to_storage_options=_options(args, "to_storage_options"),
                             orientations=args.orientations, backend=args.backend,
                             overwrite=args.overwrite, takeover=args.takeover,
                             on_block=progress, on_repair=repairing)
    finally:
        for bar in bars:
            bar.close()
    if repairs:
        print(f"repaired and kept positions at {url} ({len(repairs)} repair"
              f"{'s' if len(repairs) > 1 else ''}: see above)")
    else:
        print(f"kept positions at {url}")
    return 0


def cmd_gait(args: argparse.Namespace) -> int:
    from flyarchive.analyze import GaitParams, gait_positions, gait_summary

    params = GaitParams(**{name: getattr(args, name) for name in _THRESHOLDS})
    tips = parse_keypoints(None, args.tip)["points"] or None
    where = {"thorax": args.thorax, "tips": tips, "model": _model(args),
             "storage_options": _options(args), "backend": args.backend, **_window(args)}
    for path in (args.steps, args.epochs):
        _check_table_path(path, args.overwrite)
    if args.save:  # the measures go into the archive: from its URL
        summary = gait_summary(_path(args.url), params=params, reference_leg=args.reference_leg,
                               window=args.window, save=True, overwrite=args.overwrite,
                               length_unit=args.length_unit, **where)
        positions = None
    else:  # computed once for the measures and the tables
        positions = gait_positions(_path(args.url), **where)
        summary = gait_summary(positions, params=params, reference_leg=args.reference_leg,
                               window=args.window, length_unit=args.length_unit)
    if args.steps or args.epochs:
        _write_tables(args, positions if positions is not None else _path(args.url),
                      params, {} if positions is not None else where)
    if args.json:
        print(json.dumps(_json_table(summary), indent=2))
    else:
        for line in _measure_table(summary):
            print(line)
    if args.save:
        print(f"saved {len(summary.data_vars)} world variables in {args.url}", file=sys.stderr)
    return 0


#: The thresholds of GaitParams the command line sets (--stance-height...).
_THRESHOLDS = ("stance_height", "stance_speed", "swing_height", "swing_speed", "min_stance",
               "min_swing", "smooth", "fall_height")


def _check_table_path(path: str | None, overwrite: bool) -> None:
    """--steps/--epochs: a .csv or .json file that does not exist (or --overwrite)."""
    if not path:
        return
    if "://" in path:
        raise SelectionError(f"--steps and --epochs write local files; {path!r} is a URL. Write "
                             "to a local path, then copy the file where it belongs.")
    target = os.path.expanduser(path)
    if os.path.splitext(target)[1].lower() not in (".csv", ".json"):
        raise SelectionError(f"Cannot tell the format of {path!r}: name a .csv or a .json file.")
    if os.path.isdir(target):
        raise SelectionError(f"{path!r} is a folder; name a .csv or a .json file.")
    from flyarchive.store.local_files import refuse_inside_archive

    refuse_inside_archive(target, "--steps and --epochs")
    if os.path.exists(target) and not overwrite:
        from flyarchive.errors import OutputExistsError

        raise OutputExistsError(f"{path!r} already exists; pass --overwrite to replace it. "
                                "Nothing was written.")


def _write_tables(args: argparse.Namespace, source: Any, params: Any,
                  where: dict[str, Any]) -> None:
    """--steps and --epochs: the tables as CSV or JSON (by the file's suffix), each
    written to a temporary name beside it and renamed."""
    from flyarchive.analyze import gait_epochs, gait_steps
    from flyarchive.store.local_files import write_whole

    for path, make in ((args.steps, gait_steps), (args.epochs, gait_epochs)):
        if not path:
            continue
        target = os.path.expanduser(path)
        suffix = os.path.splitext(target)[1].lower()
        table = make(source, params=params, length_unit=args.length_unit, **where)
        text = table.to_csv(index=False, float_format="%.9g") if suffix == ".csv" else \
            table.to_json(orient="records", indent=1)
        write_whole(Path(target), lambda tmp, text=text: Path(tmp).write_text(text))
        print(f"wrote {len(table)} rows to {path}", file=sys.stderr)


def _json_table(summary: Any) -> dict[str, Any]:
    def cells(values: Any) -> Any:
        if values.ndim == 2:
            return [cells(row) for row in values]
        return [None if v != v else round(float(v), 6) for v in values]

    out: dict[str, Any] = {"world": [int(w) for w in summary.world.values],
                           "individual": [str(i) for i in summary.individual.values]}
    if "window" in summary.dims:
        out["window"] = [float(w) for w in summary.window.values]
    out.update({name: cells(v.values) for name, v in summary.data_vars.items()})
    out["units"] = {name: v.attrs.get("units") for name, v in summary.data_vars.items()}
    out["descriptions"] = {name: v.attrs.get("description")
                           for name, v in summary.data_vars.items()}
    return out


def _measure_table(summary: Any, per_block: int = 6) -> list[str]:
    """One row per measure, whole name and unit; one column per world (six at a time),
    a block per window."""
    names = list(summary.data_vars)
    labels = [f"{name} [{summary[name].attrs.get('units', '')}]" for name in names]
    width = max(len(label) for label in labels)
    windows = list(summary.window.values) if "window" in summary.dims else [None]
    worlds = [int(w) for w in summary.world.values]
    lines: list[str] = []
    for k, start in enumerate(windows):
        part = summary if start is None else summary.isel(window=k)
        for first in range(0, len(worlds), per_block):
            shown = worlds[first:first + per_block]
            title = "" if start is None else f"window {float(start):g} s  "
            lines.append(f"{title:<{width}}  " + "  ".join(f"{'world ' + str(w):>11}"
                                                           for w in shown))
            for name, label in zip(names, labels):
                values = part[name].values[first:first + per_block]
                lines.append(f"{label:<{width}}  " + "  ".join(
                    f"{'-' if v != v else f'{v:.5g}':>11}" for v in values))
            lines.append("")
    return lines[:-1]


def cmd_export_poses(args: argparse.Namespace) -> int:
    from flyarchive.interop.poses import export_poses

    written = export_poses(_path(args.url), _path(args.to), format=args.format,
                           **_keypoint_args(args), model=_model(args),
                           storage_options=_options(args), length_unit=args.length_unit,
                           overwrite=args.overwrite,
                           metadata=_path(args.metadata) if args.metadata else None,
                           **_window(args))
    print(f"wrote {len(written)} file(s): {', '.join(written[:4])}{' ...' if len(written) > 4 else ''}")
    return 0


def add_commands(add: Callable[[str, Any, str], argparse.ArgumentParser],
                 storage: Callable[[argparse.ArgumentParser], None], tools: CliTools,
                 takeover: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add ``positions``, ``gait`` and ``export-poses`` with ``add(name, func, help)``
    (``storage(p)``, ``takeover(p)``: the command line's options of those names)."""
    from flyarchive.analyze import BACKENDS
    from flyarchive.analyze.gait_params import GaitParams

    def keypoints(p: argparse.ArgumentParser) -> None:
        p.add_argument("--keypoints", action="append", metavar="NAMES", help=_KEYPOINTS_HELP)
        p.add_argument("--point", action="append", metavar="LABEL=BODY@X,Y,Z", help=_POINT_HELP)
        p.add_argument("--leg", action="append", help="keep keypoints of these legs (lf, rh...)")
        p.add_argument("--segment", action="append",
                       help="keep keypoints of these segments (tibia, tarsus5, tip...)")

    def common(p: argparse.ArgumentParser) -> None:
        p.set_defaults(tools=tools)
        p.add_argument("url")
        p.add_argument("--model", help="MJCF .xml, spec zip (.mjz) or compiled .mjb (default: "
                       "the model kept in the archive)")
        p.add_argument("--backend", default="cpu", choices=BACKENDS,
                       help="cpu (MuJoCo, bit-exact), warp-cpu or gpu (mujoco-warp, float32)")
        storage(p)

    p = add("positions", cmd_positions,
            "Compute keypoint positions of every frame and keep them (beside the archive, "
            "or as an archive of their own with --to); resumable.")
    common(p)
    keypoints(p)
    p.add_argument("--to", help="write them as a new archive at this URL instead")
    p.add_argument("--to-storage-options", help="fsspec options of --to as JSON (default: --storage-options when --to is of the same protocol)")
    p.add_argument("--orientations", action="store_true", help="keep orientations too")
    p.add_argument("--overwrite", action="store_true",
                   help="replace other positions kept at --to (never a recording)")
    p.add_argument("--quiet", action="store_true", help="no progress")
    takeover(p)
    p = add("gait", cmd_gait, "Gait and locomotion measures per world (distance, speed, "
            "heading, height; per leg step frequency, duty factor, stance and swing, phase; "
            "tripod coordination and support patterns), and the steps themselves.")
    common(p)
    p.add_argument("--thorax", default="nmf/c_thorax",
                   help="the body whose path is the fly's (default nmf/c_thorax)")
    p.add_argument("--tip", action="append", metavar="LABEL=BODY@X,Y,Z",
                   help="a leg tip as a point (LABEL=BODY@X,Y,Z or LABEL=BODY@tip; repeatable; "
                        "default: NeuroMechFly's six tarsus tips)")
    p.add_argument("--worlds", help="e.g. 0,3,10-20 (default all)")
    p.add_argument("--time", help="START:END seconds of simulated time")
    p.add_argument("--length-unit", metavar="UNIT",
                   help="the model's length unit, for the measures' units (m, cm...; the "
                        "thresholds are in it too; default mm for NeuroMechFly's tips, "
                        "'model unit' with --tip)")
    defaults = GaitParams()
    for name, unit, text in (
            ("stance-height", "mm", "a tip lower than this may be in stance"),
            ("stance-speed", "mm/s", "a tip slower than this may be in stance"),
            ("swing-height", "mm", "a tip out of stance swings if it rises above this"),
            ("swing-speed", "mm/s", "...or moves faster than this"),
            ("min-stance", "s", "shorter stances between swings join them"),
            ("min-swing", "s", "shorter swings between stances join them"),
            ("smooth", "s", "positions are averaged over this long before speeds"),
            ("fall-height", "mm", "time_below counts the thorax lower than this")):  # (NMF's)
        default = getattr(defaults, name.replace("-", "_"))
        p.add_argument(f"--{name}", type=float, default=default,
                       help=f"{text}, {unit} (default {default:g})")
    p.add_argument("--reference-leg", help="the leg phases are measured against (default lf)")
    p.add_argument("--window", type=float,
                   help="seconds: measures per window of this length (default: whole selection)")
    p.add_argument("--save", action="store_true",
                   help="store the measures as world variables (for --where-world-var "
                        "'distance>5'); needs every world")
    p.add_argument("--steps", metavar="PATH.csv|PATH.json",
                   help="also write one row per step (lift-off, touchdown, durations, length)")
    p.add_argument("--epochs", metavar="PATH.csv|PATH.json",
                   help="also write every stance and swing interval per leg")
    p.add_argument("--overwrite", action="store_true", help="replace existing --steps/--epochs, "
                   "and with --save world variables of the measures' names that you added")
    p.add_argument("--json", action="store_true", help="print JSON")
    p = add("export-poses", cmd_export_poses,
            "Export keypoint positions as a movement poses dataset (netCDF) or NWB files "
            "(ndx-pose, one per world).")
    common(p)
    keypoints(p)
    p.add_argument("--format", required=True, choices=("movement", "nwb"))
    p.add_argument("--to", required=True, help="movement: the .nc file; nwb: a folder")
    p.add_argument("--worlds", help="e.g. 0,3,10-20 (default all)")
    p.add_argument("--time", help="START:END seconds of simulated time")
    p.add_argument("--length-unit", default="mm", choices=("mm", "cm", "m"),
                   help="the model's length unit (NWB stores metres; default mm)")
    p.add_argument("--overwrite", action="store_true", help="replace existing files")
    p.add_argument("--metadata", metavar="META.yaml",
                   help="NWB: NWBFile and Subject fields in pynwb's names (session_description, "
                        "experimenter, lab, institution, subject: {subject_id, species, age, "
                        "sex, genotype})")

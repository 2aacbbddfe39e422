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
    "'tarsus-tips' for NeuroMechFly's six tarsus tips (nmf/lf_tip...), 'bodies' for every "
    "body (the default when nothing is asked); repeatable")
_POINT_HELP = ("a point fixed in a body's frame: LABEL=BODY@X,Y,Z (offset in the model's length "
               "unit) or LABEL=BODY@tip (the end of the body's geoms); repeatable")


def parse_keypoints(keypoints: list[str] | None, points: list[str] | None) -> dict[str, Any]:
    """``--keypoints`` and ``--point`` texts as ``bodies``, ``sites``, ``points`` arguments.

    Raises:
        SelectionError: a point that is not ``LABEL=BODY@X,Y,Z`` or ``LABEL=BODY@tip``.
    """
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
    return {"bodies": bodies or None, "sites": sites, "points": found}


def _path(text: str) -> str:
    return text if "://" in text else os.path.expanduser(text)


def _options(args: argparse.Namespace, name: str = "storage_options") -> dict[str, Any] | None:
    return args.tools.storage_options(getattr(args, name, None))


def _model(args: argparse.Namespace) -> Any:
    from flyarchive.models import load_model

    return load_model(_path(args.model)) if getattr(args, "model", None) else None


def _keypoint_args(args: argparse.Namespace) -> dict[str, Any]:
    return {**parse_keypoints(args.keypoints, args.point), "leg": args.leg,
            "segment": args.segment}


def _window(args: argparse.Namespace) -> dict[str, Any]:
    tools = args.tools
    return {"worlds": tools.parse_worlds(args.worlds) if args.worlds else None,
            "time": tools.parse_time(args.time) if args.time else None}


def cmd_positions(args: argparse.Namespace) -> int:
    from flyarchive.analyze import keep_positions
    from flyarchive.render.diagnostics import progress_bar

    bar = progress_bar(0, not args.quiet, what="positions")  # tqdm: throttled, on stderr

    def progress(done: int, total: int) -> None:
        if bar is not None:
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
        if bar is not None:
            bar.close()
    if repairs:
        print(f"repaired and kept positions at {url} ({len(repairs)} repair"
              f"{'s' if len(repairs) > 1 else ''}: see above)")
    else:
        print(f"kept positions at {url}")
    return 0


def cmd_gait(args: argparse.Namespace) -> int:
    from flyarchive.analyze import GaitParams, gait_summary

    params = GaitParams(stance_height=args.stance_height, stance_speed=args.stance_speed,
                        fall_height=args.fall_height)
    tips = parse_keypoints(None, args.tip)["points"] or None
    summary = gait_summary(_path(args.url), thorax=args.thorax, tips=tips, params=params,
                           model=_model(args),
                           storage_options=_options(args), backend=args.backend,
                           save=args.save, **_window(args))
    table = {name: [None if v != v else round(float(v), 6) for v in values.values]
             for name, values in summary.data_vars.items()}
    worlds = [int(w) for w in summary.world.values]
    if args.json:
        print(json.dumps({"world": worlds, **table, "units": {
            n: v.attrs.get("units") for n, v in summary.data_vars.items()}}, indent=2))
    else:
        names = list(table)
        print("world  " + "  ".join(f"{n:>12.12}" for n in names))
        for i, w in enumerate(worlds):
            cells = ("-" if table[n][i] is None else f"{table[n][i]:.4g}" for n in names)
            print(f"{w:>5}  " + "  ".join(f"{c:>12}" for c in cells))
    if args.save:
        print(f"saved {len(table)} world variables in {args.url}", file=sys.stderr)
    return 0


def cmd_export_poses(args: argparse.Namespace) -> int:
    from flyarchive.interop.poses import export_poses

    written = export_poses(_path(args.url), _path(args.to), format=args.format,
                           **_keypoint_args(args), model=_model(args),
                           storage_options=_options(args),
                           length_unit=args.length_unit, overwrite=args.overwrite, **_window(args))
    print(f"wrote {len(written)} file(s): {', '.join(written[:4])}{' ...' if len(written) > 4 else ''}")
    return 0


def add_commands(add: Callable[[str, Any, str], argparse.ArgumentParser],
                 storage: Callable[[argparse.ArgumentParser], None], tools: CliTools,
                 takeover: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add ``positions``, ``gait`` and ``export-poses`` with ``add(name, func, help)``
    (``storage(p)``, ``takeover(p)``: the command line's options of those names)."""
    from flyarchive.analyze import BACKENDS

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
    p.add_argument("--to-storage-options", help="fsspec options of --to as JSON")
    p.add_argument("--orientations", action="store_true", help="keep orientations too")
    p.add_argument("--overwrite", action="store_true", help="replace what is at --to")
    p.add_argument("--quiet", action="store_true", help="no progress")
    takeover(p)
    p = add("gait", cmd_gait, "Gait and locomotion measures per world (distance, speed, "
            "heading, height, stance and swing per leg).")
    common(p)
    p.add_argument("--thorax", default="nmf/c_thorax",
                   help="the body whose path is the fly's (default nmf/c_thorax)")
    p.add_argument("--tip", action="append", metavar="LABEL=BODY@X,Y,Z",
                   help="a leg tip as a point (LABEL=BODY@X,Y,Z or LABEL=BODY@tip; repeatable; "
                        "default: NeuroMechFly's six tarsus tips)")
    p.add_argument("--worlds", help="e.g. 0,3,10-20 (default all)")
    p.add_argument("--time", help="START:END seconds of simulated time")
    p.add_argument("--stance-height", type=float, default=0.1,
                   help="a tip lower than this may be in stance, mm (default 0.1)")
    p.add_argument("--stance-speed", type=float, default=5.0,
                   help="a tip slower than this may be in stance, mm/s (default 5)")
    p.add_argument("--fall-height", type=float, default=0.6,
                   help="time_below counts the thorax lower than this, mm (default 0.6)")
    p.add_argument("--save", action="store_true",
                   help="store the measures as world variables (for --where-world-var "
                        "'distance>5')")
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

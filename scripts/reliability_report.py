"""Reliability report: killed writers, flaky S3, injected corruption, bad input.

Runs the harnesses of :mod:`flyarchive.testing` and prints one table:

- kills survived of kills made, per recording backend (CPU MuJoCo, mujoco-warp on
  Warp's CPU device), and frames lost per kill against the recorder's bound
  (:mod:`flyarchive.testing.kills`);
- S3 faults injected through the fault proxy (record, read, render) and their outcomes
  (:mod:`flyarchive.testing.flaky_s3`);
- corruptions injected into a local archive and whether ``flyarchive verify`` caught them;
- concurrent writers (:mod:`flyarchive.testing.concurrency`): recorders creating one URL,
  replacing one archive, or appending to one archive, started at the same instant (one
  winner, the others refused cleanly, the archive exactly the winner's), and a reader
  polling ``open_archive`` while a writer appends (no open reports damage, no frame read
  inside ``n_frames`` differs from the final data);
- import-npz / export-npz killed mid-way (:mod:`flyarchive.testing.interop_kills`): half-written
  files, leftovers after the rerun, interrupted imports reported partial and resumed.
- renders killed (SIGKILL), interrupted (Ctrl-C) or terminated (SIGTERM), in their own
  process and on a LocalCluster (:mod:`flyarchive.testing.render_kills`): mid-render, then
  rendered again with ``--overwrite``, or once the manifest lists a finished video, then
  continued with ``--resume`` (the listed videos kept untouched); half-written final
  videos, what was left behind before and after the next render into the same folder;
- metadata that drops checksums or decodes otherwise (:mod:`flyarchive.testing.checksums`),
  through every read path, local and S3 (0 accepted), and ``verify`` run beside a live
  writer (:mod:`flyarchive.testing.verify_beside`: 0 false alarms, damage still reported);
- hostile archives (:mod:`flyarchive.testing.hostile`: decompression bombs, FIFOs, links
  to ``/dev/zero``, metadata nested 200,000 deep...): each command run in a child with a
  3 GiB address-space cap, its time and peak memory; among them committed frames missing
  (a shard deleted, index entries never written: :mod:`flyarchive.testing.holes`), counted
  as the reads of them refused and passed off as data;
- crafted models (:mod:`flyarchive.testing.model_fuzz`): a kept model's bytes fuzzed, its
  hash matching, through ``render``, ``verify`` and ``load_kept_model`` in child processes:
  crashes of the calling process (none expected) and what the model check found;
- hostile output folders (:mod:`flyarchive.testing.hostile_outputs`: a manifest linked to
  ``/dev/zero`` or made a FIFO, folders linked out of ``--out``, map chunks and videos that
  are FIFOs or links...): a render into them or a read back from them, each in a child;
  cases, refused, followed (a link written or read through) and hung;
- bad inputs tried (``tests/bad_input``) and passed.

Usage::

    python scripts/reliability_report.py [--kills 20] [--backends cpu,warp]
        [--s3-trials 4] [--races 10] [--race-processes 3] [--interop-kills 6]
        [--render-kills 3] [--verify-runs 12] [--no-hostile] [--crafted-models 40]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402
from benchlib import (  # noqa: E402
    Column,
    Table,
    add_json_option,
    host_info,
    listed,
    nonnegative_int,
    write_json,
)

from flyarchive.testing.flaky_s3 import (  # noqa: E402
    S3_OUTCOMES,
    s3_read_trial,
    s3_record_trial,
    s3_render_trial,
)
from flyarchive.testing.kills import KillConfig, KillResult, kill_trial  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def run_kills(backend: str, n: int, chunk_frames: int, workdir: Path) -> dict[str, Any]:
    """``n`` seeded kill trials of one backend."""
    results: list[KillResult] = []
    for seed in range(n):
        config = KillConfig(backend=backend, seed=seed, chunk_frames=chunk_frames,
                            max_wait_frames=8 * chunk_frames)
        result = kill_trial(str(workdir / f"{backend}-{seed}.zarr"), config)
        results.append(result)
        status = "ok" if result.survived else "FAILED: " + "; ".join(result.problems)[:300]
        print(f"  kill {backend} #{seed}: recorded {result.recorded}, committed "
              f"{result.committed}, lost {result.frames_lost}: {status}", file=sys.stderr)
    lost = [r.frames_lost for r in results if r.killed]
    return {
        "backend": backend, "made": sum(r.killed for r in results),
        "survived": sum(r.killed and r.survived for r in results),
        "lost_min": min(lost, default=0), "lost_mean": float(np.mean(lost)) if lost else 0.0,
        "lost_max": max(lost, default=0),
        "bound": KillConfig(backend, chunk_frames=chunk_frames).max_lost,
        "problems": sorted({p.split(":")[0] for r in results for p in r.problems}),
        "trials": [r.to_json() for r in results],
    }


def run_s3(n: int) -> list[dict[str, Any]]:
    """``n`` trials each of record, read and render through the fault proxy."""
    from flyarchive import TrajectoryRecorder
    from flyarchive.testing import simulate, tiny_model
    from flyarchive.testing.faultproxy import FaultPlan
    from flyarchive.testing.s3 import S3Server

    rows = []
    with S3Server() as server:
        server.create_bucket("reliability")
        url = "s3://reliability/clean.zarr"
        model = tiny_model()
        with TrajectoryRecorder(url, model, chunk_frames=5,
                                storage_options=server.storage_options()) as recorder:
            simulate(model, 2, 56, recorder.record_as_needed)
        trials = {
            "record": lambda plan: s3_record_trial(
                server, plan, f"s3://reliability/{uuid.uuid4().hex}.zarr", n_frames=15),
            "read": lambda plan: s3_read_trial(server, plan, url),
            "render": lambda plan: s3_render_trial(server, plan, url),
        }
        for operation, trial in trials.items():
            results = []
            for seed in range(n):
                plan = FaultPlan(drop=0.04, error500=0.04, error503=0.04, delay=0.04,
                                 delay_s=0.05, seed=seed)
                result = trial(plan)
                results.append(result)
                print(f"  s3 {operation} #{seed}: {result.outcome} {result.error[:200]}",
                      file=sys.stderr)
            faults = {k: sum(r.faults.get(k, 0) for r in results)
                      for k in ("requests", "faults", "drop", "error500", "error503", "delay")}
            outcomes = {k: sum(r.outcome == k for r in results) for k in S3_OUTCOMES}
            errors = sorted({r.error.split("(")[0] for r in results if r.error})
            rows.append({"operation": operation, "trials": n, **faults, **outcomes,
                         "error_types": errors})
    return rows


def run_corruptions(workdir: Path) -> list[dict[str, Any]]:
    """Inject each corruption into a copy of a local archive; does verify (API and CLI) catch it?"""
    import zarr

    from flyarchive import TrajectoryRecorder
    from flyarchive.store.integrity import verify
    from flyarchive.testing import flip_bits, shard_file, simulate, tiny_model

    model = tiny_model()
    sound = workdir / "sound.zarr"
    with TrajectoryRecorder(str(sound), model, chunk_frames=5) as recorder:
        simulate(model, 2, 76, recorder.record_as_needed)

    def flip(root: Path) -> None:
        flip_bits(shard_file(str(root), "qpos", 0, 1), at=1 / 3, mask=0x10)

    def n_frames_beyond(root: Path) -> None:
        zarr.open_group(str(root), mode="r+")["n_frames"][:] = np.array([20, 25])

    cases = {
        "none (sound archive)": lambda root: None,
        "flipped bit in a qpos shard": flip,
        "missing mocap_pos shard inside n_frames":
            lambda root: shard_file(str(root), "mocap_pos", 0, 2).unlink(),
        "missing time chunk": lambda root: (root / "time" / "c" / "1").unlink(),
        "n_frames beyond the time extent": n_frames_beyond,
    }
    rows = []
    for i, (name, corrupt) in enumerate(cases.items()):
        root = workdir / f"corrupt-{i}.zarr"
        shutil.copytree(sound, root)
        corrupt(root)
        report = verify(str(root))
        cli = subprocess.run([sys.executable, "-m", "flyarchive.cli", "verify", str(root)],
                             capture_output=True, text=True)
        expected_ok = i == 0
        rows.append({"corruption": name, "verify_ok": report.ok, "cli_exit": cli.returncode,
                     "caught": report.ok == expected_ok and (cli.returncode == 0) == expected_ok,
                     "problems": report.problems})
    return rows


def run_races(n: int, processes: int, workdir: Path) -> list[dict[str, Any]]:
    """``n`` trials each of creators (w-), replacing writers (w) and appenders (a)."""
    from flyarchive.testing.concurrency import (
        RecorderPool,
        appenders_trial,
        creators_trial,
    )

    rows = []
    with RecorderPool(processes) as pool:
        cases = {
            "create (w-)": lambda i: creators_trial(pool, str(workdir / f"create-{i}.zarr")),
            "replace (w)": lambda i: creators_trial(pool, str(workdir / f"create-{i}.zarr"),
                                                    mode="w"),
            "append (a)": lambda i: appenders_trial(pool, str(workdir / f"append-{i}.zarr")),
        }
        for name, trial in cases.items():
            results = [trial(i) for i in range(n)]
            for i, r in enumerate(results):
                status = "ok" if r.clean else f"FAILED: {r.unexpected + r.problems}"[:300]
                print(f"  race {name} #{i}: {[a.outcome for a in r.attempts]}: {status}",
                      file=sys.stderr)
            rows.append({
                "race": name, "processes": processes, "trials": n,
                "one_winner": sum(r.winners == 1 for r in results),
                "clean_refusals": sum(r.refused for r in results),
                "expected_refusals": n * (processes - 1),
                "other_errors": sum(len(r.unexpected) for r in results),
                "damaged": sum(bool(r.problems) for r in results),
                "error_types": sorted({u.split(":")[0] for r in results for u in r.unexpected}),
                "trials_detail": [r.to_json() for r in results],
            })
    return rows


def run_reader(n_steps: int, workdir: Path) -> dict[str, Any]:
    """A reader polling open_archive while a writer process appends ``n_steps`` steps."""
    from flyarchive.testing.concurrency import RecorderPool
    from flyarchive.testing.verify_beside import reader_trial

    with RecorderPool(1) as pool:
        result = reader_trial(pool, str(workdir / "polled.zarr"), n_steps=n_steps)
    print(f"  reader: {result.opens} opens, {result.damaged} damaged, {result.frames_differing} "
          f"of {result.frames_read} frames differ; writer {result.writer}", file=sys.stderr)
    return {**result.to_json(), "errors": sorted({e.split(":")[0] for e in result.errors})}


def run_checksums(workdir: Path) -> dict[str, Any]:
    """Metadata that drops checksums or decodes otherwise (:mod:`flyarchive.testing.checksums`),
    through every read path, locally and on a loopback S3 server."""
    from flyarchive.testing.checksums import variants_table
    from flyarchive.testing.s3 import S3Server

    folder = workdir / "checksums"
    folder.mkdir()
    with S3Server() as server:
        server.create_bucket("flyarchive-checksums")
        result = variants_table(folder, {"prefix": "s3://flyarchive-checksums/run",
                                         "storage_options": server.storage_options()})
    print(f"  checksums: {result['variants']} variants, {result['tries']} reads, "
          f"{len(result['accepted'])} accepted", file=sys.stderr)
    return result


def run_verify_beside(n: int, workdir: Path) -> dict[str, Any]:
    """``verify`` run ``n`` times beside a writer process appending to a sound archive, and
    ``n // 3`` times beside one appending to an archive with a damaged committed shard."""
    from flyarchive.testing.concurrency import RecorderPool
    from flyarchive.testing.verify_beside import verify_trial

    with RecorderPool(1) as pool:
        sound = verify_trial(pool, str(workdir / "verified.zarr"), n_runs=n)
        damaged = verify_trial(pool, str(workdir / "verified-damaged.zarr"),
                               n_runs=max(n // 3, 1), damaged=True)
    print(f"  verify beside a writer: {sound.runs} runs, {len(sound.false_alarms)} false alarms; "
          f"damaged: {damaged.damage_reported} of {damaged.runs} reported", file=sys.stderr)
    return {"sound": sound.to_json(), "damaged": damaged.to_json()}


def print_metadata_rows(report: dict[str, Any]) -> None:
    """The rows of :func:`run_checksums` and :func:`run_verify_beside`."""
    checks = report.get("checksums")
    if checks:
        print("\nMetadata that drops checksums or decodes otherwise (copy, own zarr.json or "
              "both; open_archive, open_header, StateReader, info, verify; local and S3)")
        print(f"  {checks['variants']} variants, {checks['tries']} reads, "
              f"{len(checks['accepted'])} accepted, {len(checks['not_named'])} refusals not "
              "naming the array")
        for label in checks["accepted"] + checks["not_named"]:
            print(f"  FAILED: {label}")
    beside = report.get("verify_beside")
    if beside:
        sound, damaged = beside["sound"], beside["damaged"]
        print("\nverify beside a live writer (a writer process appending small commits)")
        print(f"  sound archive: {sound['runs']} runs ({sound['runs_with_writer']} saw its claim, "
              f"{sound['commits_seen']} commits seen), {len(sound['false_alarms'])} false alarms, "
              f"{len(sound['metadata_advice'])} advising to restore or delete metadata")
        print(f"  damaged shard: {damaged['damage_reported']} of {damaged['runs']} runs reported "
              f"it, {len(damaged['false_alarms'])} false alarms")


def run_hostile(workdir: Path) -> list[dict[str, Any]]:
    """Every command on every hostile archive, each in a capped child process."""
    from flyarchive.testing.hostile import hostile_table

    folder = workdir / "hostile"
    folder.mkdir()
    return hostile_table(folder, progress=lambda line: print(line, file=sys.stderr))


def print_hostile(rows: list[dict[str, Any]]) -> None:
    from flyarchive.testing.hostile import COMMANDS, MAX_MB, MAX_SECONDS, Outcome, passed

    def mark(command: str) -> Callable[[dict[str, Any]], str]:
        def cell(row: dict[str, Any]) -> str:
            outcome = Outcome(**row["outcomes"][command])
            return "X" if not passed(outcome) else "ok" if outcome.exit == 0 else "R"

        return cell

    short = {"open_archive": "api", "export-npz": "export"}
    table = Table([
        Column("case", 42, "case", align="<"),
        *(Column(short.get(c, c), 6, mark(c)) for c in COMMANDS),
        Column("max s", 6, "max_seconds", ".2f"), Column("max MiB", 7, "max_mb", ".0f"),
        Column("unchanged", 9, lambda r: str(r["unchanged"])),
        Column(" result", 0, lambda r: " " + ("pass" if r["passed"] else "FAIL"), align="<"),
    ])
    table.print(rows, title=f"\nHostile archives (each command in a child process, 3 GiB "
                            f"address-space cap; R refused, ok worked, X crashed, hung or out of "
                            f"bounds; bounds {MAX_SECONDS:g} s in the command, {MAX_MB:g} MiB "
                            f"peak RSS)")


def run_crafted_models(n: int, workdir: Path) -> dict[str, Any]:
    """``n`` fuzzed kept models (:mod:`flyarchive.testing.model_fuzz`, seeds 0..n-1), each
    through ``flyarchive render`` (no ``--model``), ``flyarchive verify`` and
    ``flyarchive.load_kept_model``, each in a child process."""
    from flyarchive.testing.hostile_cases import make_sound
    from flyarchive.testing.model_fuzz import fuzz, summarize

    folder = workdir / "models"
    folder.mkdir()
    rows = fuzz(folder, make_sound(str(folder / "sound.zarr")), range(n),
                progress=lambda line: print(line, file=sys.stderr))
    return {**summarize(rows), "rows": rows}


def print_crafted_models(result: dict[str, Any]) -> None:
    checks = ", ".join(f"{n} {what}" for what, n in sorted(result["checks"].items()))
    print(f"\nCrafted models (a kept models/<sha256>.mjb fuzzed, its hash matching; render, "
          f"verify and load_kept_model each in a child process)")
    print(f"  crafted models: {result['fuzzed']} fuzzed, {result['crashes']} crashes of the "
          f"calling process, {result['unclear']} exits without a clear error")
    print(f"  the model check found: {checks}")
    for seed in result["failed_seeds"]:
        print(f"  FAILED: seed {seed}")


def missing_chunks(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Committed frames missing (:data:`flyarchive.testing.holes.MISSING_CASES`), from the
    hostile rows: the reads of them made, refused, and passed off as data (exit 0)."""
    from flyarchive.testing.holes import MISSING_CASES

    found = [r for r in rows if r["case"] in MISSING_CASES]
    reads = [(r["case"], c, r["outcomes"][c]) for r in found for c in MISSING_CASES[r["case"]][1]
             if c in r["outcomes"]]
    return {"variants": len(found), "reads": len(reads),
            "refused": sum(o["exit"] in (1, 2) for _, _, o in reads),
            "passed_off": [f"{case} / {command}" for case, command, o in reads if o["exit"] == 0]}


def print_missing(summary: dict[str, Any]) -> None:
    print(f"\nMissing chunks inside n_frames: {summary['variants']} hostile variants, "
          f"{summary['reads']} reads of the missing frames (verify, open_archive, export-npz, "
          f"plot, render), {summary['refused']} refused, {len(summary['passed_off'])} passed "
          "off as data")
    for what in summary["passed_off"]:
        print(f"  passed off: {what}")


def run_hostile_outputs(workdir: Path) -> dict[str, Any]:
    """Every hostile output folder case, each in a capped child process; one summary row."""
    from flyarchive.testing.hostile_outputs import hostile_outputs_table

    folder = workdir / "hostile-outputs"
    folder.mkdir()
    rows = hostile_outputs_table(folder, progress=lambda line: print(line, file=sys.stderr))
    return {"cases": len(rows), "refused": sum(bool(r["error_type"]) for r in rows),
            "followed": sum(r["followed"] for r in rows), "hung": sum(r["hung"] for r in rows),
            "passed": sum(r["passed"] for r in rows), "rows": rows}


def run_bad_input(workdir: Path) -> dict[str, Any]:
    """Run tests/bad_input; count cases tried and passed."""
    xml = workdir / "bad_input.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    str(ROOT / "tests" / "bad_input"), f"--junitxml={xml}"],
                   cwd=ROOT, capture_output=True, text=True)
    cases = ET.parse(xml).getroot().iter("testcase")
    failed, tried = [], 0
    for case in cases:
        tried += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(case.get("name"))
    return {"tried": tried, "passed": tried - len(failed), "failed": failed}


#: (where, signal, when) of the render kill trials: stopped mid-render then rendered again
#: with --overwrite, or stopped once a video is listed then continued with --resume.
RENDER_STOPS = [(w, h, "mid-render") for w in ("process", "dask") for h in ("kill", "int")] + [
    ("process", "term", "first-video"), ("process", "kill", "first-video"),
    ("dask", "term", "first-video")]


def run_render_kills(n: int, workdir: Path) -> list[dict[str, Any]]:
    """``n`` seeded trials of each of :data:`RENDER_STOPS`."""
    from flyarchive.testing.render_kills import RenderKillConfig, make_render_archive, render_kill_trial

    archive = make_render_archive(workdir / "render-kill-archive")
    rows = []
    signals = {"kill": "SIGKILL", "int": "SIGINT (Ctrl-C)", "term": "SIGTERM"}
    for where, how, stop in RENDER_STOPS:
        results = []
        for seed in range(n):
            config = RenderKillConfig(where, how, seed, stop=stop)
            result = render_kill_trial(archive, workdir / f"render-{where}-{how}-{stop}-{seed}",
                                       config)
            results.append(result)
            status = "ok" if result.passed else "FAILED: " + "; ".join(result.problems)[:300]
            print(f"  render {where} {how} {stop} #{seed}: exit {result.exit_code}, left "
                  f"{len(result.left_after_stop)}, after rerun {len(result.left_after_rerun)}: "
                  f"{status}", file=sys.stderr)
        stopped = [r for r in results if r.stopped_mid_render]
        rows.append({
            "where": where, "signal": signals[how], "stop": stop,
            "trials": n, "stopped_mid_render": len(stopped),
            "half_written": sum(len(r.half_written) for r in results),
            "stops_leaving_files": sum(bool(r.left_after_stop) for r in stopped),
            "left_after_next_run": sum(len(r.left_after_rerun) for r in results),
            "clean_ctrl_c": (sum(r.exit_code == {"int": 130, "term": 143}[how]
                                 and r.stderr.count("\n") == 1 for r in stopped)
                             if how != "kill" else None),
            "listed_kept": (sum(bool(r.listed) and sorted(r.kept) == sorted(r.listed)
                                for r in stopped) if stop == "first-video" else None),
            "passed": sum(r.passed for r in results),
            "trials_json": [r.to_json() for r in results],
        })
    return rows


KILLS = Table([
    Column("backend", 8, "backend", align="<"), Column("kills", 5, "made"),
    Column("survived", 8, "survived"), Column("lost/kill min", 13, "lost_min"),
    Column("mean", 5, "lost_mean", ".1f"), Column("max", 4, "lost_max"), Column("bound", 5, "bound"),
    Column(" failed checks", 0, lambda r: " " + ("; ".join(r["problems"]) or "-"), align="<"),
])
S3 = Table([
    Column("op", 7, "operation", align="<"), Column("trials", 6, "trials"),
    Column("requests", 8, "requests"), Column("faults", 6, "faults"), Column("drop", 4, "drop"),
    Column("500", 4, "error500"), Column("503", 4, "error503"), Column("delay", 5, "delay"),
    Column("|", 1, lambda r: "|"), *(Column(o, 13, o) for o in S3_OUTCOMES),
])
RACES = Table([
    Column("race", 12, "race", align="<"), Column("procs", 5, "processes"),
    Column("trials", 6, "trials"), Column("1 winner", 8, "one_winner"),
    Column("clean refusals", 14,
           lambda r: f"{r['clean_refusals']:>7}/{r['expected_refusals']:<6}"),
    Column("other errors", 12, "other_errors"), Column("damaged", 7, "damaged"),
])
RENDER_KILLS = Table([
    Column("where", 8, "where", align="<"), Column("signal", 16, "signal", align="<"),
    Column("stop", 11, "stop", align="<"),
    Column("trials", 6, "trials"), Column("mid-render", 10, "stopped_mid_render"),
    Column("half-written", 12, "half_written"), Column("left files", 10, "stops_leaving_files"),
    Column("left after next", 15, "left_after_next_run"),
    Column("exit 130/143, 1 line", 20, "clean_ctrl_c"),
    Column("resume kept", 11, "listed_kept"), Column("passed", 6, "passed"),
])


def print_table(report: dict[str, Any]) -> None:
    print(f"\nflyarchive reliability report — {report['machine']}, {report['date']}")
    KILLS.print(report["kills"], title="\nKilled writers (SIGKILL at seeded random points)")
    if report["s3"]:
        S3.print(report["s3"], title="\nFlaky S3 (fault proxy: 4% each of drop, 500, 503, "
                                     "delay; botocore 2 attempts)")
        for row in report["s3"]:
            if row["error_types"]:
                print(f"  {row['operation']} errors: {', '.join(row['error_types'])}")
    print("\nInjected corruption (flyarchive verify)")
    for row in report["corruptions"]:
        print(f"  {row['corruption']:<42} verify ok={row['verify_ok']!s:<5} "
              f"cli exit={row['cli_exit']}  {'caught' if row['caught'] else 'MISSED'}")
    if report.get("races"):
        RACES.print(report["races"], title="\nConcurrent writers (processes started at one "
                                           "instant; expected: 1 winner per trial)")
        for row in report["races"]:
            if row["error_types"]:
                print(f"  {row['race']} errors: {', '.join(row['error_types'])}")
    reader = report.get("reader")
    if reader:
        print("\nReader polling open_archive while a writer appends")
        print(f"  opens {reader['opens']}, reported damaged {reader['damaged']}, commits seen "
              f"{reader['commits_seen']}, frames read inside n_frames {reader['frames_read']}, "
              f"differing from the final data {reader['frames_differing']}, writer {reader['writer']}")
    print_metadata_rows(report)
    if report.get("render_kills"):
        RENDER_KILLS.print(report["render_kills"], title="\nRenders stopped mid-way (then "
                                                         "rendered again into the same folder: "
                                                         "--overwrite after mid-render, --resume "
                                                         "after first-video)")
    if report.get("hostile"):
        print_hostile(report["hostile"])
        print_missing(missing_chunks(report["hostile"]))
    if report.get("crafted_models"):
        print_crafted_models(report["crafted_models"])
    outputs = report.get("hostile_outputs")
    if outputs:
        print(f"\nHostile output folders (render into, read back from; each in a child): "
              f"{outputs['cases']} cases, {outputs['refused']} refused, {outputs['followed']} "
              f"followed, {outputs['hung']} hung, {outputs['passed']} passed")
        for row in outputs["rows"]:
            if not row["passed"]:
                print(f"  FAILED {row['case']}: {row['error_type']} {row['message'][:200]}")
    bad = report["bad_input"]
    if bad:
        print(f"\nBad input: {bad['tried']} tried, {bad['passed']} passed")
        for name in bad["failed"]:
            print(f"  failed: {name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=nonnegative_int, default=20,
                        help="kills per backend (default 20)")
    parser.add_argument("--backends", default="cpu,warp", type=listed("cpu", "warp"),
                        help="comma-separated: cpu,warp")
    parser.add_argument("--chunk-frames", type=int, default=5)
    parser.add_argument("--s3-trials", type=int, default=4,
                        help="trials per S3 operation (0: skip)")
    parser.add_argument("--races", type=int, default=10,
                        help="trials per concurrent-writer race (0: skip races and reader)")
    parser.add_argument("--race-processes", type=int, default=3,
                        help="recorder processes started at once per race (default 3)")
    parser.add_argument("--reader-steps", type=int, default=2000,
                        help="steps the writer appends while the reader polls (default 2000)")
    parser.add_argument("--no-bad-input", action="store_true", help="skip tests/bad_input")
    parser.add_argument("--verify-runs", type=int, default=12,
                        help="verify runs beside a live writer (default 12; 0: skip)")
    parser.add_argument("--interop-kills", type=int, default=6,
                        help="kills each of import-npz and export-npz (0: skip)")
    parser.add_argument("--render-kills", type=int, default=3,
                        help="renders stopped per (where, signal, when) of RENDER_STOPS "
                             "(default 3; 0: skip)")
    parser.add_argument("--no-hostile", action="store_true",
                        help="skip the hostile archives and output folders")
    parser.add_argument("--crafted-models", type=int, default=40,
                        help="fuzzed kept models, each through render, verify and load_kept_model "
                             "(default 40; 0: skip)")
    add_json_option(parser, "also write the report as JSON")
    args = parser.parse_args(argv)
    start = time.monotonic()
    info = host_info()
    report: dict[str, Any] = {
        "machine": f"{info['host']} ({info['cpus_total']} CPUs, {platform.machine()}, "
                   f"Python {info['python']})",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host_info": info,
    }
    with tempfile.TemporaryDirectory(prefix="flyarchive-reliability-") as tmp:
        work = Path(tmp)
        report["kills"] = [run_kills(b.strip(), args.kills, args.chunk_frames, work)
                           for b in args.backends.split(",") if b.strip()]
        report["s3"] = run_s3(args.s3_trials) if args.s3_trials > 0 else []
        report["corruptions"] = run_corruptions(work)
        report["races"] = (run_races(args.races, args.race_processes, work / "races")
                           if args.races > 0 else [])
        report["reader"] = run_reader(args.reader_steps, work) if args.races > 0 else {}
        report["checksums"] = run_checksums(work)
        report["verify_beside"] = (run_verify_beside(args.verify_runs, work)
                                   if args.verify_runs > 0 else {})
        report["hostile"] = [] if args.no_hostile else run_hostile(work)
        report["crafted_models"] = (run_crafted_models(args.crafted_models, work)
                                    if args.crafted_models > 0 else {})
        report["missing_chunks"] = missing_chunks(report["hostile"])
        report["hostile_outputs"] = {} if args.no_hostile else run_hostile_outputs(work)
        report["bad_input"] = {} if args.no_bad_input else run_bad_input(work)
        from flyarchive.testing import interop_kills as faults_interop

        report["interop_kills"] = [
            faults_interop.run_kills("import", args.interop_kills, work / "interop"),
            faults_interop.run_kills("export", args.interop_kills, work / "interop",
                                     n_files=8, n_frames=600),
        ] if args.interop_kills > 0 else []
        report["render_kills"] = (run_render_kills(args.render_kills, work)
                                  if args.render_kills > 0 else [])
    report["seconds"] = round(time.monotonic() - start, 1)
    print_table(report)
    if report["interop_kills"]:
        from flyarchive.testing import interop_kills as faults_interop

        faults_interop.print_table(report["interop_kills"])
    print(f"\n({report['seconds']} s)")
    write_json(args.json, report, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())

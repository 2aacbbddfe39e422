"""Kill harness for ``import-npz`` and ``export-npz``: SIGKILL mid-way, check, rerun, check.

Used by ``tests/test_kill_interop.py`` and ``scripts/reliability_report.py``.
:func:`kill_trial` runs an import or an export in a child process (``python -m
flyarchive.testing.interop_kills``), which prints ``STEP <done> <total>`` after each commit
(import) or file (export); the parent SIGKILLs it after a seeded number of steps
plus a seeded delay, then checks what was left:

- export: every file under a final name (``world*.npz``) loads and equals the
  archive's world (no half-written file); then the export is rerun with
  ``overwrite=True`` and must leave every file equal and no temporary file behind;
- import: an archive left behind is reported as partial by ``info`` and ``verify``
  (unless the import had finished) and has no other problem; ``import-npz
  --resume`` then finishes it, and the result must equal an uninterrupted import.

:func:`interrupt_import` interrupts ``flyarchive import-npz`` (SIGINT, as Ctrl-C) while it
waits after its first commit, so that the signal always comes mid-import.

Nothing here is needed to record or replay.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flyarchive.testing.trials import Child, TrialOutcome

__all__ = ["InteropKillConfig", "InteropKillResult", "kill_trial", "trial_inputs", "write_npz_inputs",
           "datasets_equal", "interrupt_import", "InterruptedImport", "OPERATIONS"]

#: Operations the harness can kill.
OPERATIONS = ("import", "export")
_STEP = "STEP"


@dataclass(frozen=True)
class InteropKillConfig:
    """One kill trial.

    Attributes:
        operation: ``"import"`` (npz files -> archive) or ``"export"`` (archive -> npz files).
        seed: Seeds the kill point (steps to wait for, then a delay).
        n_files: Worlds (one file each); lengths are ``n_frames``, ``n_frames - 7``, ...
        n_frames: Frames of the longest world (tiny model, nq=13, one mocap body).
        chunk_frames: Frames per commit of the import.
        max_delay_s: The kill comes a uniform random delay in [0, max_delay_s] s after
            the chosen step.
        timeout_s: Seconds to wait for the child to reach its kill point.
        wait_steps: Kill after this many steps (0: before the first commit or file;
            ``total_steps``: after the last one) instead of a seeded number.
        mid_write: Export only: kill inside the next file's write after the chosen step
            (the child holds there, its data in the temporary file, not yet renamed),
            without the delay.
    """

    operation: str = "import"
    seed: int = 0
    n_files: int = 4
    n_frames: int = 120
    chunk_frames: int = 5
    max_delay_s: float = 0.03
    timeout_s: float = 120.0
    wait_steps: int | None = None
    mid_write: bool = False

    def __post_init__(self) -> None:
        if self.operation not in OPERATIONS:
            raise ValueError(f"operation must be one of {OPERATIONS}, got {self.operation!r}.")

    @property
    def total_steps(self) -> int:
        """Progress lines of an uninterrupted run: commits (import) or files (export)."""
        return -(-self.n_frames // self.chunk_frames) if self.operation == "import" else self.n_files


@dataclass
class InteropKillResult(TrialOutcome):
    """What one kill trial found.

    Attributes:
        config: The trial.
        killed: True if the child was still running when SIGKILL was sent.
        steps: Progress lines the child printed before it died.
        finals: Files under final names after the kill (export).
        half_written: Of those, files that do not load or differ from the archive.
        leftovers_after_kill: Temporary files after the kill (export).
        leftovers_after_rerun: Temporary files after the rerun (export; must be 0).
        archive_left: An archive was at the URL after the kill (import).
        partial_detected: ``info`` and ``verify`` both reported the import as partial
            (import, when it had not finished; None otherwise).
        rerun_equal: After the rerun (``--resume`` / ``overwrite``) the result equals
            an uninterrupted run.
        problems: One sentence per check that failed; empty when all held.
    """

    config: InteropKillConfig
    killed: bool = False
    steps: int = 0
    finals: int = 0
    half_written: int = 0
    leftovers_after_kill: int = 0
    leftovers_after_rerun: int = 0
    archive_left: bool = False
    partial_detected: bool | None = None
    rerun_equal: bool = False
    problems: list[str] = field(default_factory=list)



# ----------------------------------------------------------------------------- inputs
def write_npz_inputs(folder: Path, n_files: int, n_frames: int) -> list[Path]:
    """Write ``n_files`` flygym-format ``.npz`` files of the tiny model (ragged lengths)."""
    from flyarchive.testing import reference_frames, tiny_model

    folder.mkdir(parents=True, exist_ok=True)
    frames = reference_frames(tiny_model(), n_files, 4 * (n_frames - 1))
    paths = []
    for w in range(n_files):
        n = max(1, n_frames - 7 * w)
        path = folder / f"traj{w:03d}.npz"
        np.savez_compressed(
            path, time=frames["time"][:n], qpos=frames["qpos"][w, :n], output_fps=25.0,
            playback_speed=0.2, world_id=w + 10, mocap_pos=frames["mocap_pos"][w, :n],
            mocap_quat=frames["mocap_quat"][w, :n],
        )
        paths.append(path)
    return paths


def datasets_equal(a: Any, b: Any,
                   ignore_attrs: Sequence[str] = ("created", "archive_id")) -> list[str]:
    """Differences between two archives' datasets (variables, coordinates, attributes but
    those saying when and as which archive each was created)."""
    problems = []
    names = sorted(set(a.variables) | set(b.variables))
    for name in names:
        if name not in a.variables or name not in b.variables:
            problems.append(f"{name!r} is in only one of them.")
            continue
        x, y = np.asarray(a[name].values), np.asarray(b[name].values)
        same = x.shape == y.shape and (
            np.array_equal(x, y, equal_nan=True) if x.dtype.kind == "f" else np.array_equal(x, y))
        if not same:
            problems.append(f"{name!r} differs (shapes {x.shape} and {y.shape}).")
    attrs_a = {k: v for k, v in a.attrs.items() if k not in ignore_attrs}
    attrs_b = {k: v for k, v in b.attrs.items() if k not in ignore_attrs}
    if attrs_a != attrs_b:
        diff = sorted(k for k in set(attrs_a) | set(attrs_b) if attrs_a.get(k) != attrs_b.get(k))
        problems.append(f"attributes {diff} differ.")
    return problems


# ----------------------------------------------------------------------------- child
def _child(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Child of the import/export kill harness.")
    parser.add_argument("operation", choices=OPERATIONS)
    parser.add_argument("source")
    parser.add_argument("target")
    parser.add_argument("--chunk-frames", type=int, default=5)
    parser.add_argument("--hold-write", type=int, default=-1,
                        help="export: stop inside this file's write (0: the first), its data "
                             "in the temporary file, not yet renamed, until killed")
    args = parser.parse_args(argv)
    if args.hold_write >= 0:
        _hold_inside_write(args.hold_write)

    def step(done: int, total: int) -> None:
        print(_STEP, done, total, flush=True)

    print(_STEP, 0, 0, flush=True)
    if args.operation == "import":
        from flyarchive.interop.flygym_npz import import_npz
        from flyarchive.testing import tiny_model

        import_npz(args.source, args.target, tiny_model(), chunk_frames=args.chunk_frames,
                   progress=step, model_source=model_file(args.source))
    else:
        from flyarchive.interop.flygym_npz import export_npz

        export_npz(args.source, args.target, progress=step)
    return 0


#: What the child prints when it holds inside a file's write (``--hold-write``).
_HOLDING = "HOLDING"


def _hold_inside_write(index: int) -> None:
    """Make the export's ``index``-th file write stop once its data is in the temporary
    file (before the flush and the rename) and say so: the kill then lands mid-write
    whatever the machine's speed (a file this small is written in about a millisecond)."""
    save = np.savez_compressed
    calls = [0]

    def held(file: Any, *args: Any, **kwargs: Any) -> None:
        save(file, *args, **kwargs)
        calls[0] += 1
        if calls[0] == index + 1:
            print(_HOLDING, flush=True)
            time.sleep(3600)  # until killed

    np.savez_compressed = held


# ----------------------------------------------------------------------------- parent
def _run_and_kill(source: str, target: str, config: InteropKillConfig,
                  result: InteropKillResult) -> None:
    rng = np.random.default_rng(config.seed)
    wait_steps = int(rng.integers(0, config.total_steps + 1))
    wait_steps = wait_steps if config.wait_steps is None else config.wait_steps
    delay = float(rng.uniform(0.0, config.max_delay_s))
    cmd = [sys.executable, "-m", "flyarchive.testing.interop_kills", config.operation, source, target,
           "--chunk-frames", str(config.chunk_frames)]
    if config.mid_write:
        cmd += ["--hold-write", str(wait_steps)]
    deadline = time.monotonic() + config.timeout_s
    seen = -1
    with Child(cmd) as child:
        while seen < wait_steps and time.monotonic() < deadline:
            line = child.readline()
            if not line:
                break
            if line.startswith(_STEP):
                seen += 1
        if config.mid_write:  # until the child holds inside that file's write (or ends)
            while time.monotonic() < deadline:
                line = child.readline()
                if not line or line.startswith(_HOLDING):
                    break
                seen += line.startswith(_STEP)
        else:
            time.sleep(delay)
        result.killed, lines = child.kill()
        seen += sum(line.startswith(_STEP) for line in lines)
        result.steps = max(seen, 0)
        if not result.killed and child.proc.returncode != 0:
            result.problems.append(f"The child failed before the kill: {child.stderr_tail()}")


def _temporaries(folder: Path) -> list[Path]:
    return [p for p in folder.glob(".*") if p.name.endswith(".tmp")] if folder.is_dir() else []


def _check_files(folder: Path, ds: Any) -> tuple[int, int]:
    """(files under final names, of which half-written or wrong)."""
    from flyarchive.interop.npz_export import npz_name

    expected = {npz_name(int(w)): int(w) for w in ds.world.values}
    finals = sorted(folder.glob("world*.npz")) if folder.is_dir() else []
    bad = 0
    for path in finals:
        try:
            with np.load(path, allow_pickle=False) as data:
                got = {k: data[k] for k in data.files}
            one = ds.sel(world=expected[path.name])
            n = int(one.n_frames)
            same = all(np.array_equal(got[k], one[k].values[:n])
                       for k in ("qpos", "mocap_pos", "mocap_quat")) \
                and np.array_equal(got["time"], ds.time.values[:n])
        except Exception:
            same = False
        bad += not same
    return len(finals), bad


def _export_trial(archive: str, out: Path, config: InteropKillConfig) -> InteropKillResult:
    from flyarchive import open_archive
    from flyarchive.interop.flygym_npz import export_npz

    result = InteropKillResult(config)
    _run_and_kill(archive, str(out), config, result)
    if result.problems:
        return result
    ds = open_archive(archive).load()
    result.finals, result.half_written = _check_files(out, ds)
    result.leftovers_after_kill = len(_temporaries(out))
    if result.half_written:
        result.problems.append(f"{result.half_written} of {result.finals} files under final "
                               "names are half-written or wrong after the kill.")
    try:
        export_npz(archive, out, overwrite=True)
    except Exception as err:
        result.problems.append(f"Rerunning the export failed: {err!r}")
        return result
    finals, bad = _check_files(out, ds)
    result.leftovers_after_rerun = len(_temporaries(out))
    result.rerun_equal = finals == ds.sizes["world"] and bad == 0
    if not result.rerun_equal:
        result.problems.append(f"After the rerun {finals} files, {bad} wrong; expected "
                               f"{ds.sizes['world']} equal files.")
    if result.leftovers_after_rerun:
        result.problems.append(f"{result.leftovers_after_rerun} temporary files left after "
                               "the rerun.")
    return result


def _import_trial(npz: Path, url: str, reference: str,
                  config: InteropKillConfig) -> InteropKillResult:
    from flyarchive import open_archive
    from flyarchive.cli import main
    from flyarchive.store.integrity import verify
    from flyarchive.summary import summarize

    result = InteropKillResult(config)
    _run_and_kill(str(npz), url, config, result)
    if result.problems:
        return result
    result.archive_left = Path(url, "zarr.json").exists()
    if result.archive_left:
        try:
            said = summarize(url).get("import", "")
            report = verify(url)
        except Exception as err:
            result.problems.append(f"info/verify after the kill failed: {err!r}")
            return result
        partial = [p for p in report.problems if p.startswith("PARTIAL")]
        others = [p for p in report.problems if not p.startswith("PARTIAL")]
        if others:
            result.problems.append(f"verify after the kill: {others}")
        if said == "complete":  # the kill came after the import had finished
            diff = datasets_equal(open_archive(url), open_archive(reference))
            if diff:
                result.problems.append(f"Reported complete, but differs from the full import: "
                                       f"{diff}")
        else:
            result.partial_detected = said.startswith("PARTIAL") and bool(partial)
            if not result.partial_detected:
                result.problems.append(f"The interrupted import was not reported as partial "
                                       f"(info: {said!r}; verify: {report.problems}).")
    model = model_file(npz)
    with contextlib.redirect_stdout(io.StringIO()):  # its success line is not the report's
        code = main(["import-npz", str(npz), "--to", url, "--model", str(model), "--resume"])
    if code != 0:
        result.problems.append(f"import-npz --resume exited with {code}.")
        return result
    diff = datasets_equal(open_archive(url), open_archive(reference))
    result.rerun_equal = not diff
    if diff:
        result.problems.append(f"The resumed import differs from an uninterrupted one: {diff}")
    return result


def trial_inputs(workdir: str | Path, config: InteropKillConfig) -> tuple[Path, str]:
    """What a trial reads, never changes: a folder of ``.npz`` files and their
    uninterrupted import (the reference; the export's source), of ``config``'s sizes."""
    from flyarchive.interop.flygym_npz import import_npz
    from flyarchive.testing import tiny_model

    from flyarchive.testing import TINY_XML

    work = Path(workdir)
    npz = work / "npz-in"
    write_npz_inputs(npz, config.n_files, config.n_frames)
    model_file(npz).write_text(TINY_XML)
    reference = str(work / "reference.zarr")
    import_npz(npz, reference, tiny_model(), chunk_frames=config.chunk_frames,
               model_source=model_file(npz))
    return npz, reference


def model_file(npz: str | Path) -> Path:
    """The MJCF file of the tiny model beside a trial's folder of ``.npz`` files: every
    import of a trial (the reference, the killed child, the resumed one) keeps it as the
    archive's portable model, so that their attributes agree."""
    return Path(npz).parent / "tiny-model.xml"


def kill_trial(workdir: str | Path, config: InteropKillConfig, *,
               inputs: tuple[Path, str] | None = None) -> InteropKillResult:
    """Run one import or export in a child, SIGKILL it at a seeded point, check, rerun, check.

    Args:
        workdir: An empty local folder for the archive and the outputs (and the inputs).
        config: Operation, seed and sizes.
        inputs: :func:`trial_inputs` of the same sizes, shared by several trials; None:
            made in ``workdir``.

    Returns:
        The result; ``problems`` lists every check that failed.
    """
    work = Path(workdir)
    npz, reference = inputs if inputs is not None else trial_inputs(work, config)
    if config.operation == "export":
        return _export_trial(reference, work / "npz-out", config)
    return _import_trial(npz, str(work / "killed.zarr"), reference, config)


if __name__ == "__main__":
    sys.exit(_child())


# ----------------------------------------------------------------------------- Ctrl-C
#: ``flyarchive import-npz ARGS`` whose commits (``ArchiveWriter.write``) each say
#: ``COMMITTED`` on stdout and then wait for a line on stdin: a Ctrl-C sent meanwhile
#: reaches the command mid-import, between two commits, as a user's would.
_HELD_IMPORT = textwrap.dedent("""
    import sys
    from flyarchive.cli import main
    from flyarchive.store import ArchiveWriter
    write = ArchiveWriter.write
    def held(self, *args, **kwargs):
        write(self, *args, **kwargs)
        print("COMMITTED", flush=True)
        sys.stdin.readline()
    ArchiveWriter.write = held
    sys.exit(main(sys.argv[1:]))
""")


@dataclass
class InterruptedImport:
    """What :func:`interrupt_import` saw.

    Attributes:
        exit_code: The command's exit status.
        stdout: What it printed (``COMMITTED`` per commit, then its own lines).
        stderr: What it printed on stderr.
        committed: ``n_frames`` of the archive after the command ended (per world).
        frames: Frames per world of the files.
    """

    exit_code: int
    stdout: str
    stderr: str
    committed: list[int]
    frames: list[int]


def interrupt_import(workdir: str | Path, *, n_files: int = 2, n_frames: int = 250,
                     timeout_s: float = 120.0) -> InterruptedImport:
    """Run ``flyarchive import-npz`` on ``n_files`` files in a child process and send it
    SIGINT (a terminal's Ctrl-C) while it waits after its first commit
    (:data:`_HELD_IMPORT`); what it did. ``n_frames`` over the command's frames per
    commit (100) leaves the import unfinished then."""
    import zarr

    from flyarchive.testing import TINY_XML

    work = Path(workdir)
    paths = write_npz_inputs(work / "npz", n_files, n_frames)
    (work / "tiny.xml").write_text(TINY_XML)
    url = work / "interrupted.zarr"
    command = [sys.executable, "-c", _HELD_IMPORT, "import-npz", str(work / "npz"), "--to",
               str(url), "--model", str(work / "tiny.xml")]
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")})
    try:
        first = child.stdout.readline() if child.stdout is not None else ""
        if first == "COMMITTED\n":
            child.send_signal(signal.SIGINT)
        stdout, stderr = child.communicate(timeout=timeout_s)  # stdin closed: no more waits
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    committed = zarr.open_group(str(url), mode="r")["n_frames"][:].tolist() \
        if (url / "n_frames").exists() else []
    frames = [int(np.load(p, allow_pickle=False)["time"].shape[0]) for p in paths]
    return InterruptedImport(child.returncode, first + stdout, stderr, committed, frames)


# ----------------------------------------------------------------------------- report
def run_kills(operation: str, n: int, workdir: Path, **config: Any) -> dict[str, Any]:
    """``n`` seeded kill trials of one operation, summed for the reliability report."""
    results = []
    for seed in range(n):
        trial = workdir / f"{operation}-{seed}"
        trial.mkdir(parents=True)
        mid_write = operation == "export" and seed % 2 == 1
        result = kill_trial(trial, InteropKillConfig(operation=operation, seed=seed,
                                                     mid_write=mid_write, **config))
        results.append(result)
        status = "ok" if result.survived else "FAILED: " + "; ".join(result.problems)[:300]
        print(f"  kill {operation} #{seed}: after step {result.steps}: {status}", file=sys.stderr)
    killed = [r for r in results if r.killed]
    partial_left = [r for r in killed if r.partial_detected is not None]
    return {
        "operation": operation, "made": len(killed),
        "half_written": sum(r.half_written for r in killed),
        "leftovers_after_kill": sum(r.leftovers_after_kill for r in killed),
        "leftovers_after_rerun": sum(r.leftovers_after_rerun for r in killed),
        "partial_left": len(partial_left),
        "partial_detected": sum(bool(r.partial_detected) for r in partial_left),
        "rerun_equal": sum(r.rerun_equal for r in killed),
        "problems": sorted({p.split(":")[0] for r in results for p in r.problems}),
        "trials": [r.to_json() for r in results],
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    """The report's table of killed imports and exports."""
    print("\nKilled import-npz / export-npz (SIGKILL at seeded steps; rerun: --resume / "
          "--overwrite)")
    print(f"{'op':<7} {'kills':>5} {'half-written finals':>19} {'tmp after kill':>14} "
          f"{'tmp after rerun':>15} {'partial left':>12} {'said partial':>12} "
          f"{'rerun = whole':>13}  failed checks")
    for row in rows:
        print(f"{row['operation']:<7} {row['made']:>5} {row['half_written']:>19} "
              f"{row['leftovers_after_kill']:>14} {row['leftovers_after_rerun']:>15} "
              f"{row['partial_left']:>12} {row['partial_detected']:>12} "
              f"{row['rerun_equal']:>13}  {'; '.join(row['problems']) or '-'}")

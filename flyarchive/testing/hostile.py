"""What each command does with a hostile archive.

Used by ``tests/test_hostile.py`` and ``scripts/reliability_report.py``. Each case of
:data:`~flyarchive.testing.hostile_cases.CASES` turns a copy of a small sound archive into
a hostile one (:mod:`flyarchive.testing.hostile_cases`: a chunk that decodes to gigabytes,
a chunk that is a FIFO or a link to ``/dev/zero``, metadata nested 200,000 deep...);
:func:`run_isolated` runs one command on it in a child
process (``python -m flyarchive.testing.hostile``) under an address-space limit and a
timeout, so a regression fails (``MemoryError``, timeout) instead of exhausting the
machine or hanging, and reports what happened: exit status, error, seconds inside the
command, and the child's peak resident memory (``ru_maxrss``).

Nothing here is needed to record or replay.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from flyarchive.testing.holes import MISSING_CASES
from flyarchive.testing.hostile_cases import CASES, make_case, make_sound, snapshot

__all__ = [
    "COMMANDS", "Outcome", "command_argv", "run_isolated", "run_isolated_many",
    "hostile_table", "passed", "MAX_SECONDS", "MAX_MB", "run_caught", "MEMORY_CAP",
]

#: Address-space limit of the child that runs a command, bytes (a normal command peaks
#: near 1.2 GB of address space and 0.2 GB resident).
MEMORY_CAP = 3 << 30
#: Commands :func:`run_isolated` knows: the CLI's, and ``open_archive`` (the API, loading
#: everything).
COMMANDS = ("info", "verify", "open_archive", "export-npz", "plot", "render")


# ----------------------------------------------------------------------------- running
@dataclass
class Outcome:
    """What one command did with one archive.

    Attributes:
        exit: Exit status: 0 ok, 1 verify found problems or an uncaught error, 2 a
            flyarchive error, None when the child was killed (timeout) or died.
        error_type: The exception's class for ``open_archive``; ``"FlyarchiveError"`` for
            a CLI exit 2; the uncaught exception's class; None when it worked.
        message: The error message (CLI: stderr), or what went wrong with the child.
        seconds: Time inside the command (after imports), s; None if it never ended.
        wall_s: Wall time of the child process, imports included, s.
        maxrss_mb: The child's peak resident memory, MiB; None if it never ended.
    """

    exit: int | None
    error_type: str | None
    message: str
    seconds: float | None
    wall_s: float
    maxrss_mb: float | None

    def to_json(self) -> dict:
        return asdict(self)


def command_argv(command: str, url: str, workdir: Path) -> list[str]:
    """The CLI arguments of ``command`` on ``url`` (outputs under ``workdir``)."""
    if command in ("info", "verify"):
        return [command, url]
    if command == "export-npz":
        return [command, url, "--to", str(workdir / "npz")]
    if command == "plot":
        return [command, url, "--world", "0", "--out", str(workdir / "plot.png")]
    if command == "render":
        from flyarchive.testing import TINY_XML

        model = workdir / "tiny.xml"
        model.write_text(TINY_XML)
        return [command, url, "--model", str(model), "--camera", "front", "--size", "48x64",
                "--out", str(workdir / "videos"), "--workers", "0", "--quiet"]
    raise ValueError(f"Unknown command {command!r}; known: {COMMANDS}.")


def _warm(commands: Sequence[str]) -> None:
    """Import the modules of ``commands`` and load xarray's backends (and for ``plot``
    matplotlib's fonts): one-time start-up work (about 1.2 s of it here)."""
    import dask.array  # noqa: F401
    import xarray

    import flyarchive.cli  # noqa: F401
    import flyarchive.interop.flygym_npz  # noqa: F401
    import flyarchive.store.integrity  # noqa: F401
    import flyarchive.summary  # noqa: F401

    xarray.backends.list_engines()
    if "plot" in commands:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure = plt.figure()
        figure.text(0.5, 0.5, "warm-up")
        figure.canvas.draw()
        plt.close(figure)
    if "render" in commands:
        import flyarchive.distribute.api  # noqa: F401
        import flyarchive.render.opengl_pipeline  # noqa: F401


def _child(command: str, argv: list[str]) -> dict:
    """Run one command here (in the child); what happened, as JSON-friendly values.

    The command's modules are imported first (:func:`_warm`), so that ``seconds`` times
    the command, not one-time start-up work.
    """
    _warm([command])
    start = time.perf_counter()
    if command == "open_archive":
        from flyarchive import open_archive

        done = run_caught(lambda: open_archive(argv[0]).load())
    else:
        done = run_caught(argv)
    seconds = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {**done, "seconds": seconds, "maxrss_mb": rss}


def run_caught(command: Sequence[str] | Callable[[], object]) -> dict:
    """Run here a CLI command (its arguments) or an API call (a function), whatever it
    raises; what it did, as JSON-friendly values.

    Returns:
        ``exit``: the CLI's exit status, or 0 for an API call that returned; 2 for a
        flyarchive error, 1 for any other exception. ``error_type``: the exception's
        class, ``"FlyarchiveError"`` for a CLI exit 2, None when it worked. ``message``:
        the CLI's stderr, or the exception's message.
    """
    stderr = io.StringIO()
    error_type, code = None, 0
    try:
        if callable(command):
            command()
        else:
            from flyarchive.cli import main

            with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
                code = main(list(command))
            error_type = "FlyarchiveError" if code == 2 else None
    except BaseException as err:  # noqa: BLE001 - reported to the parent, whatever it is
        from flyarchive.errors import FlyarchiveError

        code = 2 if isinstance(err, FlyarchiveError) else 1
        error_type = type(err).__name__
        stderr.write(str(err)[:2000])
    return {"exit": code, "error_type": error_type, "message": stderr.getvalue().strip()}


def run_isolated(command: str, url: str, workdir: Path, *, memory_bytes: int = MEMORY_CAP,
                 timeout_s: float = 60.0) -> Outcome:
    """Run ``command`` on ``url`` in a child process limited to ``memory_bytes`` of address
    space and ``timeout_s`` seconds (then killed).

    Args:
        command: One of :data:`COMMANDS`.
        url: The archive.
        workdir: Folder for the command's outputs (created).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [url] if command == "open_archive" else command_argv(command, url, workdir)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))

    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "flyarchive.testing.hostile", command, *argv],
            capture_output=True, text=True, timeout=timeout_s, preexec_fn=limit, env=_env(),
        )
    except subprocess.TimeoutExpired:
        return Outcome(None, None, f"did not finish within {timeout_s} s (killed)", None,
                       time.perf_counter() - start, None)
    wall = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return Outcome(None, None, f"the child died (exit {done.returncode}): "
                       f"{done.stderr.strip()[-500:]}", None, wall, None)
    return Outcome(wall_s=wall, **json.loads(lines[-1]))


def run_isolated_many(jobs: Sequence[tuple[str, str, Path]], *,
                      memory_bytes: int = MEMORY_CAP, timeout_s: float = 60.0,
                      warm: str | None = None) -> list[Outcome]:
    """:func:`run_isolated` for each ``(command, url, workdir)`` of ``jobs``, through one
    child process that imports once and forks a process per job, capped at ``memory_bytes``
    of address space and killed after ``timeout_s`` (:func:`flyarchive.testing.forks.run_forked`).

    Each job runs in an address space of its own, as with :func:`run_isolated`; ``wall_s``
    is its forked process's, and ``maxrss_mb`` counts what that process shares with the
    child it was forked from (use :func:`run_isolated` to measure memory).

    Args:
        warm: A sound archive (:func:`make_sound`) the child reads first with ``info``,
            ``open_archive`` and ``verify``, so that first-use work is done once.
    """
    from flyarchive.testing.forks import run_forked

    todo = []
    for command, url, workdir in jobs:
        workdir.mkdir(parents=True, exist_ok=True)
        argv = [url] if command == "open_archive" else command_argv(command, url, workdir)
        todo.append({"command": command, "argv": argv})
    warming = [{"command": c, "argv": [warm] if c == "open_archive" else [c, warm]}
               for c in ("info", "open_archive", "verify")] if warm else []
    done = run_forked("flyarchive.testing.hostile", todo, memory_bytes=memory_bytes,
                      timeout_s=timeout_s, warm=warming, env=_env())
    return [Outcome(wall_s=d["wall_s"], **d["result"]) if "result" in d
            else Outcome(None, None, d["died"], None, d["wall_s"], None) for d in done]


def _env() -> dict[str, str]:
    """The environment of a child that runs commands: few malloc arenas (a smaller address
    space under the cap), EGL for rendering."""
    return {**os.environ, "MALLOC_ARENA_MAX": "2",
            "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}


#: Bounds every command must keep on a hostile archive: seconds inside the command, MiB.
MAX_SECONDS, MAX_MB = 2.0, 512.0


def passed(outcome: Outcome) -> bool:
    """True when a command refused cleanly (exit 2, or verify's exit 1 listing problems)
    or worked, within :data:`MAX_SECONDS` and :data:`MAX_MB`."""
    clean = outcome.exit in (0, 2) or (outcome.exit == 1 and outcome.error_type is None)
    return (clean and outcome.seconds is not None and outcome.seconds < MAX_SECONDS
            and outcome.maxrss_mb is not None and outcome.maxrss_mb < MAX_MB)


def hostile_table(workdir: Path, *, commands: Sequence[str] = COMMANDS,
                  cases: Sequence[str] | None = None,
                  progress: Callable[[str], None] | None = None) -> list[dict]:
    """Run every command on every hostile case, each in a capped child.

    Returns:
        One row per case: ``case``, ``outcomes`` (command -> :meth:`Outcome.to_json`),
        ``max_seconds``, ``max_mb``, ``unchanged`` (the archive's files after all commands
        equal those before), ``passed_off`` (for committed frames missing: the commands that
        read them and exited 0, passing the hole off as data) and ``passed`` (every command
        :func:`passed`, nothing passed off).
    """
    sound = make_sound(str(workdir / "sound.zarr"))
    rows = []
    for i, name in enumerate(cases or list(CASES)):
        url = make_case(sound, name, workdir / f"hostile-{i}.zarr")
        before = snapshot(Path(url))
        outcomes = {c: run_isolated(c, url, workdir / f"out-{i}-{c}") for c in commands}
        for command, outcome in outcomes.items():
            if progress:
                progress(f"  hostile {name} / {command}: exit {outcome.exit} "
                         f"{outcome.error_type or ''} {outcome.seconds} s {outcome.maxrss_mb} MiB "
                         f"{outcome.message[:160]!r}")
        seconds = [o.seconds for o in outcomes.values()]
        memory = [o.maxrss_mb for o in outcomes.values()]
        readers = MISSING_CASES[name][1] if name in MISSING_CASES else ()
        passed_off = [c for c in readers if c in outcomes and outcomes[c].exit == 0]
        rows.append({
            "case": name,
            "outcomes": {c: o.to_json() for c, o in outcomes.items()},
            "max_seconds": None if None in seconds else max(seconds),
            "max_mb": None if None in memory else max(memory),
            "unchanged": snapshot(Path(url)) == before,
            "passed_off": passed_off,
            "passed": all(passed(o) for o in outcomes.values()) and snapshot(Path(url)) == before
            and not passed_off,
        })
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    from flyarchive.testing.forks import FORKED, serve_forked

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [FORKED]:  # run_isolated_many's child
        _warm(COMMANDS)
        return serve_forked(lambda job: _child(job["command"], job["argv"]), argv[1:])
    parser = argparse.ArgumentParser(description="Run one command on an archive (child side).")
    parser.add_argument("command", choices=COMMANDS)
    parser.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    print(json.dumps(_child(args.command, list(args.args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())

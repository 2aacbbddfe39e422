"""Fault harness for rendering: kill or interrupt a render and check what it left behind.

Used by ``tests/reliability/test_render_kill.py`` and ``scripts/reliability_report.py``.
:func:`render_kill_trial` starts ``flyarchive render`` in a child process (in that
process with ``--workers 0``, or on its own LocalCluster of worker processes) in a
session of its own and with a temporary folder (``TMPDIR``) of its own. Its ffmpeg is
wrapped by an :class:`EncoderGate`: one chosen encoder waits at its start until the
trial opens the gate, so the render cannot finish before it is stopped. The child is
stopped while that encoder waits, at one of two moments (:data:`STOPS`): ``"mid-render"``
(once the encoder chosen by the seed waits) or ``"first-video"`` (once the manifest lists
a finished video, the event its manifest journal makes; a later encoder waits), by
SIGKILL to the child (its worker processes die with it), SIGINT to its process group (a
terminal's Ctrl-C) or SIGTERM to the child (``kill PID``). The gate opens right after the
signal (the stopped render meets that ffmpeg as any still encoding). Then it checks:

- no final video is half-written: every ``world*/*.mp4`` decodes to all its frames;
- after Ctrl-C or SIGTERM: exit status 130 or 143, one line on stderr, nothing left
  behind but finished videos and the manifest, and every video the manifest lists is
  there, whole;
- a second render into the same folder (``--overwrite``; after ``"first-video"``:
  ``--resume``, in its own process) succeeds and leaves nothing but the videos and the
  manifest, in the output folder and in the temporary folder: what the killed run left
  is removed by it. ``--resume`` keeps every video the manifest listed (the same file,
  untouched), renders the rest, and lists them all.

Nothing here is needed to record or replay.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from flyarchive.testing.trials import TrialOutcome

__all__ = ["RenderKillConfig", "RenderKillResult", "RenderArchive", "render_kill_trial",
           "make_render_archive", "EncoderGate", "WHERE", "SIGNALS", "STOPS"]

#: Where the killed render runs: in its own process, or on its own LocalCluster.
WHERE = ("process", "dask")
#: How it is stopped: SIGKILL to the process, SIGINT to its process group (Ctrl-C), or
#: SIGTERM to the process.
SIGNALS = ("kill", "int", "term")
#: When it is stopped: mid-render (while the encoder chosen by the seed waits at the gate),
#: or as soon as the manifest lists a finished video (while a later encoder waits).
STOPS = ("mid-render", "first-video")
#: Exit status of a render stopped by each signal.
_EXITS = {"kill": -signal.SIGKILL, "int": 130, "term": 143}
_SIZE = "48x64"
_CAMERAS = ("front", "top")
#: The child: the console script's entry point (``python -m`` would turn a caught
#: KeyboardInterrupt into a SIGINT exit status, a CPython quirk of ``-m``).
_CHILD = "import sys; from flyarchive.cli import main; sys.exit(main(sys.argv[1:]))"


#: The ffmpeg of a render under test (``IMAGEIO_FFMPEG_EXE``). While the file ``at`` holds a
#: number k > 0, an encoder (frames on its stdin) takes the next number as it starts; the
#: k-th writes its pid to the FIFO ``held`` and waits for a line on the FIFO ``gate`` (both
#: opened read-write: neither open blocks), unless the file ``opened`` is there. Then it,
#: and every other call at once, becomes the real ffmpeg (same pid).
_GATE_SH = r"""#!/bin/sh
g="$FLYARCHIVE_TEST_GATE"
at=$(cat "$g/at" 2>/dev/null)
case " $* " in
*" -i - "*)
    if [ -n "$at" ] && [ "$at" -gt 0 ]; then
        n=1
        while ! mkdir "$g/started-$n" 2>/dev/null; do
            n=$((n + 1))
            [ "$n" -gt 100000 ] && break
        done
        if [ "$n" = "$at" ]; then
            exec 3<>"$g/gate" 4<>"$g/held"
            echo $$ >&4
            [ -e "$g/opened" ] || read -r _ <&3
            exec 3<&- 4<&-
        fi
    fi;;
esac
exec "$FLYARCHIVE_TEST_FFMPEG" "$@"
"""


class EncoderGate:
    """ffmpeg wrapped for a render under test: the ``at``-th encoder to start (an ffmpeg
    reading frames from its stdin, counted over every process that has :attr:`env`) waits
    at its start until :meth:`open`, so that its video cannot finish before then.

    ``with EncoderGate(folder, at=1) as gate:`` run the render with :attr:`env` in its
    environment (``IMAGEIO_FFMPEG_EXE``: a shell script in ``folder``; worker processes
    inherit it), :meth:`wait_held`, stop the render, :meth:`open`. :meth:`arm` holds
    another encoder from then on (processes started with :attr:`env` earlier included).
    On exit the gate is opened and the held ffmpeg waited for, so that nothing it
    writes comes later.
    """

    def __init__(self, folder: str | os.PathLike[str], at: int = 1) -> None:
        import imageio_ffmpeg

        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        for name in ("gate", "held"):
            os.mkfifo(self.folder / name)
        script = self.folder / "ffmpeg"
        script.write_text(_GATE_SH)
        script.chmod(0o755)
        #: What the render's environment needs.
        self.env = {"IMAGEIO_FFMPEG_EXE": str(script), "FLYARCHIVE_TEST_GATE": str(self.folder),
                    "FLYARCHIVE_TEST_FFMPEG": imageio_ffmpeg.get_ffmpeg_exe()}
        #: The held encoder's process id, once it waits.
        self.pid: int | None = None
        self._held = os.open(self.folder / "held", os.O_RDWR | os.O_NONBLOCK)
        self._said = b""
        self.arm(at)

    def __enter__(self) -> EncoderGate:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
        os.close(self._held)

    def arm(self, at: int) -> None:
        """From now on hold the ``at``-th encoder to start (0: none)."""
        for started in self.folder.glob("started-*"):
            started.rmdir()
        (self.folder / "opened").unlink(missing_ok=True)
        self.pid, self._said = None, b""
        (self.folder / "at.new").write_text(f"{at}\n")
        (self.folder / "at.new").replace(self.folder / "at")

    def wait_held(self, timeout_s: float, alive: Callable[[], bool] = lambda: True) -> bool:
        """Wait until the encoder waits at the gate, while ``alive()``; whether it does."""
        deadline = time.monotonic() + timeout_s
        while self.pid is None and time.monotonic() < deadline and alive():
            if select.select([self._held], [], [], 0.2)[0]:
                self._said += os.read(self._held, 64)
                if self._said.endswith(b"\n"):
                    self.pid = int(self._said)
        return self.pid is not None

    def open(self) -> None:
        """Let the held encoder, if any (now or later), become ffmpeg."""
        (self.folder / "opened").touch()
        try:
            fd = os.open(self.folder / "gate", os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: no encoder holds the FIFO (none came yet, or it was killed)
            return
        try:
            os.write(fd, b"go\n")
        except BrokenPipeError:  # the encoder died between the open and the write (a kill)
            pass
        finally:
            os.close(fd)

    def release(self, timeout_s: float = 60.0) -> None:
        """:meth:`open`, then wait until the held encoder's ffmpeg is gone."""
        self.open()
        if self.pid is not None:
            _wait_gone([self.pid], time.monotonic() + timeout_s)


@dataclass(frozen=True)
class RenderKillConfig:
    """One trial.

    Attributes:
        where: ``"process"`` (``--workers 0``) or ``"dask"`` (a LocalCluster of ``workers``).
        how: ``"kill"`` (SIGKILL to the render process), ``"int"`` (SIGINT to its
            process group) or ``"term"`` (SIGTERM to the render process).
        seed: ``stop="mid-render"``: the encoder that waits at the gate is the
            ``1 + seed % videos``-th to start (videos: worlds x cameras).
        timeout_s: Seconds to wait for each step (start, exit, rerun).
        stop: When: ``"mid-render"`` or ``"first-video"`` (then the next render resumes).
        workers: Worker processes of the LocalCluster (``where="dask"``); a stop at the
            first video needs 2 (one goes on while the other's encoder is held).
    """

    where: str = "process"
    how: str = "kill"
    seed: int = 0
    timeout_s: float = 180.0
    stop: str = "mid-render"
    workers: int = 2

    def __post_init__(self) -> None:
        if self.where not in WHERE or self.how not in SIGNALS or self.stop not in STOPS:
            raise ValueError(f"where must be one of {WHERE}, how one of {SIGNALS} and stop one "
                             f"of {STOPS}, got {self.where!r}, {self.how!r}, {self.stop!r}.")


@dataclass
class RenderKillResult(TrialOutcome):
    """What one trial found.

    Attributes:
        config: The trial.
        stopped_mid_render: The child was still rendering when the signal came.
        exit_code: The child's exit status (negative: killed by that signal).
        stderr: What the child printed on stderr.
        finals: Final videos present after the stop.
        half_written: Final videos that do not decode to all their frames.
        left_after_stop: Files and folders the stopped run left (output and TMPDIR).
        left_after_rerun: The same after a second render into the same folder.
        rerun_ok: The second render exited 0 and every video decodes to all its frames.
        listed: Videos the manifest listed after the stop.
        listed_missing: Of those, the ones not there whole after the stop.
        kept: ``stop="first-video"``: the listed videos that the resumed render left
            untouched (same inode, size and modification time).
        resumed_listed: Videos the manifest lists after the resumed render.
        problems: One sentence per failed check; empty when the trial passed.
    """

    config: RenderKillConfig
    stopped_mid_render: bool = False
    exit_code: int | None = None
    stderr: str = ""
    finals: list[str] = field(default_factory=list)
    half_written: list[str] = field(default_factory=list)
    left_after_stop: list[str] = field(default_factory=list)
    left_after_rerun: list[str] = field(default_factory=list)
    rerun_ok: bool = False
    listed: list[str] = field(default_factory=list)
    listed_missing: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    resumed_listed: int = 0
    problems: list[str] = field(default_factory=list)

    VERDICT = "passed"

    @property
    def passed(self) -> bool:
        return self.survived


@dataclass(frozen=True)
class RenderArchive:
    """An archive to render: its path, its model's XML file, worlds and frames per world."""

    url: str
    model: str
    n_worlds: int
    n_frames: int


def make_render_archive(folder: str | os.PathLike[str], *, n_worlds: int = 2,
                        n_steps: int = 400) -> RenderArchive:
    """A tiny-model archive to render (a frame every 20 steps of 2 ms) and its model file."""
    from flyarchive import TrajectoryRecorder
    from flyarchive.testing import TINY_XML, simulate, tiny_model

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    url, xml = folder / "render.zarr", folder / "tiny.xml"
    xml.write_text(TINY_XML)
    model = tiny_model()
    with TrajectoryRecorder(str(url), model, output_fps=25, playback_speed=1.0,
                            chunk_frames=10) as recorder:
        simulate(model, n_worlds, n_steps, recorder.record_as_needed)
    return RenderArchive(str(url), str(xml), n_worlds, recorder.n_frames)


def render_kill_trial(archive: RenderArchive, workdir: str | os.PathLike[str],
                      config: RenderKillConfig, *, pythonpath: str | None = None
                      ) -> RenderKillResult:
    """Render, stop the render mid-way, check, render again, check.

    Args:
        archive: From :func:`make_render_archive`.
        workdir: An empty folder for this trial (output and temporary folders).
        config: Where the render runs and how it is stopped.
        pythonpath: ``PYTHONPATH`` of the child processes (e.g. an older checkout to
            compare with); None: this process's ``sys.path``.
    """
    url, xml, n_frames = archive.url, archive.model, archive.n_frames
    work = Path(workdir)
    out, tmp = work / "videos", work / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env = _child_env(tmp, pythonpath)
    workers = "0" if config.where == "process" else str(config.workers)
    command = [sys.executable, "-c", _CHILD, "render", url, "--model", xml,
               *(a for camera in _CAMERAS for a in ("--camera", camera)), "--size", _SIZE,
               "--out", str(out), "--workers", workers, "--quiet"]
    n_videos = len(_CAMERAS) * archive.n_worlds
    result = RenderKillResult(config)
    with EncoderGate(work / "gate", at=_gated_encoder(config, n_videos)) as gate:
        _stopped_render(command, {**env, **gate.env}, work, gate, result)
    result.finals = [str(p.relative_to(out)) for p in _finals(out)]
    result.half_written = [str(p.relative_to(out)) for p in _finals(out)
                           if _frames(p) != n_frames]
    result.left_after_stop = _leftovers(out, tmp)
    listed = _listed(out)
    result.listed = [str(Path(p).relative_to(out)) for p in listed]
    result.listed_missing = [str(Path(p).relative_to(out)) for p in listed
                             if _frames(Path(p)) != n_frames]
    before = {p: _identity(Path(p)) for p in listed}
    resume = config.stop == "first-video"
    again = [*command[:-3], "--workers", "0", "--quiet",  # in one process: quicker
             "--resume" if resume else "--overwrite"]
    rerun = subprocess.run(again, env=env, cwd=work, capture_output=True, text=True,
                           timeout=config.timeout_s)
    complete = [_frames(p) == n_frames for p in _finals(out)]
    result.rerun_ok = rerun.returncode == 0 and len(complete) == n_videos and all(complete)
    result.left_after_rerun = _leftovers(out, tmp)
    if resume:
        result.kept = [str(Path(p).relative_to(out)) for p, was in before.items()
                       if _identity(Path(p)) == was]
        result.resumed_listed = len(_listed(out))
    result.problems = _problems(result, rerun, n_videos)
    return result


def _gated_encoder(config: RenderKillConfig, n_videos: int) -> int:
    """Which encoder to start waits at the gate: mid-render, the seed's; at the first
    video, the first of the second segment (one segment per video rendered in one process;
    on the cluster, the other worker goes on meanwhile)."""
    if config.stop == "first-video":
        return len(_CAMERAS) + 1
    return 1 + config.seed % n_videos


def _stopped_render(command: list[str], env: dict[str, str], work: Path, gate: EncoderGate,
                    result: RenderKillResult) -> None:
    """Run the render of ``command`` in a session of its own and stop it at the trial's
    moment (while the gate holds an encoder); its exit status and stderr into ``result``."""
    config, out = result.config, work / "videos"
    child = subprocess.Popen(command, env=env, start_new_session=True, cwd=work,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + config.timeout_s
        held = gate.wait_held(config.timeout_s, alive=lambda: child.poll() is None)
        if held and config.stop == "first-video":
            held = _wait_first_video(child, out, deadline)
        result.stopped_mid_render = held and _stop(child, config, deadline, gate)
        _, result.stderr = child.communicate(timeout=config.timeout_s)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    result.exit_code = child.returncode


def _child_env(tmp: Path, pythonpath: str | None) -> dict[str, str]:
    env = dict(os.environ, TMPDIR=str(tmp), MUJOCO_GL="egl", LP_NUM_THREADS="1")
    env["PYTHONPATH"] = pythonpath if pythonpath is not None else os.pathsep.join(
        p for p in sys.path if p)
    return env


def _wait_first_video(child: subprocess.Popen[str], out: Path, deadline: float) -> bool:
    """Wait until the manifest lists a finished video (polling the file the render's
    manifest journal writes); whether it does while the child runs."""
    while child.poll() is None and time.monotonic() < deadline and not _listed(out):
        time.sleep(0.02)
    return bool(_listed(out)) and child.poll() is None


def _stop(child: subprocess.Popen[str], config: RenderKillConfig, deadline: float,
          gate: EncoderGate) -> bool:
    """Send the trial's signal, open the gate, and wait until the child's processes are
    gone; whether the child was still running when the signal came."""
    import psutil

    if child.poll() is not None:
        return False
    family = [child.pid] + [p.pid for p in psutil.Process(child.pid).children(recursive=True)]
    if config.how == "kill":
        os.kill(child.pid, signal.SIGKILL)
    elif config.how == "term":
        os.kill(child.pid, signal.SIGTERM)
    else:
        os.killpg(child.pid, signal.SIGINT)
    gate.open()
    _wait_gone(family, deadline)
    return True


def _listed(out: Path) -> list[str]:
    """The video paths the manifest in ``out`` lists (none while it is missing or being
    replaced)."""
    import json

    try:
        return [v["path"] for v in json.loads((out / "manifest.json").read_text())["videos"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def _identity(path: Path) -> tuple[int, int, int] | None:
    """Inode, size and modification time of a file (None if missing): unchanged when the
    file was kept."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _wait_gone(pids: list[int], deadline: float) -> None:
    """Wait until every process of ``pids`` has exited (worker processes notice that the
    killed render is gone on their own)."""
    import psutil

    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                alive.append(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
            except psutil.NoSuchProcess:
                continue
        if not any(alive):
            return
        time.sleep(0.05)


def _finals(out: Path) -> list[Path]:
    return sorted(out.glob("world*/*.mp4"))


def _frames(path: Path) -> int:
    from flyarchive.video import read_video

    try:
        return int(read_video(path).shape[0])
    except Exception:  # not a decodable video
        return -1


def _leftovers(out: Path, tmp: Path) -> list[str]:
    """Everything in the output folder but videos and the manifest, and flyarchive's
    folders in the temporary folder (Dask keeps its own ``dask-scratch-space`` there)."""
    kept = {out / "manifest.json", *_finals(out), *(p.parent for p in _finals(out))}
    left = [p for p in out.rglob("*") if p not in kept] if out.exists() else []
    left += [p for p in tmp.iterdir() if p.name.startswith("flyarchive")]
    return sorted(str(p) for p in left)


def _problems(result: RenderKillResult, rerun: subprocess.CompletedProcess[str],
              n_videos: int) -> list[str]:
    problems = []
    config = result.config
    if result.half_written:
        problems.append(f"half-written final videos: {result.half_written}")
    if result.listed_missing:
        problems.append(f"listed in the manifest but not there whole: {result.listed_missing}")
    if config.how != "kill" and result.stopped_mid_render:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        what = {"int": "Ctrl-C", "term": "SIGTERM"}[config.how]
        if result.exit_code != _EXITS[config.how]:
            problems.append(f"{what} exit status {result.exit_code}, expected {_EXITS[config.how]}")
        if len(lines) != 1:
            problems.append(f"{what} printed {len(lines)} lines on stderr, expected 1: "
                            f"{result.stderr[-600:]!r}")
        if result.left_after_stop:
            problems.append(f"left after {what}: {result.left_after_stop}")
    if config.stop == "first-video" and result.stopped_mid_render:
        if not result.listed:
            problems.append("the manifest listed no finished video after the stop")
        if sorted(result.kept) != sorted(result.listed):
            problems.append(f"--resume did not keep {sorted(set(result.listed) - set(result.kept))}")
        if result.rerun_ok and result.resumed_listed != n_videos:
            problems.append(f"the manifest lists {result.resumed_listed} of the {n_videos} "
                            "videos after --resume")
    if not result.rerun_ok:
        problems.append(f"the next render failed (exit {rerun.returncode}): {rerun.stderr[-600:]!r}")
    if result.left_after_rerun:
        problems.append(f"left after the next render: {result.left_after_rerun}")
    return problems


def _main(argv: list[str] | None = None) -> int:
    """``python -m flyarchive.testing.render_kills [--where dask] [--how int] [--seed 3]``: one
    trial, printed as JSON."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description=_main.__doc__)
    parser.add_argument("--where", choices=WHERE, default="process")
    parser.add_argument("--how", choices=SIGNALS, default="kill")
    parser.add_argument("--stop", choices=STOPS, default="mid-render")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    config = RenderKillConfig(args.where, args.how, args.seed, stop=args.stop)
    with tempfile.TemporaryDirectory(prefix="flyarchive-render-kill-") as work:
        result = render_kill_trial(make_render_archive(Path(work) / "archive"),
                                   Path(work) / "trial", config)
    print(json.dumps(result.to_json(), indent=2))
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(_main())

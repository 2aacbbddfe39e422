"""Renders killed (SIGKILL), interrupted (Ctrl-C) or terminated (SIGTERM) mid-way, in their
own process and on a LocalCluster: no half-written video under a final name, nothing left
after the next run, Ctrl-C exits 130 and SIGTERM 143 with one line; a stop keeps the
finished videos listed in the manifest, and ``--resume`` keeps them untouched and renders
the rest. Real processes, real signals (flyarchive.testing.render_kills); one encoder of
the render waits at a gate until the signal has come, so the render cannot finish first.

One trial per signal by default: Ctrl-C mid-render on a LocalCluster (its workers die with
the render), and a stop at the first finished video by SIGTERM and by SIGKILL in the
render's process (a SIGKILL's leftovers: removed by the next render). The other
combinations (``sweep``: ``--run-sweeps``) repeat these in the other place or at the
other moment; ``scripts/reliability_report.py --render-kills N`` runs every where x how x
stop combination N times."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("MUJOCO_GL", "egl")

from flyarchive.testing.fixtures import snapshot  # noqa: E402
from flyarchive.testing.render_kills import (  # noqa: E402
    EncoderGate,
    RenderArchive,
    RenderKillConfig,
    make_render_archive,
    render_kill_trial,
)

pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(400)]
#: A repeat of a stop that a default trial makes by the same signal, elsewhere or later.
_PROCESS_AGAIN = pytest.param("process", marks=pytest.mark.sweep)
_DASK_AGAIN = pytest.param("dask", marks=pytest.mark.sweep)


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> RenderArchive:
    """3 worlds of 11 frames, 6 videos (cameras 'front' and 'top'); a gate holds one
    encoder until the stop, so any length is long enough."""
    return make_render_archive(tmp_path_factory.mktemp("render-kill"), n_worlds=3, n_steps=200)


def _why(trial: Any) -> str:
    """What a trial that did not stop mid-render saw instead."""
    return (f"exit {trial.exit_code}, stderr {trial.stderr[-800:]!r}, listed {trial.listed}, "
            f"left {trial.left_after_stop}")


# SIGKILL mid-render: the same checks as the default trial of a SIGKILL at the first video
# (no half-written video, the next render removes what it left).
@pytest.fixture(scope="module", params=[_PROCESS_AGAIN, _DASK_AGAIN])
def killed(request: pytest.FixtureRequest, archive: RenderArchive,
           tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A render SIGKILLed mid-way, then rendered again into the same folder."""
    work = tmp_path_factory.mktemp(f"killed-{request.param}")
    return render_kill_trial(archive, work, RenderKillConfig(request.param, "kill", seed=1))


@pytest.fixture(scope="module", params=[_PROCESS_AGAIN, "dask"])
def interrupted(request: pytest.FixtureRequest, archive: RenderArchive,
                tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A render interrupted mid-way by SIGINT to its process group (Ctrl-C in a terminal),
    then rendered again into the same folder; on a LocalCluster of one worker process."""
    work = tmp_path_factory.mktemp(f"interrupted-{request.param}")
    config = RenderKillConfig(request.param, "int", seed=3, workers=1)
    return render_kill_trial(archive, work, config)


def test_sigkill_mid_render_leaves_no_half_written_video(killed: Any) -> None:
    assert killed.stopped_mid_render and killed.exit_code == -signal.SIGKILL

    assert killed.half_written == []


def test_the_next_render_removes_what_a_killed_render_left(killed: Any) -> None:
    assert killed.stopped_mid_render and killed.left_after_stop  # a parts or scratch folder

    assert killed.rerun_ok
    assert killed.left_after_rerun == []


def test_ctrl_c_mid_render_exits_130_with_one_line(interrupted: Any) -> None:
    assert interrupted.stopped_mid_render, _why(interrupted)

    assert interrupted.exit_code == 130
    assert interrupted.stderr == "flyarchive render: interrupted\n"


def test_ctrl_c_mid_render_leaves_nothing_behind(interrupted: Any) -> None:
    assert interrupted.stopped_mid_render, _why(interrupted)

    assert interrupted.half_written == [] and interrupted.left_after_stop == []
    assert interrupted.rerun_ok and interrupted.left_after_rerun == []


# ----------------------------------------------------------------------------- keep, resume
@pytest.fixture(scope="module", params=[
    pytest.param(("process", "int"), marks=pytest.mark.sweep),  # Ctrl-C: as `interrupted`
    ("process", "term"), ("process", "kill"),
    pytest.param(("dask", "term"), marks=pytest.mark.sweep),  # on a cluster: as `interrupted`
], ids=lambda p: "-".join(p))
def resumed(request: pytest.FixtureRequest, archive: RenderArchive,
            tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A render stopped as soon as its manifest lists a finished video (the event its
    manifest journal makes), then continued with --resume."""
    where, how = request.param
    work = tmp_path_factory.mktemp(f"resumed-{where}-{how}")
    return render_kill_trial(archive, work, RenderKillConfig(where, how, stop="first-video"))


def test_a_stop_keeps_finished_videos_whole_and_listed(resumed: Any,
                                                       archive: RenderArchive) -> None:
    expected_exit = {"int": 130, "term": 143, "kill": -signal.SIGKILL}[resumed.config.how]
    assert resumed.stopped_mid_render, _why(resumed)

    assert resumed.exit_code == expected_exit
    assert resumed.listed and resumed.listed_missing == [] and resumed.half_written == []
    assert len(resumed.finals) < 2 * archive.n_worlds  # stopped before the last video


def test_a_stop_leaves_only_finished_videos_or_what_the_next_run_removes(resumed: Any) -> None:
    said = {"int": "flyarchive render: interrupted\n", "term": "flyarchive render: terminated\n",
            "kill": ""}[resumed.config.how]

    assert resumed.stderr == said
    if resumed.config.how == "kill":  # no answer to SIGKILL: its parts folder stays
        assert resumed.left_after_stop and resumed.left_after_rerun == []
    else:
        assert resumed.left_after_stop == []


def test_resume_keeps_listed_videos_untouched_and_renders_the_rest(
        resumed: Any, archive: RenderArchive) -> None:
    assert resumed.stopped_mid_render, _why(resumed)

    assert resumed.rerun_ok, resumed.problems
    assert sorted(resumed.kept) == sorted(resumed.listed)
    assert resumed.resumed_listed == 2 * archive.n_worlds and resumed.left_after_rerun == []
    assert resumed.problems == []


# ----------------------------------------------------------------------------- a worker dies
@pytest.mark.cluster  # its own: one of its workers is killed
def test_a_worker_killed_mid_render_fails_naming_the_world_and_leaves_no_video(
        archive: RenderArchive, tmp_path: Path) -> None:
    import dask
    import distributed

    from flyarchive.distribute.api import RenderOptions, render_videos
    from flyarchive.errors import RenderFailedError
    from flyarchive.testing import tiny_model

    out = tmp_path / "v"
    (tmp_path / "tmp").mkdir()
    before = snapshot(archive.url)
    options = RenderOptions(size=(48, 64), segment_frames=100)  # one segment per world
    with EncoderGate(tmp_path / "gate") as gate, \
            dask.config.set({"distributed.scheduler.allowed-failures": 0}), \
            distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                     dashboard_address="127.0.0.1:0", silence_logs=50,
                                     env={"MUJOCO_GL": "egl", "LP_NUM_THREADS": "1",
                                          "TMPDIR": str(tmp_path / "tmp"), **gate.env}
                                     ) as cluster, \
            distributed.Client(cluster, set_as_default=False) as client:
        (pid,) = client.run(os.getpid).values()
        killer = threading.Thread(target=_kill_when_held, args=(gate, pid))
        killer.start()

        with pytest.raises(RenderFailedError, match=r"world 0, frames 0\.\.10 failed") as err:
            render_videos(archive.url, tiny_model(), "front", str(out), worlds=[0],
                          client=client, options=options)
        killer.join()

    assert gate.pid is not None  # killed while its segment was being encoded
    assert "tcp://" in str(err.value)  # the worker that died
    assert not list(out.rglob("*.mp4")) and not list(out.glob(".parts-*"))
    assert snapshot(archive.url) == before


def _kill_when_held(gate: EncoderGate, pid: int) -> None:
    """SIGKILL the worker process ``pid`` once its encoder waits at the gate, then open it."""
    if gate.wait_held(120):
        os.kill(pid, signal.SIGKILL)
    gate.open()


# ----------------------------------------------------------------------------- liveness
HOLDER = """
import sys
from flyarchive.video.workspace import RunFolder
run = RunFolder.create(sys.argv[1])
print(run.url, flush=True)
sys.stdin.read()  # until killed
"""


def test_a_live_runs_parts_folder_in_another_process_is_never_removed(tmp_path: Path) -> None:
    from flyarchive.video.workspace import RunFolder

    out = tmp_path / "v"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE,
                              stdin=subprocess.PIPE, text=True)
    try:
        theirs = Path(holder.stdout.readline().strip())

        with RunFolder.create(str(out)) as mine:
            assert Path(mine.url).is_dir()

        assert theirs.is_dir() and (theirs / "run.lock").is_file()
    finally:
        holder.kill()
        holder.wait()


def test_a_dead_runs_parts_folder_is_removed_by_the_next_run(tmp_path: Path) -> None:
    from flyarchive.video.workspace import RunFolder

    out = tmp_path / "v"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE,
                              stdin=subprocess.PIPE, text=True)
    theirs = Path(holder.stdout.readline().strip())
    holder.kill()
    holder.wait()

    with RunFolder.create(str(out)):
        pass

    assert not theirs.exists()
    assert list(out.iterdir()) == []

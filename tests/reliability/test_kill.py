"""A recording process killed with SIGKILL leaves a valid archive with every committed frame.

The two kills here (``sweep``: ``--run-sweeps``) repeat, at other frames, what the default
trial of tests/reliability/test_reliability.py::test_sigkill_at_a_random_point_keeps_committed_frames_and_resumes
checks of the same kill (committed frames equal to the simulation, equal across worlds, at
least those reported; the resumed recording equal to the simulation)."""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from flyarchive import TrajectoryRecorder, open_archive
from flyarchive.testing import reference_frames, simulate
from flyarchive.testing.fixtures import record

pytestmark = pytest.mark.subprocess

WRITER = """
import sys
from flyarchive import TrajectoryRecorder
from flyarchive.testing import simulate, tiny_model
model = tiny_model()
recorder = TrajectoryRecorder(sys.argv[1], model, chunk_frames=5)
last = [0]
def on_step(datas):
    recorder.record_as_needed(datas)
    if recorder.committed_frames != last[0]:
        last[0] = recorder.committed_frames
        print(last[0], flush=True)
simulate(model, 3, 100_000, on_step)
"""


def record_and_kill(url: str, after_frames: int) -> int:
    """Start a recording process, SIGKILL it once it reports a commit; return the last report."""
    proc = subprocess.Popen([sys.executable, "-c", WRITER, url], stdout=subprocess.PIPE, text=True)
    reported = 0
    while reported < after_frames:
        reported = int(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return reported


@pytest.mark.sweep
@pytest.mark.timeout(120)
def test_sigkill_mid_recording_keeps_committed_frames(tiny, tmp_path):
    url = str(tmp_path / "killed.zarr")
    reported = record_and_kill(url, 40)

    ds = open_archive(url)
    n = int(ds.n_frames.min())
    expected = reference_frames(tiny, 3, 4 * n + 4)

    assert n >= reported
    assert (ds.n_frames.values == n).all()
    np.testing.assert_array_equal(ds.qpos.values[:, :n], expected["qpos"][:, :n])
    np.testing.assert_array_equal(ds.mocap_quat.values[:, :n], expected["mocap_quat"][:, :n])
    np.testing.assert_array_equal(ds.sim_time.values[:n], expected["time"][:n])


@pytest.mark.sweep
@pytest.mark.timeout(120)
def test_resume_after_sigkill_continues_the_recording(tiny, tmp_path):
    url = str(tmp_path / "resumed.zarr")
    record_and_kill(url, 20)
    expected = reference_frames(tiny, 3, 400)

    recorder = TrajectoryRecorder(url, tiny, chunk_frames=5, mode="a")
    with recorder:
        simulate(tiny, 3, 400, recorder.record_as_needed)

    ds = open_archive(url)
    np.testing.assert_array_equal(ds.qpos.values, expected["qpos"])
    np.testing.assert_array_equal(ds.sim_time.values, expected["time"])


def test_commit_interrupted_while_growing_arrays_still_opens(tiny, tmp_path):
    import zarr

    url = record(tiny, str(tmp_path / "grown.zarr"), n_steps=40, chunk_frames=4)
    expected = reference_frames(tiny, 2, 40)
    zarr.open_group(url, mode="r+")["qpos"].resize((2, 16, tiny.nq))  # killed after this resize

    ds = open_archive(url)

    np.testing.assert_array_equal(ds.qpos.values, expected["qpos"])
    np.testing.assert_array_equal(ds.mocap_pos.values, expected["mocap_pos"])


def killed_writer(url: str, patch: str, worlds: int, steps: int) -> int:
    """Run a recording of ``worlds`` tiny worlds and ``steps`` steps into ``url`` in a child
    process that ``patch`` (code calling ``die()``: SIGKILL) kills; its exit code."""
    script = f"""
import os, signal, sys
import numpy as np
from zarr.core.array import AsyncArray
import flyarchive.store.writer as writer
from flyarchive import TrajectoryRecorder
from flyarchive.testing import simulate, tiny_model
def die():
    os.kill(os.getpid(), signal.SIGKILL)
{patch}
model = tiny_model()
with TrajectoryRecorder(sys.argv[1], model, chunk_frames=5) as recorder:
    simulate(model, {worlds}, {steps}, recorder.record_as_needed)
"""
    return subprocess.run([sys.executable, "-c", script, url], timeout=100).returncode


#: Dies in its first commit: the frames' chunks written, n_frames not.
IN_FIRST_COMMIT = """
setitem = AsyncArray.setitem
async def dying(self, selection, value, *args, **kwargs):
    if self.path.endswith("n_frames") and np.any(np.asarray(value) > 0):  # the first commit
        die()
    return await setitem(self, selection, value, *args, **kwargs)
AsyncArray.setitem = dying
"""


@pytest.mark.timeout(120)
def test_a_writer_killed_in_its_first_commit_leaves_an_archive_that_resumes(tiny, tmp_path):
    """It left the frames' chunks and no n_frames chunk, which verify and mode='a' read as
    a lost commit-marker file ("restore from a backup"), though nothing had been committed."""
    from flyarchive import verify

    url = str(tmp_path / "first.zarr")
    assert killed_writer(url, IN_FIRST_COMMIT, 3, 400) == -signal.SIGKILL
    assert list((tmp_path / "first.zarr" / "qpos").rglob("c/*"))  # frames' chunks written

    checked = verify(url)
    assert checked.ok, checked.problems
    assert open_archive(url).n_frames.values.tolist() == [0, 0, 0]
    expected = reference_frames(tiny, 3, 400)
    with TrajectoryRecorder(url, tiny, chunk_frames=5, mode="a") as recorder:
        simulate(tiny, 3, 400, recorder.record_as_needed)
    np.testing.assert_array_equal(open_archive(url).qpos.values, expected["qpos"])


#: Dies between a commit (n_frames written) and its consolidated copy's rewrite.
BEFORE_CONSOLIDATING = """
real, calls = writer.write_consolidated, [0]
def dying(*args, **kwargs):
    calls[0] += 1
    if calls[0] == 3:  # the second commit's last step
        die()
    return real(*args, **kwargs)
writer.write_consolidated = dying
"""


@pytest.mark.timeout(120)
def test_verify_notes_a_consolidated_copy_behind_the_commits_and_an_append_mends_it(tiny,
                                                                                   tmp_path):
    """verify said only OK while plain xarray showed 5 of the 10 committed frames."""
    import xarray as xr

    from flyarchive import verify

    url = str(tmp_path / "behind.zarr")
    killed_writer(url, BEFORE_CONSOLIDATING, 2, 400)

    report = verify(url)
    plain = xr.open_zarr(url).sizes["time"]
    assert report.ok and plain < int(max(report.n_frames))
    assert any(f"consolidated metadata gives {plain} frames of 'time'" in n for n in report.notes)
    with TrajectoryRecorder(url, tiny, chunk_frames=5, mode="a") as recorder:
        simulate(tiny, 2, 200, recorder.record_as_needed)
    assert xr.open_zarr(url).sizes["time"] == int(open_archive(url).n_frames.max())
    assert not any("consolidated" in n for n in verify(url).notes)


#: Dies as its creation writes the commit marker (its zeros, with its zarr.json).
IN_CREATION = """
setitem = AsyncArray.setitem
async def dying(self, selection, value, *args, **kwargs):
    if self.path.endswith("n_frames"):
        die()
    return await setitem(self, selection, value, *args, **kwargs)
AsyncArray.setitem = dying
"""


@pytest.mark.timeout(120)
def test_verify_says_a_creation_killed_before_its_marker_was_interrupted_not_damaged(tiny,
                                                                                   tmp_path):
    from flyarchive import verify

    url = str(tmp_path / "creating.zarr")
    killed_writer(url, IN_CREATION, 3, 40)

    report = verify(url)

    assert not report.ok
    assert report.problems == [
        "Its creation was interrupted before anything was committed (no n_frames marker, no "
        "recorded frame): nothing is lost. Record into it with mode='a' (it is created anew), "
        "or replace it with mode='w'."]
    with TrajectoryRecorder(url, tiny, chunk_frames=5, mode="a") as recorder:
        simulate(tiny, 3, 40, recorder.record_as_needed)
    assert verify(url).ok


def test_verify_says_interrupted_whatever_step_of_the_creation_was_cut(tiny, tmp_path):
    """Kept models' bytes before their group's zarr.json, and a temporary file of the local
    store left in an array's folder, made verify say 'Schema: no variable n_frames'."""
    import shutil

    from flyarchive import verify
    from flyarchive.clock import Timing
    from flyarchive.layout import ModelLayout
    from flyarchive.models import model_bytes
    from flyarchive.store import ArchiveSpec, ArchiveWriter

    url = tmp_path / "cut.zarr"
    spec = ArchiveSpec(ModelLayout.from_model(tiny), Timing(tiny.opt.timestep, 25, 0.2), (0, 1),
                       model=model_bytes(tiny))
    ArchiveWriter.create(str(url), spec).close()  # created, nothing committed; then cut back:
    shutil.rmtree(url / "n_frames")
    (url / "models" / "zarr.json").unlink()
    (url / "mocap_pos" / "zarr.json").rename(url / "mocap_pos" / "zarr.0123abcd.partial")

    report = verify(str(url))

    assert len(report.problems) == 1
    assert report.problems[0].startswith("Its creation was interrupted before anything was")

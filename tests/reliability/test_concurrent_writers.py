"""Several processes writing disjoint world blocks of one archive, as several GPUs would."""

import subprocess
import sys

import numpy as np
import pytest

from flyarchive import open_archive
from flyarchive.clock import Timing
from flyarchive.errors import WorldBlockConflictError
from flyarchive.layout import ModelLayout
from flyarchive.store import ArchiveSpec, ArchiveWriter
from flyarchive.store.integrity import verify
from flyarchive.testing import reference_frames

N_STEPS = 160  # 41 frames at a frame every 4 steps

WRITER = """
import sys
from flyarchive import TrajectoryRecorder
from flyarchive.testing import simulate, tiny_model
url, start, stop = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
model = tiny_model()
recorder = TrajectoryRecorder(url, model, chunk_frames=5, mode="a", world_block=(start, stop))
with recorder:
    simulate(model, stop - start, %d, recorder.record_as_needed, seed=start)
""" % N_STEPS


def shared_archive(model, url, n_worlds=4, shard_worlds=2, capacity=64):
    spec = ArchiveSpec(ModelLayout.from_model(model), Timing(model.opt.timestep, 25, 0.2),
                       tuple(range(n_worlds)), chunk_frames=5, shard_worlds=shard_worlds,
                       capacity_frames=capacity)
    ArchiveWriter.create(url, spec)


@pytest.mark.subprocess
@pytest.mark.timeout(120)
def test_two_processes_writing_disjoint_blocks_both_land(tiny, tmp_path):
    url = str(tmp_path / "shared.zarr")
    shared_archive(tiny, url)

    procs = [subprocess.Popen([sys.executable, "-c", WRITER, url, str(a), str(b)])
             for a, b in ((0, 2), (2, 4))]
    assert [p.wait(timeout=100) for p in procs] == [0, 0]

    ds = open_archive(url)
    first, second = reference_frames(tiny, 2, N_STEPS, seed=0), reference_frames(tiny, 2, N_STEPS, seed=2)
    np.testing.assert_array_equal(ds.qpos.values[:2], first["qpos"])
    np.testing.assert_array_equal(ds.qpos.values[2:], second["qpos"])
    np.testing.assert_allclose(ds.time.values, first["time"], rtol=0, atol=1e-12)
    assert list(ds.n_frames.values) == [41] * 4
    assert verify(url).ok


def test_overlapping_block_is_refused(tiny, tmp_path):
    url = str(tmp_path / "overlap.zarr")
    shared_archive(tiny, url)
    holder = ArchiveWriter.append(url, ModelLayout.from_model(tiny), world_block=(0, 2))  # noqa: F841

    with pytest.raises(WorldBlockConflictError, match=r"overlap the block \[0, 2\)"):
        ArchiveWriter.append(url, ModelLayout.from_model(tiny), world_block=(0, 4))


def test_block_across_a_shard_boundary_is_refused(tiny, tmp_path):
    url = str(tmp_path / "unaligned.zarr")
    shared_archive(tiny, url)

    with pytest.raises(ValueError, match="does not follow shard boundaries"):
        ArchiveWriter.append(url, ModelLayout.from_model(tiny), world_block=(1, 3))


def test_crashed_block_writer_can_be_taken_over(tiny, tmp_path):
    url = str(tmp_path / "takeover.zarr")
    shared_archive(tiny, url)
    layout = ModelLayout.from_model(tiny)
    ArchiveWriter.append(url, layout, world_block=(2, 4))

    writer = ArchiveWriter.append(url, layout, world_block=(2, 4), takeover=True)

    assert writer.world_ids == (2, 3)


def test_block_writing_needs_an_archive_made_for_it(tiny, tmp_path):
    url = str(tmp_path / "single.zarr")
    spec = ArchiveSpec(ModelLayout.from_model(tiny), Timing(0.002, 25, 0.2), (0, 1))
    ArchiveWriter.create(url, spec)

    with pytest.raises(ValueError, match="capacity_frames"):
        ArchiveWriter.append(url, ModelLayout.from_model(tiny), world_block=(0, 1))

"""Positions with mujoco-warp (Warp's CPU device here; FLYARCHIVE_TEST_WARP_DEVICE=cuda on a
GPU): within float32 tolerance of the CPU backend, lazily and streamed into memory."""

from __future__ import annotations

import numpy as np
import pytest

import flyarchive
from flyarchive.analyze.warp_stream import StreamStats, load_positions
from flyarchive.testing.markers import WARP_BACKEND, requires_flygym, requires_warp

pytestmark = [requires_warp, pytest.mark.slow]  # Warp compiles its kernels once per machine

#: float32 kinematics of models a few units across: 1e-4 units (mm for NeuroMechFly).
TOLERANCE = 1e-4

KEYPOINTS = dict(bodies=["fly/c_thorax", "target"], sites=["fly/c_back", "target_tip"],
                 points={"claw": ("fly/lf_tarsus5", "tip")})


def test_the_warp_backend_agrees_with_the_cpu_within_float32(sites_archive):
    expected = flyarchive.positions(sites_archive, **KEYPOINTS, orientations=True).compute()

    actual = flyarchive.positions(sites_archive, **KEYPOINTS, orientations=True,
                                  backend=WARP_BACKEND).compute()

    assert actual.position.dtype == np.float32
    assert np.abs(actual.position.values - expected.position.values).max() < TOLERANCE
    sign = np.sign((actual.orientation.values * expected.orientation.values).sum(-1))[..., None]
    assert np.abs(actual.orientation.values * sign - expected.orientation.values).max() < TOLERANCE


@pytest.mark.parametrize("processes, reader", [(0, "shards"), (2, "processes")])
def test_streamed_positions_equal_the_lazy_ones_with_masks_and_windows(uneven_archive, processes,
                                                                      reader):
    lazy = flyarchive.positions(uneven_archive, ["hand", "target"], backend=WARP_BACKEND,
                                time=(0.016, 0.12)).compute()
    stats = StreamStats()

    streamed = load_positions(uneven_archive, ["hand", "target"], backend=WARP_BACKEND,
                              time=(0.016, 0.12), batch_frames=7, readers=2, stats=stats,
                              read_processes=processes)

    assert np.array_equal(streamed.values, lazy.values, equal_nan=True)
    assert np.isnan(streamed.values[0, 10:]).all() and np.isfinite(streamed.values[1]).all()
    assert stats.frames == 2 * 14 and stats.batches == 4
    assert stats.reader == reader and stats.kinematics_seconds > 0 and stats.copy_out_seconds > 0


def test_streamed_positions_of_a_dataset_in_memory_equal_the_lazy_ones(sites_archive, sites_model):
    loaded = flyarchive.open_archive(sites_archive).load()
    lazy = flyarchive.positions(sites_archive, "*", backend=WARP_BACKEND).compute()
    stats = StreamStats()

    streamed = load_positions(loaded, "*", model=sites_model, backend=WARP_BACKEND,
                              batch_frames=16, readers=2, stats=stats)

    assert stats.reader == "dask"
    assert np.array_equal(streamed.values, lazy.values)


@requires_flygym
def test_neuromechfly_on_warp_agrees_with_the_cpu_within_float32(tmp_path):
    import mujoco

    from flyarchive.interop import nmf
    from flyarchive.testing.fixtures import write_states

    world = nmf.build_world()
    data = mujoco.MjData(world.model)
    mujoco.mj_resetDataKeyframe(world.model, data, world.neutral_key)
    qpos = data.qpos + np.random.default_rng(2).normal(0, 0.2, (2, 5, world.model.nq))
    url = write_states(str(tmp_path / "nmf.zarr"), world.model, qpos)
    points = flyarchive.tarsus_tips()

    expected = flyarchive.positions(url, "*", points=points, model=world.model).values
    actual = flyarchive.positions(url, "*", points=points, model=world.model,
                                  backend=WARP_BACKEND).values

    assert np.abs(actual - expected).max() < TOLERANCE

"""Same pictures on both MuJoCo lines: an archive recorded under one release (3.16 or
4.0.1) replays under the other with frames that differ in at most 2 % of pixels (by more
than 8 levels) and body positions within 1e-9 model units (mm for NeuroMechFly), in both
directions, and its model's identity is the same on both (issue 32, items 1 and 4).

The other release runs in the other environment (``bash scripts/dev.sh test`` makes
both and names its interpreter in ``FLYARCHIVE_TEST_OTHER_PYTHON``), through
:mod:`flyarchive.testing.across_releases`. Replay uses the archive's own model
(:func:`~flyarchive.testing.across_releases.replay_model_path`): on the release that did not record
it, the portable form kept beside the MJB. The models: the tiny test model (simulated where
it is recorded) and NeuroMechFly exported with its meshes (where flygym is: a walk recorded
as states).
"""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from flyarchive.testing import TINY_XML
from flyarchive.testing.markers import OTHER_PYTHON, requires_flygym, requires_other_mujoco
from flyarchive.testing.across_releases import (
    compare,
    export_neuromechfly,
    load_replay,
    record,
    record_step,
    replay,
    replay_model_path,
    replay_step,
    run_in,
    walk_states,
)

pytestmark = [requires_other_mujoco, pytest.mark.subprocess, pytest.mark.timeout(600)]

#: At most this fraction of pixels may differ (by more than 8 levels) between releases.
MAX_PIXELS = 0.02
#: Body positions may differ by at most this much between releases (model units).
MAX_POSITION = 1e-9
TINY = ("front", (96, 128))
NMF = ("nmf/trackcam", (96, 128))


@pytest.fixture(scope="module")
def other() -> str:
    """The other environment's interpreter."""
    assert OTHER_PYTHON, ("CI runs the cross-release tests: FLYARCHIVE_TEST_OTHER_PYTHON is "
                          "not set (bash scripts/dev.sh test makes both environments)")
    return OTHER_PYTHON


def line(version: str) -> str:
    return version.split(".")[0]


def assert_same_pictures(here, there) -> None:
    """Two replays of one archive by different MuJoCo lines match within the bounds."""
    assert line(here.mujoco) == line(mujoco.__version__) and line(there.mujoco) != line(here.mujoco)
    assert here.recorded == there.recorded and here.identity == there.identity
    assert here.frames.shape == there.frames.shape and here.frames.std() > 10  # they show something
    gaps = compare(here, there)
    assert gaps["pixels"] <= MAX_PIXELS, gaps
    assert gaps["positions"] <= MAX_POSITION, gaps
    for seen in (here, there):  # MuJoCo 4's "auto" headlight, on for a 3.x archive
        if (line(seen.recorded), line(seen.mujoco)) == ("3", "4"):
            assert seen.headlight == 1


def replays_across(other, xml, view, tmp_path, *, states=None):
    """One archive recorded here and one there, each replayed here and there (one child):
    ``[(here, there)]`` for each archive, this release's first."""
    camera, size = view
    mine, theirs = str(tmp_path / "here.zarr"), str(tmp_path / "there.zarr")
    model = replay_model_path(xml)
    record(xml, mine, states=states)
    run_in(other, [record_step(xml, theirs, states=states),
                   *(replay_step(url, camera, size, tmp_path / f"{name}.npz", model=model)
                     for name, url in (("mine", mine), ("theirs", theirs)))])
    return [(replay(url, camera, size, model=model), load_replay(tmp_path / f"{name}.npz"))
            for name, url in (("mine", mine), ("theirs", theirs))]


def test_archives_of_the_tiny_model_replay_the_same_on_both_releases_either_way(other, tmp_path):
    xml = tmp_path / "tiny.xml"
    xml.write_text(TINY_XML)

    (mine, mine_there), (theirs_here, theirs) = replays_across(other, xml, TINY, tmp_path)

    assert mine.recorded == mujoco.__version__ and line(theirs.recorded) != line(mine.recorded)
    assert mine.identity == theirs.identity  # one model, whichever release recorded it
    assert_same_pictures(mine, mine_there)
    assert_same_pictures(theirs_here, theirs)


@requires_flygym
def test_neuromechfly_walks_replay_the_same_on_both_releases_either_way(other, tmp_path):
    xml, world = export_neuromechfly(tmp_path / "nmf")
    states = tmp_path / "walk.npy"
    np.save(states, walk_states(world, 0.04))

    (mine, mine_there), (theirs_here, theirs) = replays_across(other, xml, NMF, tmp_path,
                                                               states=str(states))

    assert line(theirs.recorded) != line(mine.recorded) and mine.identity == theirs.identity
    assert mine.positions.shape[2] == world.model.nbody - 1  # every body of the fly
    assert_same_pictures(mine, mine_there)
    assert_same_pictures(theirs_here, theirs)

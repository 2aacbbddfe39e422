"""Steps of NeuroMechFly's recorded walk (the demo's: flygym's Spotlight clip replayed by
position actuators, :mod:`flyarchive.interop.nmf`; its qpos replayed by kinematics), over
the whole 2 s walk, at 125 and 62.5 frames/s against the same walk at 1000 frames/s, with
and without noise on every joint angle.

At 1000 frames/s every swing spans ten frames or more; at the lower rates a swing is one
to five frames. The steps found there are the 1000 frames/s steps: none invented, none
missed that lasts over three frames of the lower rate (shorter ones, dragged hind legs
and 10 ms shuffles, go missing at 62.5 frames/s: up to 4 of a leg's 18), most lift-offs
within two frames. (Against
each leg's joint rhythm, the spectral peak of its joint angles, this walk's legs step
2-27 % less often: the recorded clip's legs pause and make cycles too small to lift or
move the tarsus; with adhesion off the same steps are found. The README says more.)
"""

from __future__ import annotations

import numpy as np
import pytest

import flyarchive
from flyarchive.testing.fixtures import write_states
from flyarchive.testing.markers import requires_flygym

pytestmark = requires_flygym

LEGS = ("lf", "lm", "lh", "rf", "rm", "rh")
FPS = 1000.0


def walk_positions(url: str):
    return flyarchive.positions(url, "nmf/c_thorax", points=flyarchive.tarsus_tips()).load()


@pytest.fixture(scope="module")
def walk(tmp_path_factory):
    """The demo's walk of world 0, 2 s at 1000 frames/s: its archive, positions and model."""
    from flyarchive.interop import nmf

    world = nmf.build_world()
    qpos = nmf.walk_qpos(2000, output_fps=FPS * 0.2, playback_speed=0.2, world=world)
    url = str(tmp_path_factory.mktemp("walk") / "walk.zarr")
    write_states(url, world.model, qpos[None], chunk_frames=250, fps=FPS)
    return url, walk_positions(url), world.model


@pytest.fixture(scope="module")
def noisy_walk(walk, tmp_path_factory):
    """The same walk with Gaussian noise of 0.01 rad (0.6 degrees) on every hinge angle."""
    url, _, model = walk
    qpos = flyarchive.open_archive(url).qpos.values.copy()
    qpos[..., 7:] += np.random.default_rng(0).normal(0.0, 0.01, qpos[..., 7:].shape)
    noisy = str(tmp_path_factory.mktemp("noisy") / "walk.zarr")
    write_states(noisy, model, qpos, chunk_frames=250, fps=FPS)
    return noisy, walk_positions(noisy), model


def overlaps(starts, stops, other_starts, other_stops) -> np.ndarray:
    """Whether each interval overlaps one of the others."""
    return np.array([bool(np.any((other_starts < b) & (other_stops > a)))
                     for a, b in zip(starts, stops)], dtype=bool)


@pytest.mark.parametrize("every", [8, 16], ids=["125fps", "62.5fps"])
@pytest.mark.parametrize("which", ["walk", "noisy_walk"])
def test_the_whole_walk_steps_as_at_a_high_frame_rate(request, which, every):
    _, positions, _ = request.getfixturevalue(which)
    interval = every / FPS

    fine = flyarchive.gait_steps(positions)
    swings = flyarchive.gait_epochs(positions)
    coarse = flyarchive.gait_steps(positions.isel(time=slice(None, None, every)))

    swings = swings[swings.phase == "swing"]
    for leg in LEGS:
        got, truth = coarse[coarse.leg == leg], fine[fine.leg == leg]
        mine = swings[swings.leg == leg]
        invented = ~overlaps(got.liftoff_time.values, got.touchdown_time.values,
                             mine.start_time.values, mine.stop_time.values)
        found = overlaps(truth.liftoff_time.values, truth.touchdown_time.values,
                         got.liftoff_time.values, got.touchdown_time.values)
        resolved = truth.swing_duration.values > 3 * interval
        assert not invented.any(), (leg, got.liftoff_time.values[invented])
        assert found[resolved].all(), (leg, truth.liftoff_time.values[resolved & ~found])
        nearest = np.abs(got.liftoff_time.values[:, None] - truth.liftoff_time.values).min(1)
        assert np.median(nearest) < interval, (leg, nearest)
        assert (nearest < 2 * interval).mean() >= 0.9, (leg, nearest)
    assert len(coarse) >= 0.85 * len(fine)

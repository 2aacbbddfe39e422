"""Step frequencies of NeuroMechFly's recorded walk (the demo's: flygym's Spotlight clip
replayed by position actuators, :mod:`flyarchive.interop.nmf`) against each leg's rhythm,
the spectral peak of its joint angles, at 125 and 62.5 frames/s, with and without noise on
every joint angle.

The comparison runs over 0.65-1.5 s of the 2 s walk, where the fly walks steadily. Before
and after that stretch it stumbles (the thorax moves back by 0.3 mm, and the clip loops at
~1.1 s): the middle and hind legs' tarsi (adhesion stays on) stand for up to 0.25 s while
their joints go on cycling, so over the whole walk a leg steps 4-35 % less often than its
joints swing; a spectral peak then says where the joints' power is, not how often the
tip lifted. The whole walk's numbers are in the report of issue 34.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.signal

import flyarchive
from flyarchive.testing.fixtures import write_states
from flyarchive.testing.markers import requires_flygym

pytestmark = requires_flygym

LEGS = ("lf", "lm", "lh", "rf", "rm", "rh")
STEADY = (0.65, 1.5)  # s


@pytest.fixture(scope="module")
def walk(tmp_path_factory):
    """The demo's walk of world 0, 2 s at 125 frames/s: its archive, thorax and tips."""
    from flyarchive.interop import nmf

    world = nmf.build_world()
    url = str(tmp_path_factory.mktemp("walk") / "walk.zarr")
    write_states(url, world.model, nmf.walk_qpos(250, world=world)[None], chunk_frames=50)
    positions = flyarchive.positions(url, "nmf/c_thorax", points=flyarchive.tarsus_tips()).load()
    return url, positions, world.model


def rhythm(qpos: np.ndarray, fps: float) -> float:
    """The spectral peak (5-25 Hz) of a leg's joint angles ``(T, dofs)``: the peak of the
    sum of each angle's power spectrum, each scaled to its own peak (Hann window, padded
    64-fold)."""
    x = scipy.signal.detrend(qpos, axis=0) * np.hanning(len(qpos))[:, None]
    n = 64 * len(x)
    power = np.abs(np.fft.rfft(x, n, axis=0)) ** 2
    power /= power.max(axis=0)
    freq = np.fft.rfftfreq(n, 1 / fps)
    band = (freq > 5) & (freq < 25)
    return float(freq[band][np.argmax(power.sum(axis=1)[band])])


@pytest.fixture(scope="module")
def noisy_walk(walk, tmp_path_factory):
    """The same walk with Gaussian noise of 0.01 rad (0.6 degrees) on every hinge angle."""
    url, _, model = walk
    qpos = flyarchive.open_archive(url).qpos.values.copy()
    qpos[..., 7:] += np.random.default_rng(0).normal(0.0, 0.01, qpos[..., 7:].shape)
    noisy = str(tmp_path_factory.mktemp("noisy") / "walk.zarr")
    write_states(noisy, model, qpos, chunk_frames=50)
    positions = flyarchive.positions(noisy, "nmf/c_thorax", points=flyarchive.tarsus_tips()).load()
    return url, positions, model


@pytest.mark.parametrize("every", [1, 2], ids=["125fps", "62.5fps"])
@pytest.mark.parametrize("which", ["walk", "noisy_walk"])
def test_each_leg_steps_at_its_joints_rhythm(request, which, every):
    url, positions, _ = request.getfixturevalue(which)
    fps = 125 / every
    qpos = flyarchive.open_archive(url).qpos.isel(world=0, time=slice(None, None, every))
    steady = qpos.sel(time=slice(*STEADY))  # the noiseless joints' rhythm

    got = flyarchive.gait_summary(positions.isel(time=slice(None, None, every)), time=STEADY)

    for leg in LEGS:
        expected = rhythm(flyarchive.select_dofs(steady, leg=leg).values, fps)
        assert got[f"step_frequency_{leg}"].item() == pytest.approx(expected, rel=0.10), leg
    assert 0.0 < got.tcs.item() <= 1.0

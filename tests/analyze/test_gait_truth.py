"""The gait measures recover a synthetic walker's known gait (flyarchive.testing.walker),
noise added, at frame rates from 60 to 1000 frames/s, from its tips' heights and speeds and
from their x and y alone (2-D tracking)."""

from __future__ import annotations

import numpy as np
import pytest

import flyarchive
from flyarchive.analyze.gait import TRIPODS, GaitParams, gait_measures
from flyarchive.analyze.steps import stance_runs, step_events
from flyarchive.testing.walker import TRIPOD, walker_positions

LEGS = ("lf", "lm", "lh", "rf", "rm", "rh")
#: The walker's tips stand 0.02 mm high and lift 0.6 mm: its stance band ends at 0.05 mm.
WALKER = GaitParams(stance_height=0.05)
NOISE = 0.005  # mm, on every coordinate


def true_tcs() -> float:
    """Wosnitza's t2 / t1 of the walker's tripods, from its phases."""
    swing = 1 - TRIPOD.duty
    strengths = []
    for tripod in TRIPODS:
        lift = [TRIPOD.phases[LEGS.index(leg)] for leg in tripod]
        together = swing - (max(lift) - min(lift))
        strengths.append(together / (swing + max(lift) - min(lift)))
    return float(np.mean(strengths))


def true_support() -> dict[str, float]:
    """Shares of the walker's support patterns, from its stance on a fine time grid."""
    fine = walker_positions(20000, 1 / TRIPOD.frequency)
    down = (fine.sel(keypoint=[f"nmf/{leg}_tip" for leg in LEGS], xyz="z").values[0] <= 0.02)
    count = down.sum(axis=1)
    tripods = [np.array([leg in t for leg in LEGS]) for t in TRIPODS]
    tripod = (count == 3) & np.any([np.all(down == t, axis=1) for t in tripods], axis=0)
    return {"tripod": tripod.mean(), "wave": (count == 5).mean()}


@pytest.mark.parametrize("fps", [60, 125, 250, 500, 1000])
def test_a_known_gait_is_recovered_within_two_percent_at_every_frame_rate(fps):
    positions = walker_positions(fps, 10.0, noise=NOISE, seed=fps)

    got = flyarchive.gait_summary(positions, params=WALKER)

    expected_phase = (np.asarray(TRIPOD.phases) - TRIPOD.phases[0]) % 1
    for leg, phase in zip(LEGS, expected_phase):
        assert got[f"step_frequency_{leg}"].item() == pytest.approx(TRIPOD.frequency, rel=0.02)
        assert got[f"duty_factor_{leg}"].item() == pytest.approx(TRIPOD.duty, rel=0.02), leg
        off = (got[f"phase_{leg}"].item() - phase + 0.5) % 1 - 0.5
        assert abs(off) < 0.02, (leg, off)  # 2 % of a cycle
        assert got[f"phase_concentration_{leg}"].item() > 0.9  # events jitter by up to a frame
        assert got[f"step_length_{leg}"].item() == pytest.approx(TRIPOD.step_length, rel=0.02)
    assert got.tcs.item() == pytest.approx(true_tcs(), abs=0.03)
    walked = (got.distance / got.duration).item()  # (noise lengthens path_length)
    assert walked == pytest.approx(TRIPOD.step_length * TRIPOD.frequency, rel=0.02)


@pytest.mark.parametrize("fps", [60, 250, 1000])
def test_lift_offs_and_touchdowns_are_where_the_tip_leaves_and_reaches_the_ground(fps):
    positions = walker_positions(fps, 10.0, noise=NOISE, seed=fps)

    steps = flyarchive.gait_steps(positions, params=WALKER)

    early, late = [], []
    for leg, phase in zip(LEGS, TRIPOD.phases):
        mine = steps[steps.leg == leg]
        cycle = np.round(mine.liftoff_time.values * TRIPOD.frequency - phase)
        early += list(mine.liftoff_time.values - (cycle + phase) / TRIPOD.frequency)
        late += list(mine.touchdown_time.values - (cycle + phase + 1 - TRIPOD.duty)
                     / TRIPOD.frequency)
    # On average within 0.3 ms (the band's edge, 0.03 mm above the standing tip, would put
    # them 0.65 ms inside the swing); each within about half a frame, but where noise
    # lifts a standing frame over the margin (under 1 % of events).
    assert abs(np.mean(early)) < 3e-4
    assert abs(np.mean(late)) < 3e-4
    assert np.percentile(np.abs([*early, *late]), 99) * fps < 0.6


def test_the_support_pattern_shares_of_a_tripod_walker():
    got = flyarchive.gait_summary(walker_positions(1000, 5.0, noise=NOISE), params=WALKER)

    expected = true_support()
    assert got.support_tripod.item() == pytest.approx(expected["tripod"], abs=0.03)
    assert got.support_wave.item() == pytest.approx(expected["wave"], abs=0.03)
    shares = [got[f"support_{k}"].item() for k in ("tripod", "tetrapod", "wave", "other")]
    assert sum(shares) == pytest.approx(1.0)


@pytest.mark.parametrize("fps", [60, 125, 1000])
@pytest.mark.parametrize("height", [True, False])
def test_shares_of_time_in_stance_agree_with_the_events_at_low_frame_rates(fps, height):
    values = walker_positions(fps, 10.0, noise=NOISE, seed=fps).values
    times = np.arange(values.shape[1]) / fps
    if not height:
        values = values.copy()
        values[..., 2] = 0.0

    got = gait_measures(times, values[:, :, 0], values[:, :, 1:], params=WALKER, height=height)

    expected = true_support()
    # (the band alone: 0.40 tripod and stance fractions 0.74 from x and y at 60 frames/s)
    assert got["support_tripod"][0] == pytest.approx(expected["tripod"], abs=0.04)
    assert got["support_wave"][0] == pytest.approx(expected["wave"], abs=0.04)
    assert got["stance_fraction"][0] == pytest.approx(got["duty_factor"][0], abs=0.03)
    assert got["stance_fraction"][0] == pytest.approx([TRIPOD.duty] * 6, abs=0.03)


def test_the_step_table_holds_every_step_with_its_timing():
    positions = walker_positions(250, 3.0, noise=NOISE)

    steps = flyarchive.gait_steps(positions, params=WALKER)

    cycle = 1 / TRIPOD.frequency
    lm = steps[steps.leg == "lm"]  # in stance at the start
    assert list(steps.columns) == list(flyarchive.analyze.gait.STEP_COLUMNS)
    assert lm.step.tolist() == list(range(len(lm)))
    assert len(lm) == pytest.approx(3.0 * TRIPOD.frequency, abs=1)
    assert np.diff(lm.liftoff_time.values) == pytest.approx(cycle, abs=0.005)
    assert lm.swing_duration.values == pytest.approx((1 - TRIPOD.duty) * cycle, abs=0.005)
    assert np.isnan(lm.stance_duration.values[0])  # the stance before began with the recording
    assert lm.stance_duration.values[1:] == pytest.approx(TRIPOD.duty * cycle, abs=0.005)
    assert lm.step_length.values == pytest.approx(TRIPOD.step_length, abs=0.03)
    assert steps.attrs["units"]["swing_duration"] == "s"
    assert set(steps.individual) == {"world0"}


def test_the_epochs_tile_each_leg_s_time_with_stance_and_swing():
    positions = walker_positions(250, 2.0, noise=NOISE)

    epochs = flyarchive.gait_epochs(positions, params=WALKER)

    lf = epochs[epochs.leg == "lf"]
    assert lf.start_time.values[0] == positions.time.values[0]
    assert lf.stop_time.values[-1] == positions.time.values[-1]
    assert np.array_equal(lf.start_time.values[1:], lf.stop_time.values[:-1])
    assert (lf.phase.values[1:] != lf.phase.values[:-1]).all()
    assert lf.complete.tolist() == [False] + [True] * (len(lf) - 2) + [False]
    stance = lf[(lf.phase == "stance") & lf.complete]
    assert stance.duration.values == pytest.approx(TRIPOD.duty / TRIPOD.frequency, abs=0.005)


def planar_measures(fps: float, *, noise: float = NOISE, seconds: float = 10.0) -> dict:
    """The walker's measures from its x and y alone (a camera above: no heights)."""
    values = walker_positions(fps, seconds, noise=noise, seed=fps).values
    times = np.arange(values.shape[1]) / fps
    return gait_measures(times, values[:, :, 0], values[:, :, 1:], params=WALKER, height=False)


@pytest.mark.parametrize("fps", [60, 125, 250, 500, 1000])
def test_without_heights_a_known_gait_is_recovered_within_two_percent(fps):
    got = planar_measures(fps)

    expected_phase = (np.asarray(TRIPOD.phases) - TRIPOD.phases[0]) % 1
    assert got["step_frequency"][0] == pytest.approx([TRIPOD.frequency] * 6, rel=0.02)
    # (the tip's speed rises from rest: events at a speed threshold gave +5 % to +25 %)
    assert got["duty_factor"][0] == pytest.approx([TRIPOD.duty] * 6, rel=0.02)
    off = (got["phase"][0] - expected_phase + 0.5) % 1 - 0.5
    assert np.abs(off).max() < 0.02
    assert got["step_length"][0] == pytest.approx([TRIPOD.step_length] * 6, rel=0.02)


@pytest.mark.parametrize("fps", [60, 250, 1000])
def test_without_heights_events_are_where_the_tip_sets_off_and_comes_to_rest(fps):
    values = walker_positions(fps, 10.0, noise=NOISE, seed=fps).values
    tips = np.ascontiguousarray(values[0, :, 1:].transpose(1, 0, 2))
    times = np.arange(values.shape[1]) / fps

    events = step_events(times, stance_runs(times, tips, WALKER, height=False), tips, WALKER,
                         height=False)

    phase = np.asarray(TRIPOD.phases)[events.tip]
    cycle = np.round(events.liftoff * TRIPOD.frequency - phase)
    early = events.liftoff - (cycle + phase) / TRIPOD.frequency
    late = events.touchdown - (cycle + phase + 1 - TRIPOD.duty) / TRIPOD.frequency
    assert len(events) == pytest.approx(6 * 10.0 * TRIPOD.frequency, abs=6)
    assert abs(np.mean(early)) < 5e-4 and abs(np.mean(late)) < 5e-4
    assert np.percentile(np.abs([*early, *late]), 99) * fps < 0.5


@pytest.mark.parametrize("fps", [250, 1000])
def test_without_heights_noisy_tracking_makes_no_steps(fps):
    got = planar_measures(fps, noise=0.02)  # 20 µm on every coordinate: a tracker's pixel

    assert got["step_frequency"][0] == pytest.approx([TRIPOD.frequency] * 6, rel=0.02)
    assert got["duty_factor"][0] == pytest.approx([TRIPOD.duty] * 6, rel=0.03)

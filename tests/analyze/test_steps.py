"""Stance, swing and their events from tip trajectories: hysteresis, minimum durations,
gaps, and real and simulated flies through the same functions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import flyarchive
import flyarchive.errors
from flyarchive.analyze.gait import GaitParams, gait_measures
from flyarchive.analyze.steps import STANCE, SWING, UNKNOWN, stance_state, step_events
from flyarchive.testing.markers import requires_movement
from flyarchive.testing.walker import TRACKED, walker_poses, walker_positions

TRACKED_NAME = {leg: name for name, leg in TRACKED.items()}

FPS = 200
DT = 1 / FPS


def cycles(n: int, *, stance: int = 12, swing: int = 8, lift: float = 0.5,
           chatter: float = 0.0, seed: int = 0) -> np.ndarray:
    """``(1, T, 3)``: a tip standing ``stance`` frames, then swinging ``swing`` frames 1 mm
    forward, ``n`` times; ``chatter``: the height in stance flickers around the stance
    band's edge (every other frame at that height), as a noisy tracker would give it."""
    rows = []
    for c in range(n):
        rows += [[float(c), 0.0, 0.0]] * stance
        u = (np.arange(swing) + 0.5) / swing
        rows += [[c + float(v), 0.0, lift * np.sin(np.pi * v)] for v in u]
    tip = np.array(rows)[None]
    if chatter:
        standing = tip[0, :, 2] == 0
        flicker = standing & (np.arange(tip.shape[1]) % 2 == 1)
        tip[0, flicker, 2] = chatter
    return tip


def times(tip: np.ndarray) -> np.ndarray:
    return np.arange(tip.shape[1]) * DT


def test_a_regular_pattern_gives_one_swing_per_cycle():
    tip = cycles(5)

    state = stance_state(times(tip), tip, GaitParams())
    events = step_events(times(tip), state, tip, GaitParams())

    assert len(events) == 5 - 1  # the last swing ends with the recording
    assert events.swing_duration == pytest.approx(8 * DT, abs=1e-4)
    assert events.step_length == pytest.approx(1.0)


def test_height_flicker_at_the_band_s_edge_does_not_make_steps():
    calm, noisy = cycles(5), cycles(5, chatter=0.12)  # above stance_height, below swing_height

    got = [step_events(times(t), stance_state(times(t), t, GaitParams()), t, GaitParams())
           for t in (calm, noisy)]

    assert len(got[1]) == len(got[0])
    assert got[1].liftoff == pytest.approx(got[0].liftoff, abs=1.01 * DT)  # a frame at most
    assert got[1].touchdown == pytest.approx(got[0].touchdown)


def test_without_hysteresis_the_same_flicker_would_count_as_steps():
    noisy = cycles(5, chatter=0.12)
    params = GaitParams(swing_height=0.1, min_swing=0.0, min_stance=0.0)  # at the band's edge

    events = step_events(times(noisy), stance_state(times(noisy), noisy, params), noisy, params)

    assert len(events) > 10


def test_swings_and_stances_shorter_than_the_minimum_join_their_neighbours():
    tip = cycles(4, swing=8)
    tip[0, 5, 2] = 0.3  # a one-frame hop in the first stance: 5 ms of swing
    params = GaitParams()

    short = GaitParams(min_swing=0.0)
    kept = step_events(times(tip), stance_state(times(tip), tip, short), tip, short)
    joined = step_events(times(tip), stance_state(times(tip), tip, params), tip, params)

    assert len(kept) == len(joined) + 1
    assert params.min_swing > DT


def test_no_step_is_made_up_across_a_gap():
    tip = cycles(6)  # stances at frames 0-11, 20-31...; swings at 12-19, 32-39...
    gap = slice(44, 66)  # tracking lost from inside a stance to inside the next one
    tip[0, gap] = np.nan

    state = stance_state(times(tip), tip, GaitParams())
    events = step_events(times(tip), state, tip, GaitParams())

    whole = step_events(times(cycles(6)), stance_state(times(tip), cycles(6), GaitParams()),
                        cycles(6), GaitParams())
    assert (state[0, gap] == UNKNOWN).all()
    assert len(events) == len(whole) - 1  # the swing in the gap
    assert not ((events.liftoff < 66 * DT) & (events.touchdown > 44 * DT)).any()
    after = events.liftoff > 66 * DT
    assert np.isnan(events.stance_start[after][0])  # its stance began at the gap
    assert np.isfinite(events.stance_start[after][1:]).all()


@pytest.mark.parametrize("height", [True, False], ids=["3-D", "2-D"])
def test_after_a_gap_at_a_high_frame_rate_the_steps_go_on(height):
    values = walker_positions(1000, 2.0, noise=0.005).values  # smoothed over 7 frames
    tips = np.ascontiguousarray(values[0, :, 1:].transpose(1, 0, 2))
    tips[:, 500:520] = np.nan  # 20 ms of tracking lost
    at = np.arange(tips.shape[1]) / 1000
    params = GaitParams(stance_height=0.05)

    state = stance_state(at, tips, params, height=height)
    events = step_events(at, state, tips, params, height=height)

    assert (state[:, 500:520] == UNKNOWN).all()
    assert (state[:, 530:] != UNKNOWN).all()  # a gap's NaN stays in its own windows
    after = events.liftoff > 0.52
    assert after.sum() == pytest.approx(6 * 1.48 * 9.3, abs=6)
    assert not ((events.liftoff < 0.52) & (events.touchdown > 0.5)).any()


def test_a_tip_that_barely_rises_off_its_stance_lifts_off_between_its_frames():
    """At 100 frames/s a dragging tip's first frame off stood just over the stance height:
    its rise, taken as its speed, put lift-offs 0.5 s early (stances of -0.38 s)."""
    dt, stance, swing = 0.01, 12, 8
    rows = []
    for c in range(6):  # stands 12 frames, then swings 3 mm: first dragging, then lifting
        rows += [[3.0 * c, 0.0, 0.0]] * stance
        u = (np.arange(swing) + 0.5) / swing
        rows += [[3.0 * (c + v), 0.0, 0.00101 if k == 0 else 0.05 * np.sin(np.pi * v)]
                 for k, v in enumerate(u)]
    tip = np.array(rows)[None]
    at = np.arange(tip.shape[1]) * dt

    events = step_events(at, stance_state(at, tip, GaitParams()), tip, GaitParams())

    last_standing = (np.arange(1, 6) * (stance + swing) - swing - 1) * dt
    assert len(events) == 5
    assert ((events.liftoff >= last_standing - 1e-9) & (events.liftoff <= last_standing + dt)).all()
    assert (events.stance_duration[1:] > 0).all() and (events.swing_duration > 0).all()


def test_frames_not_recorded_are_a_gap_as_frames_lost_are():
    """A recording that skipped frames (its times jump) made a step up across them."""
    tip = cycles(6)
    lost = tip.copy()
    lost[0, 44:66] = np.nan  # from inside a stance to inside the next one
    kept = np.r_[0:44, 66:tip.shape[1]]
    skipped, skipped_times = tip[:, kept], times(tip)[kept]  # the frames never recorded

    got = gait_measures(skipped_times, np.zeros_like(skipped), skipped[:, :, None])
    want = gait_measures(times(tip), np.zeros_like(lost), lost[:, :, None])

    assert got["step_frequency"] == pytest.approx(want["step_frequency"])
    assert got["stance_duration"] == pytest.approx(want["stance_duration"])
    assert got["duty_factor"] == pytest.approx(want["duty_factor"])


def test_a_state_is_stance_swing_or_unknown():
    tip = cycles(3)
    tip[0, 0] = np.nan

    state = stance_state(times(tip), tip, GaitParams())

    assert set(np.unique(state)) == {STANCE, SWING, UNKNOWN}


def test_measures_per_window_count_the_cycles_that_start_in_them():
    positions = walker_positions(500, 4.0)

    got = flyarchive.gait_summary(positions, params=GaitParams(stance_height=0.05), window=1.0)

    assert got.window.values.tolist() == pytest.approx([0.0, 1.0, 2.0, 3.0])
    assert got.step_frequency_lf.values[:, 0] == pytest.approx([9.3] * 4, rel=0.02)
    assert got.step_frequency_lf.dims == ("window", "world")


@requires_movement
@pytest.mark.slow  # movement imports for seconds
def test_a_tracked_fly_and_a_simulated_one_in_one_step_table():
    import pandas as pd

    legs = {leg: name for name, leg in TRACKED.items() if name != "thorax"}
    poses = walker_poses(200, 2.0, individuals=2, noise=0.005)  # x, y only, like a camera above
    params = GaitParams(stance_height=0.05)

    real = flyarchive.gait_steps(poses, thorax="thorax", legs=legs, params=params)
    simulated = flyarchive.gait_steps(walker_positions(200, 2.0, noise=0.005), params=params)
    both = pd.concat([real, simulated], ignore_index=True)

    assert set(both.individual) == {"fly0", "fly1", "world0"}
    assert set(both.leg) == {"lf", "lm", "lh", "rf", "rm", "rh"}
    cycle = both.groupby("individual").liftoff_time.apply(lambda t: np.median(np.diff(t)))
    assert cycle.values == pytest.approx(1 / 9.3, abs=DT)  # (per leg, then across legs)
    steps = both.groupby(["individual", "leg"]).size()
    assert steps.min() >= steps.max() - 1


@requires_movement
@pytest.mark.slow  # movement imports for seconds
def test_two_d_poses_give_the_walker_s_gait_at_low_and_high_frame_rates():
    legs = {leg: name for name, leg in TRACKED.items() if name != "thorax"}
    params = GaitParams(stance_height=0.05)

    for fps in (60, 500):
        poses = walker_poses(fps, 5.0, noise=0.005, seed=fps)  # x, y only: no heights
        got = flyarchive.gait_summary(poses, thorax="thorax", legs=legs, params=params)
        steps = flyarchive.gait_steps(poses, thorax="thorax", legs=legs, params=params)

        for leg in legs:
            assert got[f"step_frequency_{leg}"].item() == pytest.approx(9.3, rel=0.02), fps
            assert got[f"duty_factor_{leg}"].item() == pytest.approx(0.62, rel=0.02), fps
        assert np.isnan(got.mean_height.item())
        assert steps.swing_duration.mean() == pytest.approx(0.38 / 9.3, rel=0.03), fps
        assert steps.step_length.median() == pytest.approx(1.0, rel=0.02), fps


@requires_movement
@pytest.mark.slow  # movement imports for seconds
def test_three_d_poses_give_the_measures_of_the_positions_they_were_made_of():
    legs = {leg: name for name, leg in TRACKED.items() if name != "thorax"}
    params = GaitParams(stance_height=0.05)

    from_poses = flyarchive.gait_summary(walker_poses(250, 2.0, dims=3), thorax="thorax",
                                         legs=legs, params=params)
    from_positions = flyarchive.gait_summary(walker_positions(250, 2.0), params=params)

    for name in ("step_frequency_lf", "duty_factor_rh", "phase_rm", "tcs", "mean_height",
                 "distance", "heading_change"):
        assert from_poses[name].item() == pytest.approx(from_positions[name].item()), name
    assert from_poses.individual.values.tolist() == ["fly0"]


@requires_movement
@pytest.mark.slow  # movement imports for seconds
def test_speed_and_path_agree_with_movement_kinematics():
    from movement.kinematics import compute_path_length, compute_speed

    poses = walker_poses(250, 2.0, dims=3, noise=0.005)
    legs = {leg: name for name, leg in TRACKED.items() if name != "thorax"}

    got = flyarchive.gait_summary(poses, thorax="thorax", legs=legs)

    thorax = poses.position.sel(keypoint="thorax", space=["x", "y"])
    path = compute_path_length(thorax).sel(individual="fly0").item()
    speed = compute_speed(thorax).sel(individual="fly0")
    assert got.path_length.item() == pytest.approx(path, rel=1e-9)
    assert got.mean_speed.item() == pytest.approx(path / float(poses.time[-1] - poses.time[0]))
    step = np.hypot(*np.diff(thorax.sel(individual="fly0").values, axis=0).T) * 250
    assert got.peak_speed.item() == pytest.approx(step.max())
    assert float(speed.mean()) == pytest.approx(got.mean_speed.item(), rel=0.02)


@requires_movement
@pytest.mark.slow  # movement imports for seconds
def test_poses_gait_takes_numpy_numbers_names_missing_worlds_and_keeps_the_length_unit():
    from flyarchive.errors import SelectionError

    legs = {leg: name for name, leg in TRACKED.items() if name != "thorax"}
    poses = walker_poses(200, 2.0, individuals=2)
    poses["position"].attrs["units"] = "pixels"
    params = GaitParams(stance_height=np.float32(0.05))

    got = flyarchive.gait_summary(poses, thorax="thorax", legs=legs, params=params,
                                  window=np.float64(1.0), worlds=[np.int64(1)])
    steps = flyarchive.gait_steps(poses, thorax="thorax", legs=legs, params=params)
    epochs = flyarchive.gait_epochs(poses, thorax="thorax", legs=legs, params=params)

    assert got.individual.values.tolist() == ["fly1"] and got.window.size == 2
    assert steps.attrs["units"]["step_length"] == "pixels"
    assert got.step_length_lf.attrs["units"] == "pixels"
    assert "mm" not in str(epochs.attrs["units"])
    for worlds in ([5], []):
        with pytest.raises(SelectionError, match=r"not in the poses dataset: its worlds are its "
                                                 r"individuals' indices 0\.\.1 \(fly0, fly1\)"):
            flyarchive.gait_summary(poses, thorax="thorax", legs=legs, worlds=worlds)


def _legs() -> dict[str, str]:
    return {leg: name for name, leg in TRACKED.items() if name != "thorax"}


def _tracked_walker(fps: float = 125, seconds: float = 2.0):
    return walker_poses(fps, seconds, dims=3, noise=0.005)


def _clean_and_lost(leg: str, lost: Callable[[np.ndarray, int], np.ndarray]) -> tuple[Any, Any]:
    """The tracked walker's measures, and the same with ``leg``'s tip unknown in the frames
    ``lost(times, cycle)`` selects of cycles 4, 8 and 12."""
    poses = _tracked_walker()
    clean = flyarchive.gait_summary(poses, thorax="thorax", legs=_legs(), length_unit="mm")
    tip = list(poses.keypoint.values).index(TRACKED_NAME[leg])
    for cycle in (4, 8, 12):
        poses["position"].values[lost(poses.time.values, cycle), :, tip, 0] = np.nan
    return clean, flyarchive.gait_summary(poses, thorax="thorax", legs=_legs(), length_unit="mm")


@requires_movement
@pytest.mark.slow  # movement imports for seconds
def test_a_frame_lost_in_a_reference_swing_leaves_the_phases_as_they_were():
    from flyarchive.testing.walker import TRIPOD

    def mid_swing(t: np.ndarray, cycle: int) -> np.ndarray:  # one frame in an lf swing
        return np.argmin(np.abs(t - (cycle + 0.3 * (1 - TRIPOD.duty)) / TRIPOD.frequency))

    clean, got = _clean_and_lost("lf", mid_swing)

    for leg in ("rf", "lh", "rh"):  # (a cycle of two: 0.65 and 0.62)
        assert got[f"phase_concentration_{leg}"].item() > 0.95
        off = (got[f"phase_{leg}"].item() - clean[f"phase_{leg}"].item() + 0.5) % 1 - 0.5
        assert abs(off) < 0.01


@requires_movement
@pytest.mark.slow  # movement imports for seconds
def test_a_swing_whose_tripod_partner_was_not_tracked_is_left_out_of_tcs():
    from flyarchive.testing.walker import TRIPOD

    def swing(t: np.ndarray, cycle: int) -> np.ndarray:  # rm's whole swing
        lift = (cycle + TRIPOD.phases[4]) / TRIPOD.frequency
        return (t > lift - 0.01) & (t < lift + 0.05)

    clean, got = _clean_and_lost("rm", swing)

    assert got.tcs.item() == pytest.approx(clean.tcs.item(), abs=0.01)  # (counted 0: 0.74)


@requires_movement
@pytest.mark.slow  # movement imports for seconds
def test_one_fly_of_a_dataset_and_a_filtered_position_array_are_poses_too():
    from movement.filtering import savgol_filter

    poses = walker_poses(100, 1.0, individuals=2, noise=0.005)
    both = flyarchive.gait_summary(poses, thorax="thorax", legs=_legs(), length_unit="mm")

    one = flyarchive.gait_summary(poses.sel(individual="fly1"), thorax="thorax", legs=_legs(),
                                  length_unit="mm")
    filtered = savgol_filter(poses.position, window=5)
    smooth = flyarchive.gait_steps(filtered, thorax="thorax", legs=_legs(), length_unit="mm")

    assert one.individual.values.tolist() == ["fly1"]
    assert one.step_frequency_lf.item() == both.step_frequency_lf.values[1]
    assert sorted(set(smooth.individual)) == ["fly0", "fly1"] and len(smooth) > 20
    frames = poses.position.assign_coords(time=np.arange(poses.sizes["time"]))
    with pytest.raises(flyarchive.errors.SelectionError, match="time is in 'frames'"):
        flyarchive.gait_summary(frames, thorax="thorax", legs=_legs())


@requires_movement
@pytest.mark.slow  # movement imports for seconds
def test_a_keypoint_mapped_to_two_legs_is_refused():
    legs = {**_legs(), "rf": "L1_tip"}

    with pytest.raises(flyarchive.errors.SelectionError,
                       match="maps both 'lf' and 'rf' to the keypoint 'L1_tip'"):
        flyarchive.gait_summary(walker_poses(100, 1.0), thorax="thorax", legs=legs)


@requires_movement
@pytest.mark.slow  # movement imports for seconds
def test_default_thresholds_on_poses_not_said_to_be_in_mm_are_warned_of():
    poses = walker_poses(100, 1.0)

    with pytest.warns(UserWarning, match="these poses' length unit is pixels"):
        flyarchive.gait_summary(poses.assign(position=poses.position.assign_attrs(
            units="pixels")), thorax="thorax", legs=_legs())
    with pytest.warns(UserWarning, match="GaitParams' defaults, in mm"):
        flyarchive.gait_summary(poses, thorax="thorax", legs=_legs())
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flyarchive.gait_summary(poses, thorax="thorax", legs=_legs(), length_unit="mm")
        flyarchive.gait_summary(poses, thorax="thorax", legs=_legs(),
                                params=GaitParams(stance_height=0.2, swing_height=0.3))


@requires_movement
@pytest.mark.slow  # movement imports for seconds
def test_poses_that_say_no_unit_are_labelled_in_the_poses_unit():
    poses = walker_poses(100, 1.0)

    with pytest.warns(UserWarning, match="these poses' length unit is not given"):
        got = flyarchive.gait_summary(poses, thorax="thorax", legs=_legs())

    assert got.distance.attrs["units"] == "poses unit"
    assert got.mean_speed.attrs["units"] == "poses unit/s"

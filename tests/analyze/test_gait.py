"""Gait measures against trajectories whose answers are known, and their storage as world
variables that pick worlds."""

from __future__ import annotations

import math

import numpy as np
import pytest
import xarray as xr

import flyarchive
from flyarchive.analyze.gait import GaitParams
from flyarchive.errors import OptionsError, SelectionError

DT = 0.01
LABELS = ["nmf/c_thorax", "nmf/lf_tip"]


def positions(thorax, tips=None, *, quat=None):
    """Positions as flyarchive.positions gives them: thorax ``(W, T, 3)``, one tip
    ``(W, T, 3)`` (default: resting on the ground under the thorax), times ``k * DT``."""
    thorax = np.asarray(thorax, dtype=float)
    if tips is None:
        tips = thorax * [1, 1, 0]
    values = np.stack([thorax, np.asarray(tips, dtype=float)], axis=2)
    coords = {"world": np.arange(len(values)), "time": np.arange(values.shape[1]) * DT,
              "keypoint": LABELS, "xyz": ["x", "y", "z"]}
    pos = xr.DataArray(values, dims=("world", "time", "keypoint", "xyz"), coords=coords)
    if quat is None:
        return pos
    q = np.stack([np.asarray(quat)] * 2, axis=2)
    return xr.Dataset({"position": pos, "orientation": (("world", "time", "keypoint", "wxyz"), q)})


def summary(data, **kwargs):
    return flyarchive.gait_summary(data, thorax="nmf/c_thorax", tips=["nmf/lf_tip"], **kwargs)


def line(speed, angle, n=101, height=1.0):
    t = np.arange(n) * DT
    return np.stack([speed * t * math.cos(angle), speed * t * math.sin(angle),
                     np.full(n, height)], axis=-1)


def test_a_straight_walk_at_known_speed():
    got = summary(positions([line(10.0, math.radians(30))]))

    assert got.duration.item() == pytest.approx(1.0)
    assert got.distance.item() == pytest.approx(10.0)
    assert got.path_length.item() == pytest.approx(10.0)
    assert got.mean_speed.item() == pytest.approx(10.0)
    assert got.peak_speed.item() == pytest.approx(10.0)
    assert got.heading_change.item() == pytest.approx(0.0, abs=1e-12)
    assert got.distance.attrs["units"] == "mm"  # NeuroMechFly's tips: its millimetres


def test_lengths_are_in_the_unit_given_and_another_bodys_are_in_its_model_unit():
    pos = positions([line(10.0, 0.0)]).assign_coords(keypoint=["torso", "foot"])

    own = flyarchive.gait_summary(pos, thorax="torso", tips=["foot"])
    metres = flyarchive.gait_summary(pos, thorax="torso", tips=["foot"], length_unit="m")
    steps = flyarchive.gait_steps(pos, thorax="torso", tips=["foot"], length_unit="m")
    nmf = summary(positions([line(10.0, 0.0)]), length_unit="cm")

    assert own.distance.attrs["units"] == "model unit"
    assert own.mean_speed.attrs["units"] == "model unit/s"
    assert metres.distance.attrs["units"] == "m" and metres.peak_speed.attrs["units"] == "m/s"
    assert metres.step_length_foot.attrs["units"] == "m"
    assert steps.attrs["units"]["step_length"] == "m"
    assert nmf.distance.attrs["units"] == "cm"
    assert metres.distance.item() == own.distance.item() == pytest.approx(10.0)  # labels only
    for bad in ("", "  ", 3, "m\n"):
        with pytest.raises(OptionsError, match="length_unit must be the name"):
            flyarchive.gait_summary(pos, thorax="torso", tips=["foot"], length_unit=bad)


def test_a_full_circle_turns_two_pi_and_ends_where_it_began():
    n, radius = 201, 2.0
    angle = np.linspace(0, 2 * math.pi, n)
    thorax = np.stack([radius * np.cos(angle), radius * np.sin(angle), np.ones(n)], axis=-1)
    yaw = angle + math.pi / 2  # facing along the path, counter-clockwise
    quat = np.stack([np.cos(yaw / 2), 0 * yaw, 0 * yaw, np.sin(yaw / 2)], axis=-1)

    got = summary(positions([thorax], quat=[quat]))
    from_travel = summary(positions([thorax]))

    chords = n - 1
    assert got.heading_change.item() == pytest.approx(2 * math.pi)
    assert from_travel.heading_change.item() == pytest.approx(2 * math.pi * (chords - 1) / chords)
    assert got.distance.item() == pytest.approx(0.0, abs=1e-12)
    assert got.path_length.item() == pytest.approx(chords * 2 * radius * math.sin(math.pi / chords))


def test_height_and_time_below_the_fall_threshold():
    thorax = line(0.0, 0.0)
    thorax[60:, 2] = 0.2  # fell after 0.6 s

    got = summary(positions([thorax]), params=GaitParams(fall_height=0.5))

    assert got.time_below.item() == pytest.approx(41 * DT)
    assert got.min_height.item() == pytest.approx(0.2)
    assert got.mean_height.item() == pytest.approx((60 * 1.0 + 41 * 0.2) / 101)


def test_a_known_stance_and_swing_pattern():
    cycles, stance, swing, step = 10, 6, 4, 0.5
    tip = []
    for c in range(cycles):  # resting at x = c * step, then lifted and carried forward
        tip += [[c * step, 0.0, 0.0]] * stance
        tip += [[c * step, 0, 0.5], [(c + 0.5) * step, 0, 0.5], [(c + 1) * step, 0, 0.5],
                [(c + 1) * step, 0, 0.5]]
    n = cycles * (stance + swing)
    thorax = line(0.0, 0.0, n=n)

    got = summary(positions([thorax], [tip]))

    assert got.stance_fraction_lf.item() == pytest.approx(stance / (stance + swing))
    assert got.step_frequency_lf.item() == pytest.approx(1 / ((stance + swing) * DT))  # 10 Hz
    # (events lie midway between frames, less the time to rise the stance margin: 1e-5 s)
    assert got.duty_factor_lf.item() == pytest.approx(stance / (stance + swing), abs=1e-3)
    assert got.stance_fraction_lf.attrs["units"] == "1"


def test_frames_that_do_not_exist_do_not_count():
    walked, short = line(10.0, 0.0), line(10.0, 0.0)
    short[51:] = np.nan  # past this world's n_frames

    got = summary(positions([walked, short]))

    assert got.distance.values == pytest.approx([10.0, 5.0])
    assert got.duration.values == pytest.approx([1.0, 0.5])
    assert got.mean_speed.values == pytest.approx([10.0, 10.0])


def test_measures_per_window():
    got = summary(positions([line(10.0, 0.0)]), window=0.5)

    assert got.window.values.tolist() == pytest.approx([0.0, 0.5])
    # 50 frames (0.49 s), then 51: the last window holds the recording's last frame
    assert got.distance.values[:, 0] == pytest.approx([4.9, 5.0])
    whole = summary(positions([line(10.0, 0.0)]), window=1.0)
    assert (whole.duration.item(), whole.distance.item()) == pytest.approx((1.0, 10.0))


def test_saved_measures_pick_worlds_by_a_condition(sites_archive):
    from flyarchive.query.conditions import where_from_conditions

    tips = {"fly/lf_tip": ("fly/lf_tarsus5", "tip")}
    got = flyarchive.gait_summary(sites_archive, thorax="fly/c_thorax", tips=tips, save=True)
    ds = flyarchive.open_archive(sites_archive)
    median = float(np.median(got.path_length.values))

    picked = where_from_conditions(ds, [f"path_length>{median}"], [])

    assert np.array_equal(ds.path_length.values, got.path_length.values)
    assert picked.values.tolist() == (got.path_length.values > median).tolist()
    assert set(got.data_vars) == {name.replace("<leg>", "lf")
                                  for name in flyarchive.analyze.gait.MEASURES}


def test_saving_needs_the_archive_and_one_value_per_world(sites_archive):
    with pytest.raises(SelectionError, match="save=True"):
        summary(positions([line(1.0, 0.0)]), save=True)
    tips = {"fly/lf_tip": ("fly/lf_tarsus5", "tip")}
    with pytest.raises(SelectionError, match=r"measures of the whole recording, and time="):
        flyarchive.gait_summary(sites_archive, thorax="fly/c_thorax", tips=tips, save=True,
                                time=(0.0, 0.05))
    assert "distance" not in flyarchive.open_archive(sites_archive)


def test_saved_measures_are_stored_whole_a_lost_one_is_damage(sites_archive):
    import os

    from flyarchive.errors import CorruptArchiveError

    tips = {"fly/lf_tip": ("fly/lf_tarsus5", "tip")}
    flyarchive.gait_summary(sites_archive, thorax="fly/c_thorax", tips=tips, save=True,
                            processes=0)
    os.remove(os.path.join(sites_archive, "time_below", "c", "0"))  # zeros: a valid value

    with pytest.raises(CorruptArchiveError, match=r"world variable 'time_below' \[worlds 0\.\.2 "
                                                  r"\(file time_below/c/0\)\]"):
        flyarchive.open_archive(sites_archive).time_below.values
    assert any("'time_below'" in p for p in flyarchive.verify(sites_archive).problems)


def test_one_tip_given_for_two_legs_is_refused():
    """tips= (and --tip) of one point for two legs gave a leg its twin's numbers."""
    pos = positions([line(10.0, 0.0)])

    with pytest.raises(SelectionError, match=r"tips= maps both 'tip 0' and 'tip 1' to the "
                                             r"keypoint 'nmf/lf_tip'"):
        flyarchive.gait_summary(pos, thorax="nmf/c_thorax", tips=["nmf/lf_tip", "nmf/lf_tip"])
    with pytest.raises(SelectionError, match=r"tips= \(--tip\) maps both 'lf' and 'lm' to the "
                                             r"point \('nmf/lf_tarsus5', 'tip'\)"):
        flyarchive.gait_steps("unused.zarr", tips={"lf": ("nmf/lf_tarsus5", "tip"),
                                                   "lm": ("nmf/lf_tarsus5", "tip")})

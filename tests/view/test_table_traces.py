"""The world table's paging and sorting, its columns as scatter points and their units,
min/max-per-column traces and the dofs' units."""

from __future__ import annotations

import json

import numpy as np
import pytest

from flyarchive.errors import SelectionError
from flyarchive.view.table import column_units, query_table, scatter_points
from flyarchive.layout import dof_units
from flyarchive.view.traces import dof_choices, min_max_columns, pack

COLUMNS = {"world": np.arange(10, 20), "n_frames": np.full(10, 5),
           "distance": np.array([3.0, np.nan, 1, 5, 2, np.nan, 9, 0, 4, 8]),
           "genotype": np.array(list("bacabcabca"))}


def test_a_page_holds_its_rows_and_the_count_of_all_matches():
    answer = query_table(COLUMNS, where="distance >= 2", sort="distance", page=1, page_size=3)

    assert [row[0] for row in answer["rows"]] == [13, 19, 16]  # 2, 3, 4 | 5, 8, 9
    assert answer["matched"] == 6 and answer["pages"] == 2 and answer["total"] == 10
    assert answer["matched_worlds"] == [14, 10, 18, 13, 19, 16]


def test_descending_sort_keeps_nan_last_and_ties_in_world_order():
    answer = query_table(COLUMNS, sort="distance", descending=True)

    assert [row[0] for row in answer["rows"]] == [16, 19, 13, 18, 10, 14, 12, 17, 11, 15]
    assert answer["rows"][-1][2] is None  # NaN travels as null


def test_text_columns_sort_by_value():
    answer = query_table(COLUMNS, sort="genotype", descending=True)

    assert [row[3] for row in answer["rows"]] == list("cccbbbaaaa")
    assert answer["kinds"] == ["number", "number", "number", "text"]


def test_text_world_variables_as_an_archive_holds_them_sort_by_value():
    """An archive's text variable reads as numpy's StringDType: sorting by it answered 500."""
    stored = {**COLUMNS, "genotype": COLUMNS["genotype"].astype(np.dtypes.StringDType())}

    answer = query_table(stored, sort="genotype")

    assert [row[3] for row in answer["rows"]] == list("aaaabbbccc")


def test_a_page_past_the_end_is_the_last_page():
    answer = query_table(COLUMNS, page=99, page_size=4)

    assert answer["page"] == 2 and [row[0] for row in answer["rows"]] == [18, 19]


@pytest.mark.parametrize("options, fragment", [
    ({"sort": "speed"}, "No column 'speed' to sort by"),
    ({"page_size": 0}, "A page holds 1 to 500 rows"),
    ({"where": "distanse > 1"}, "Did you mean 'distance'?"),
])
def test_a_bad_table_request_is_refused(options, fragment):
    with pytest.raises(SelectionError, match=fragment):
        query_table(COLUMNS, **options)


def test_min_max_columns_keep_each_columns_extremes_in_time_order():
    rng = np.random.default_rng(0)
    values = rng.normal(size=(3, 1000))
    values[1, 300:420] = np.nan
    times = np.arange(1000) * 0.008

    t, v = min_max_columns(times, values, 100)

    assert t.shape == (200,) and v.shape == (3, 200)
    blocks = values.reshape(3, 100, 10)
    with np.errstate(invalid="ignore"), pytest.warns(RuntimeWarning):
        lo, hi = np.nanmin(blocks, axis=2), np.nanmax(blocks, axis=2)
    pairs = v.reshape(3, 100, 2)
    np.testing.assert_array_equal(np.fmin(pairs[..., 0], pairs[..., 1]), lo)
    np.testing.assert_array_equal(np.fmax(pairs[..., 0], pairs[..., 1]), hi)
    np.testing.assert_array_equal(t[::2], times[::10])  # each column's first frame
    assert np.isnan(pairs[1, 31]).all()  # frames 310-319: no data, no point


def test_short_traces_are_sent_as_they_are():
    values = np.arange(12.0).reshape(2, 6)

    t, v = min_max_columns(np.arange(6.0), values, 800)

    np.testing.assert_array_equal(v, values)
    np.testing.assert_array_equal(t, np.arange(6.0))


def test_dofs_are_chosen_by_label_or_by_flygym_names():
    labels = ["nmf/c_thorax-lf_coxa-yaw", "nmf/lf_tibia-lf_tarsus1-pitch",
              "nmf/rf_tibia-rf_tarsus1-pitch"]

    assert dof_choices(labels, dof=labels[0]) == [labels[0]]
    assert dof_choices(labels, joint="tarsus1") == labels[1:]
    assert dof_choices(labels, leg="rf", joint="tarsus1") == labels[2:]
    with pytest.raises(SelectionError, match="Did you mean 'nmf/lf_tibia-lf_tarsus1-pitch'"):
        dof_choices(labels, dof="nmf/lf_tibia-lf_tarsus-pitch")
    with pytest.raises(SelectionError, match="Choose a dof"):
        dof_choices(labels)


def test_packed_traces_hold_the_head_times_and_values_as_float64():
    times = np.array([0.0, 0.5, 1.0])
    values = np.array([[1.0, np.nan, 3.0], [4.0, 5.0, 6.0]])

    blob = pack({"labels": ["a"], "lines": [[0, "a"], [2, "a"]]}, times, values)

    size = int.from_bytes(blob[:4], "little")
    head = json.loads(blob[4:4 + size])
    offset = -(-(4 + size) // 8) * 8
    body = np.frombuffer(blob, "<f8", offset=offset)
    assert head == {"labels": ["a"], "lines": [[0, "a"], [2, "a"]], "points": 3}
    np.testing.assert_array_equal(body[:3], times)
    np.testing.assert_array_equal(body[3:].reshape(2, 3), values)  # NaN stays NaN


def test_scatter_points_are_the_filtered_worlds_with_both_values_finite():
    columns = {**COLUMNS, "success": np.array([True, False] * 5)}

    answer = scatter_points(columns, x="distance", y="success", where="world >= 12")

    assert answer["worlds"] == [12, 13, 14, 16, 17, 18, 19]  # 15 has no distance
    assert answer["xs"] == [1.0, 5.0, 2.0, 9.0, 0.0, 4.0, 8.0]
    assert answer["ys"] == [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0]  # true/false as 1/0
    assert answer["matched"] == 8 and answer["missing"] == 1


@pytest.mark.parametrize("x, y, fragment", [
    ("distnce", "world", "No world variable 'distnce' to plot on x. Did you mean 'distance'?"),
    ("world", "genotype", "'genotype' holds text; a scatter plots numbers"),
])
def test_a_scatter_of_a_missing_or_text_column_is_refused(x, y, fragment):
    with pytest.raises(SelectionError, match=fragment.replace("?", r"\?")):
        scatter_points(COLUMNS, x=x, y=y)


def test_columns_have_their_stored_units_and_an_old_gait_saves_measures_nmfs():
    from flyarchive.analyze.gait import MEASURES

    old_save = {name: {} for name in MEASURES if "<leg>" not in name}
    old_save.update({"step_frequency_lf": {}, "duty_factor_rh": {}, "phase_lm": {},
                     "success": {}, "frequency_lf": {}})
    stored = {"distance": {"units": "m"}, "step_frequency_lf": {"units": "Hz"}, "seed": {}}

    old = column_units(old_save)
    assert {k: old[k] for k in ("distance", "mean_speed", "step_frequency_lf", "duty_factor_rh",
                                "phase_lm")} == {"distance": "mm", "mean_speed": "mm/s",
                                                 "step_frequency_lf": "Hz",
                                                 "duty_factor_rh": "1", "phase_lm": "cycle"}
    assert "success" not in old and "frequency_lf" not in old
    assert column_units(stored) == {"distance": "m", "step_frequency_lf": "Hz"}
    assert column_units({"distance": {}, "success": {}}) == {}  # yours: no gait save


def test_each_dof_has_its_joints_unit():
    from flyarchive.layout import ModelLayout
    from flyarchive.testing import tiny_model

    attrs = ModelLayout.from_model(tiny_model()).to_attrs()
    units = dof_units(attrs)
    import mujoco

    fly = dof_units(ModelLayout.from_model(mujoco.MjModel.from_xml_string(
        "<mujoco><worldbody><body name='nmf/thorax'><joint name='nmf/root' type='free'/>"
        "<geom size='.1'/><body><joint name='nmf/slider' type='slide'/><joint "
        "name='nmf/shoulder'/><geom size='.1'/></body></body></worldbody></mujoco>"
    )).to_attrs())

    # another body's lengths are in its model's unit; NeuroMechFly's in mm
    assert units == {"root/x": "model unit", "root/y": "model unit", "root/z": "model unit",
                     "root/qw": "1", "root/qx": "1", "root/qy": "1", "root/qz": "1",
                     "shoulder": "rad", "wrist/qw": "1", "wrist/qx": "1", "wrist/qy": "1",
                     "wrist/qz": "1", "slider": "model unit"}
    assert fly["nmf/root/x"] == fly["nmf/slider"] == "mm" and fly["nmf/shoulder"] == "rad"
    assert dof_units({"joint_names": ["a"]}) == {}  # a damaged layout: no units, no error

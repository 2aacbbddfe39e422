"""Picking NeuroMechFly dofs by leg, joint and axis (issue 10, item 15)."""

import numpy as np
import pytest
import xarray as xr

import flyarchive
from flyarchive.errors import SelectionError
from flyarchive.testing.markers import requires_flygym

pytestmark = requires_flygym


@pytest.fixture(scope="module")
def labels():
    """The dof labels of the NeuroMechFly world flyarchive composes with flygym 2.1.1."""
    from flyarchive.interop import nmf
    from flyarchive.layout import ModelLayout

    return list(ModelLayout.from_model(nmf.build_world().model).dof_labels)


@pytest.fixture
def qpos(labels):
    values = np.arange(2 * 3 * len(labels), dtype=float).reshape(2, 3, len(labels))
    return xr.DataArray(values, dims=("world", "time", "dof"), coords={"dof": labels})


def test_a_leg_and_joint_name_one_dof(labels):
    assert flyarchive.dof_labels(labels, leg="lf", joint="tarsus1") == ["nmf/lf_tibia-lf_tarsus1-pitch"]


def test_legs_are_matched_in_any_case(labels):
    assert flyarchive.dof_labels(labels, leg="RH", joint="tibia") == ["nmf/rh_trochanterfemur-rh_tibia-pitch"]


def test_a_leg_alone_gives_all_its_dofs_in_archive_order(labels):
    expected = [label for label in labels if "-lm_" in label]

    actual = flyarchive.dof_labels(labels, leg="lm")

    assert actual == expected and len(actual) == 11


def test_joint_and_axis_select_across_legs(labels):
    actual = flyarchive.dof_labels(labels, joint="coxa", axis="yaw")

    assert actual == [f"nmf/c_thorax-{leg}_coxa-yaw" for leg in ("lf", "lm", "lh", "rf", "rm", "rh")]


def test_several_legs_may_be_given(labels):
    assert flyarchive.dof_labels(labels, leg=["lf", "rf"], joint="tarsus1") == [
        "nmf/lf_tibia-lf_tarsus1-pitch", "nmf/rf_tibia-rf_tarsus1-pitch"]


def test_the_free_joint_is_never_selected(labels):
    actual = flyarchive.dof_labels(labels, fly="nmf")

    assert actual == labels[7:]  # nmf/x, y, z, qw, qx, qy, qz are the free joint's


def test_select_dofs_keeps_the_data_of_the_chosen_dofs(qpos):
    chosen = flyarchive.select_dofs(qpos, leg="lf", joint="tarsus1")

    assert chosen.dims == ("world", "time", "dof")
    np.testing.assert_array_equal(chosen.values[..., 0],
                                  qpos.sel(dof="nmf/lf_tibia-lf_tarsus1-pitch").values)


def test_select_dofs_on_a_dataset_selects_every_variable(qpos):
    ds = xr.Dataset({"qpos": qpos, "n_frames": ("world", [3, 3])})

    chosen = flyarchive.select_dofs(ds, leg="rf", axis="roll")

    assert list(chosen.dof.values) == ["nmf/c_thorax-rf_coxa-roll", "nmf/rf_coxa-rf_trochanterfemur-roll"]


def test_no_match_lists_the_legs_joints_and_axes_that_exist(labels):
    with pytest.raises(SelectionError, match=r"No dof matches leg='LX'.*legs c?.*lf, lh, lm, rf, rh, "
                                             r"rm.*joints coxa, tarsus1.*axes pitch, roll, yaw"):
        flyarchive.dof_labels(labels, leg="LX")


def test_a_misspelt_joint_gets_the_closest_joints(labels):
    with pytest.raises(SelectionError, match=r"No dof matches joint='tibai'\. No dof has joint "
                                             r"'tibai'\. Did you mean 'tibia'\?"):
        flyarchive.dof_labels(labels, joint="tibai")

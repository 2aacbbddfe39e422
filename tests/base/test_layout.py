import mujoco
import pytest

from flyarchive.errors import LayoutMismatchError, SchemaError
from flyarchive.layout import ModelLayout, check_compatible
from flyarchive.testing import TINY_XML, TWO_HINGES_XML, slider_model


def test_dof_labels_name_each_qpos_entry_by_joint_type(tiny):
    expected = (
        "root/x", "root/y", "root/z", "root/qw", "root/qx", "root/qy", "root/qz",
        "shoulder", "wrist/qw", "wrist/qx", "wrist/qy", "wrist/qz", "slider",
    )

    actual = ModelLayout.from_model(tiny).dof_labels

    assert actual == expected
    assert len(actual) == tiny.nq


def test_mocap_names_follow_mocap_index(tiny):
    layout = ModelLayout.from_model(tiny)

    assert layout.mocap_names == ("target",)
    assert layout.nmocap == tiny.nmocap == 1


def test_attrs_round_trip_keeps_layout_and_hash(tiny):
    layout = ModelLayout.from_model(tiny)

    actual = ModelLayout.from_attrs(layout.to_attrs())

    assert actual == layout
    assert actual.hash == layout.hash


def test_edited_layout_attrs_are_refused(tiny):
    attrs = ModelLayout.from_model(tiny).to_attrs()
    attrs["joint_names"][1] = "elbow"

    with pytest.raises(SchemaError, match="inconsistent"):
        ModelLayout.from_attrs(attrs)


def test_renamed_joint_is_named_in_the_mismatch_error(tiny):
    other = mujoco.MjModel.from_xml_string(TINY_XML.replace('"shoulder"', '"elbow"'))

    with pytest.raises(LayoutMismatchError, match=r"index 7: archive 'shoulder', model 'elbow'"):
        check_compatible(ModelLayout.from_model(tiny), ModelLayout.from_model(other))


def test_different_nq_is_named_in_the_mismatch_error(tiny):
    with pytest.raises(LayoutMismatchError, match=r"archive has nq=13.*model has nq=1"):
        check_compatible(ModelLayout.from_model(tiny), ModelLayout.from_model(slider_model()))


def test_missing_mocap_body_is_a_mismatch(tiny):
    xml = TINY_XML.replace('mocap="true"', 'mocap="false"')
    other = mujoco.MjModel.from_xml_string(xml)

    with pytest.raises(LayoutMismatchError, match="nmocap=0"):
        check_compatible(ModelLayout.from_model(tiny), ModelLayout.from_model(other))


def test_same_model_is_compatible(tiny):
    check_compatible(ModelLayout.from_model(tiny), ModelLayout.from_model(tiny))


def test_an_unnamed_joint_beside_one_named_joint0_gets_its_own_label():
    model = mujoco.MjModel.from_xml_string(TWO_HINGES_XML.format(name="joint0"))

    labels = ModelLayout.from_model(model).dof_labels

    assert labels == ("joint0_unnamed", "joint0")


def test_layouts_of_models_without_a_name_collision_keep_their_hash(tiny):
    expected = "30188fcf72d2369f58ace2940db51a375dcc1c67884c55e04c5f47c2ef2beec5"  # 69c2104

    actual = ModelLayout.from_model(tiny).hash

    assert actual == expected

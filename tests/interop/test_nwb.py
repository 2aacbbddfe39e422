"""NWB files that pass NWB's own checker with the lab's metadata, and say honestly what
they know without it: the recording's start, identifiers unique per archive and world,
joint angles, leg phases and world variables beside the poses; files made as the user's
umask says."""

from __future__ import annotations

import os
from datetime import datetime

import numpy as np
import pytest

import flyarchive
from flyarchive.interop.poses import export_poses
from flyarchive.testing.fixtures import record
from flyarchive.testing.markers import requires_movement, requires_nwb, requires_nwbinspector

pytestmark = [requires_nwb, pytest.mark.slow]  # pynwb and ndx-pose import for seconds

LEGS = ("lf", "lm", "lh", "rf", "rm", "rh")
#: A fly as NeuroMechFly names it: a thorax on a free joint, six legs of one hinge each.
FLY_XML = """
<mujoco>
  <option timestep="0.002"/>
  <worldbody>
    <geom type="plane" size="5 5 0.1"/>
    <body name="nmf/c_thorax" pos="0 0 0.6">
      <freejoint name="nmf/c_thorax-free"/>
      <geom type="box" size="0.5 0.2 0.1"/>
      {legs}
    </body>
  </worldbody>
</mujoco>
"""
LEG_XML = """
      <body name="nmf/{leg}_coxa" pos="{x} {y} 0">
        <joint name="nmf/{leg}_coxa-pitch" type="hinge" axis="0 1 0" range="-0.5 0.5"/>
        <geom type="capsule" fromto="0 0 0 0 {dy} -0.3" size="0.03"/>
        <body name="nmf/{leg}_tarsus5" pos="0 {dy} -0.3">
          <geom type="capsule" fromto="0 0 0 0 {dy} -0.2" size="0.02"/>
        </body>
      </body>"""
METADATA = {
    "session_description": "A fly-shaped body kicked about, for a test",
    "experiment_description": "Tests of flyarchive's NWB export",
    "experimenter": ["Doe, Jane"], "lab": "Fly Lab", "institution": "Example University",
    "keywords": ["walking", "simulation"],
    "subject": {"subject_id": "fly", "species": "Drosophila melanogaster", "age": "P3D",
                "sex": "F", "genotype": "wild type"},
}


def fly_model():
    import mujoco

    legs = "".join(LEG_XML.format(leg=leg, x=0.3 * (1 - i % 3), y=0.2 if leg[0] == "l" else -0.2,
                                  dy=0.2 if leg[0] == "l" else -0.2)
                   for i, leg in enumerate(LEGS))
    return mujoco.MjModel.from_xml_string(FLY_XML.format(legs=legs))


@pytest.fixture(scope="module")
def fly(tmp_path_factory):
    """3 worlds of the fly-shaped body, 40 frames each, with world variables."""
    url = record(fly_model(), str(tmp_path_factory.mktemp("fly") / "fly.zarr"), n_worlds=3,
                 n_steps=156)
    flyarchive.add_world_vars(url, {"seed": np.array([11, 12, 13]),
                                    "genotype_sim": np.array(["wt", "mutA", "wt"])})
    return url


def inspect(paths):
    from nwbinspector import Importance, inspect_nwbfile

    found = [m for p in paths for m in inspect_nwbfile(nwbfile_path=p)]
    return {level: [f"{m.check_function_name}: {m.message}" for m in found
                    if m.importance == level]
            for level in (Importance.CRITICAL, Importance.BEST_PRACTICE_VIOLATION)}


@requires_nwbinspector
def test_with_the_lab_s_metadata_nwbinspector_finds_nothing_critical_or_against_practice(
        fly, tmp_path):
    written = export_poses(fly, tmp_path / "nwb", format="nwb", metadata=METADATA)

    problems = inspect(written)

    assert len(written) == 3
    assert all(not found for found in problems.values()), problems


def test_metadata_from_a_yaml_file_fills_the_nwbfile_and_subject(fly, tmp_path):
    import pynwb

    meta = tmp_path / "meta.yaml"
    meta.write_text("session_description: walking flies\nexperimenter: Doe, Jane\nlab: Fly Lab\n"
                    "institution: Example University\n"
                    "subject: {subject_id: fly, species: Drosophila melanogaster, age: P3D,"
                    " sex: F, genotype: 'w1118'}\n")

    written = export_poses(fly, tmp_path / "nwb", format="nwb", worlds=[2], metadata=meta)

    with pynwb.NWBHDF5IO(written[0], "r") as io:
        nwb = io.read()
        assert nwb.session_description == "walking flies" and nwb.lab == "Fly Lab"
        assert list(nwb.experimenter) == ["Doe, Jane"]
        assert nwb.subject.subject_id == "fly-world2" and nwb.subject.genotype == "w1118"
        assert nwb.subject.age == "P3D" and nwb.subject.sex == "F"


def test_an_age_range_and_a_date_of_birth_are_taken_as_nwb_gives_them(fly, tmp_path):
    import pynwb

    meta = tmp_path / "meta.yaml"
    meta.write_text("subject: {age: P2D/P5D, date_of_birth: 2026-12-01}\n")
    open_ended = {"subject": {"age": "P2D/"}}

    written = export_poses(fly, tmp_path / "nwb", format="nwb", worlds=[0], metadata=meta)
    other = export_poses(fly, tmp_path / "other", format="nwb", worlds=[0], metadata=open_ended)

    with pynwb.NWBHDF5IO(written[0], "r") as io:
        subject = io.read().subject
        assert subject.age == "P2D/P5D"
        assert subject.date_of_birth.isoformat() == "2026-12-01T00:00:00+00:00"
    with pynwb.NWBHDF5IO(other[0], "r") as io:
        assert io.read().subject.age == "P2D/"


def test_without_metadata_the_defaults_are_honest(fly, tiny, tmp_path):
    import pynwb

    other = record(tiny, str(tmp_path / "tiny.zarr"), n_worlds=1)
    ds = flyarchive.open_archive(fly)

    flies = export_poses(fly, tmp_path / "fly", format="nwb")
    tinies = export_poses(other, tmp_path / "tiny", format="nwb", bodies="hand")

    files = []
    for path in [*flies, *tinies]:
        with pynwb.NWBHDF5IO(path, "r") as io:
            nwb = io.read()
            files.append((nwb.identifier, nwb.subject.subject_id, nwb.subject.species,
                          nwb.subject.sex, nwb.session_start_time))
    identifiers = [f[0] for f in files]
    assert len(set(identifiers)) == len(identifiers) == 4
    assert identifiers[1] == f"world1-{ds.attrs['archive_id']}"
    assert [f[2] for f in files] == ["Drosophila melanogaster"] * 3 + [None]
    assert {f[3] for f in files} == {"U"}  # unknown: nothing says otherwise
    assert files[0][4] == datetime.fromisoformat(ds.attrs["created"])  # the recording's start


def test_joint_angles_leg_phases_and_world_variables_beside_the_poses(fly, tmp_path):
    import pynwb

    written = export_poses(fly, tmp_path / "nwb", format="nwb", worlds=[1])

    ds = flyarchive.open_archive(fly)
    epochs = flyarchive.gait_epochs(fly, worlds=[1])
    with pynwb.NWBHDF5IO(written[0], "r") as io:
        nwb = io.read()
        joints = nwb.processing["behavior"]["JointAngles"]
        series = joints.time_series["nmf.lm_coxa-pitch"]
        expected = ds.qpos.sel(world=1, dof="nmf/lm_coxa-pitch").values
        assert np.array_equal(series.data[:], expected) and series.unit == "radians"
        assert len(joints.time_series) == 6  # the hinges; not the free joint
        table = nwb.processing["behavior"]["world_variables"].to_dataframe()
        assert table.seed.tolist() == [12] and table.genotype_sim.tolist() == ["mutA"]
        phases = nwb.intervals["leg_phases"].to_dataframe()
    assert len(phases) == len(epochs) > 0
    expected_rows = epochs.sort_values(["start_time", "leg"], kind="stable")
    assert phases.start_time.tolist() == expected_rows.start_time.tolist()
    assert phases.leg.tolist() == expected_rows.leg.tolist()
    assert set(phases.phase) <= {"stance", "swing"}


def test_slide_and_ball_joints_go_beside_the_hinges_in_their_units(tiny, tmp_path):
    import pynwb

    url = record(tiny, str(tmp_path / "tiny.zarr"), n_worlds=1, n_steps=30)
    qpos = flyarchive.open_archive(url).qpos.sel(world=0)

    written = export_poses(url, tmp_path / "nwb", format="nwb", bodies="hand", length_unit="cm")

    with pynwb.NWBHDF5IO(written[0], "r") as io:
        behavior = io.read().processing["behavior"]
        hinge = behavior["JointAngles"].time_series["shoulder"]
        slide = behavior["JointDisplacements"].time_series["slider"]
        ball = behavior["JointOrientations"].time_series["wrist"]
        assert np.array_equal(hinge.data[:], qpos.sel(dof="shoulder").values)
        assert np.array_equal(slide.data[:], qpos.sel(dof="slider").values)
        assert (slide.unit, slide.conversion) == ("meters", 0.01)
        assert np.array_equal(ball.data[:], qpos.sel(dof=[f"wrist/q{c}" for c in "wxyz"]).values)
        assert ball.data.shape == (qpos.sizes["time"], 4)
        assert "root" not in behavior["JointAngles"].time_series  # the free joint: a body


@pytest.mark.parametrize("umask", [0o027, 0o002])
def test_files_are_made_as_the_user_s_umask_says(fly, tmp_path, umask):
    before = os.umask(umask)
    try:
        written = export_poses(fly, tmp_path / "nwb", format="nwb", worlds=[0])
    finally:
        os.umask(before)

    assert os.stat(written[0]).st_mode & 0o777 == 0o666 & ~umask


@requires_movement
def test_a_movement_export_carries_world_variables_and_the_kept_tarsus_tips(fly, tmp_path):
    import xarray as xr

    flyarchive.keep_positions(fly, "nmf/c_thorax", points=flyarchive.tarsus_tips())

    written = export_poses(fly, tmp_path / "poses.nc", format="movement")

    back = xr.open_dataset(written[0])
    assert [str(k) for k in back.keypoint.values] == ["nmf/c_thorax",
                                                      *flyarchive.tarsus_tips()]
    assert back.seed.values.tolist() == [11, 12, 13] and back.seed.dims == ("individual",)
    assert back.genotype_sim.values.tolist() == ["wt", "mutA", "wt"]
    import warnings

    legs = {leg: f"nmf/{leg}_tip" for leg in ("lf", "lm", "lh", "rf", "rm", "rh")}
    with warnings.catch_warnings():  # in mm, as it says: gait reads it without a warning
        warnings.simplefilter("error", UserWarning)
        gait = flyarchive.gait_summary(back, thorax="nmf/c_thorax", legs=legs)
    assert gait.distance.attrs["units"] == "mm"


@requires_movement
def test_the_command_line_exports_every_kept_keypoint_when_none_is_named(fly, tmp_path, cli):
    import xarray as xr

    flyarchive.keep_positions(fly, "nmf/c_thorax", points=flyarchive.tarsus_tips())

    code, _, err = cli("export-poses", fly, "--format", "movement", "--to", tmp_path / "p.nc")

    assert code == 0, err
    back = xr.open_dataset(tmp_path / "p.nc")
    assert [str(k) for k in back.keypoint.values] == ["nmf/c_thorax", *flyarchive.tarsus_tips()]


@requires_movement
def test_positions_kept_on_their_own_export_the_keypoints_worlds_and_window_asked(
        fly, tmp_path, cli):
    import xarray as xr

    own = str(tmp_path / "own.zarr")
    flyarchive.keep_positions(fly, "nmf/c_thorax", points=flyarchive.tarsus_tips(), to=own)
    ids = [int(w) for w in flyarchive.open_positions(own).world.values]
    tip = next(iter(flyarchive.tarsus_tips()))

    written = export_poses(own, tmp_path / "some.nc", format="movement", points={tip: None},
                           worlds=ids[1:], time=(0.1, 0.3))

    back = xr.open_dataset(written[0])
    assert [str(k) for k in back.keypoint.values] == [tip]
    assert back.sizes["individual"] == len(ids) - 1
    assert 0.1 - 1e-9 <= float(back.time.min()) and float(back.time.max()) <= 0.3 + 1e-9
    for args, said in [(("--keypoints", "nope"), r"Keypoint\(s\) \['nope'\] are not among"),
                       (("--worlds", "999"), r"World\(s\) \[999\] are not in"),
                       (("--time", "50:60"), "holds no frame")]:
        code, _, err = cli("export-poses", own, "--format", "movement", "--to",
                           tmp_path / "bad.nc", *args)
        assert code == 2 and "Traceback" not in err
        assert __import__("re").search(said, err), err
    assert not (tmp_path / "bad.nc").exists()

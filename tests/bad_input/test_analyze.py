"""Bad input to positions, kept positions, gait and pose export: a clear error (what was
asked, what exists, how to fix it), and nothing committed or written changes."""

from __future__ import annotations

import re

import mujoco
import numpy as np
import pytest

import flyarchive
from flyarchive.errors import (
    ArchiveExistsError,
    LayoutMismatchError,
    ModelLoadError,
    OptionsError,
    OutputExistsError,
    OutputLocationError,
    SelectionError,
    StorageError,
)
from flyarchive.interop.poses import export_poses
from flyarchive.testing import TWO_HINGES_XML
from flyarchive.testing.fixtures import copy_archive, snapshot
from flyarchive.testing.markers import (
    requires_movement,
    requires_no_cuda,
    requires_nwb,
    requires_warp,
)


def test_an_unknown_body_names_close_ones_and_how_many_exist(archive):
    before = snapshot(archive)

    with pytest.raises(SelectionError, match=r"No body 'hnad' in the model\. Did you mean "
                       r"'hand'\? The model has 5 bodies: 'torso', 'arm', 'hand'"):
        flyarchive.positions(archive, ["torso", "hnad"])

    assert snapshot(archive) == before


def test_an_unknown_site_is_refused_with_the_sites_that_exist(archive):
    with pytest.raises(SelectionError, match=r"No site 'tip' in the model\. The model has 0 sites"):
        flyarchive.positions(archive, sites=["tip"])


def test_a_point_in_a_body_that_does_not_exist(archive):
    before = snapshot(archive)

    with pytest.raises(SelectionError, match=r"Point 'claw' is in body 'hands', but there is no "
                       r"such body\. Did you mean 'hand'\?"):
        flyarchive.keep_positions(archive, points={"claw": ("hands", (0, 0, 0.1))})

    assert snapshot(archive) == before


@pytest.mark.parametrize("spec", [("hand",), ("hand", (0, 1)), ("hand", "end"),
                                  ("hand", (0, float("nan"), 0))])
def test_a_point_that_is_not_a_body_and_an_offset(archive, spec):
    with pytest.raises(SelectionError, match=r"Point 'p' .*A point is \{label: \(body, \(x, y, z\)\)\}"):
        flyarchive.positions(archive, points={"p": spec})


def test_a_selector_that_keeps_nothing_lists_what_there_is(archive):
    with pytest.raises(SelectionError, match=r"No keypoint matches leg='lf'\. Of 5 keypoints, 0 "
                       r"are named as flygym names bodies"):
        flyarchive.positions(archive, leg="lf")


def test_a_model_that_does_not_match_the_layout(archive):
    other = mujoco.MjModel.from_xml_string(TWO_HINGES_XML.format(name="knee"))
    before = snapshot(archive)

    with pytest.raises(LayoutMismatchError, match=r"archive has nq=13.*model has nq=2"):
        flyarchive.keep_positions(archive, "hand", model=other)

    assert snapshot(archive) == before


def test_an_archive_that_keeps_no_model_and_none_given(bare):
    url = bare
    before = snapshot(url)

    with pytest.raises(ModelLoadError, match=r"keeps no model \(it was recorded or imported with "
                       r"store_model=False.*\)\. Pass the compiled model"):
        flyarchive.keep_positions(url, "hand")

    assert snapshot(url) == before


def test_a_dataset_in_memory_without_a_model(archive):
    ds = flyarchive.open_archive(archive).load()

    with pytest.raises(ModelLoadError, match="does not say which archive it was opened from"):
        flyarchive.positions(ds, "hand")


def test_a_time_window_outside_the_recording(archive):
    with pytest.raises(SelectionError, match=r"No recorded frame of the chosen worlds lies in the "
                       r"time window 5\.0:6\.0; the recording spans 0\.\.0\.152 s"):
        flyarchive.positions(archive, "hand", time=(5.0, 6.0))


def test_worlds_that_are_not_in_the_archive(archive):
    with pytest.raises(SelectionError, match=r"World\(s\) \[7\] are not in the archive"):
        flyarchive.gait_summary(archive, thorax="torso", tips=["hand"], worlds=[0, 7])


def test_an_unknown_backend(archive):
    with pytest.raises(OptionsError, match="backend must be one of cpu, warp-cpu, gpu, got 'cuda'"):
        flyarchive.positions(archive, "hand", backend="cuda")


def test_kept_positions_never_replace_an_archive_at_their_target(archive, recorded, tmp_path):
    other = copy_archive(recorded, tmp_path / "other.zarr")
    before = snapshot(other)

    for overwrite in (False, True):  # a recording: never, asked or not
        with pytest.raises(ArchiveExistsError, match=r"A recorded archive is at .*other\.zarr.*"
                                                     r"never replace a recording"):
            flyarchive.keep_positions(archive, "hand", to=other, overwrite=overwrite)

    assert snapshot(other) == before


def test_positions_beside_an_archive_the_storage_will_not_let_us_write_say_so(archive,
                                                                            monkeypatch):
    """A read-only S3 user got a bare "PermissionError: Access Denied" (its derived group)."""
    import zarr

    import flyarchive.store.derived as derived

    def refuse(*args, **kwargs):
        raise PermissionError("Access Denied")

    monkeypatch.setattr(derived.zarr, "create_group", refuse)
    assert zarr.create_group is refuse  # the same module

    with pytest.raises(StorageError, match=r"Access to '.*run\.zarr' was refused \(PermissionError: "
                                           r"Access Denied\)\. Check the credentials"):
        flyarchive.keep_positions(archive, "hand")


def test_gait_of_another_body_without_tips_says_to_name_them(archive):
    """It named NeuroMechFly's 'nmf/lf_tip' as missing, and not what to pass."""
    with pytest.raises(SelectionError, match=r"no such body.*Without tips, gait takes "
                                             r"NeuroMechFly's six tarsus tips.*--tip lf="):
        flyarchive.gait_summary(archive, thorax="torso")


@requires_movement
def test_a_movement_export_over_an_existing_file_is_refused(archive, tmp_path):
    target = tmp_path / "poses.nc"
    target.write_bytes(b"earlier results")

    with pytest.raises(OutputExistsError, match=r"poses\.nc'\] already exists; pass overwrite=True"):
        export_poses(archive, target, format="movement", bodies="hand")

    assert target.read_bytes() == b"earlier results"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["poses.nc", "run.zarr"]


@requires_nwb
def test_an_nwb_export_over_an_existing_world_file_writes_nothing(archive, tmp_path):
    folder = tmp_path / "nwb"
    folder.mkdir()
    (folder / "world00001.nwb").write_bytes(b"earlier")

    with pytest.raises(OutputExistsError, match=r"world00001\.nwb'\] already exists"):
        export_poses(archive, folder, format="nwb", bodies="hand")

    assert [p.name for p in folder.iterdir()] == ["world00001.nwb"]
    assert (folder / "world00001.nwb").read_bytes() == b"earlier"


def test_a_movement_export_to_a_folder_path_names_the_file_to_give(archive, tmp_path):
    with pytest.raises(OutputLocationError, match=r"names a folder \(it ends in '/'\); a movement "
                                                  r"export writes one netCDF file.*x4/poses\.nc"):
        export_poses(archive, f"{tmp_path}/x4/", format="movement", bodies="hand")

    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.zarr"]


def test_an_export_to_a_url_or_in_an_unknown_format(archive):
    with pytest.raises(OutputLocationError, match="writes local files"):
        export_poses(archive, "s3://lab/poses.nc", format="movement")
    with pytest.raises(OptionsError, match="format must be one of movement, nwb, got 'csv'"):
        export_poses(archive, "poses.csv", format="csv")


def test_the_cli_refuses_a_point_it_cannot_read(cli, archive):
    code, out, err = cli("positions", archive, "--point", "claw=hand")

    assert code == 2
    assert "Cannot read the point 'claw=hand'; write LABEL=BODY@X,Y,Z" in err


@pytest.mark.parametrize(("fmt", "module", "extra"), [("movement", "movement", "movement"),
                                                      ("nwb", "ndx_pose", "nwb")])
def test_an_export_without_its_extra_names_the_extra_to_install(archive, tmp_path, monkeypatch,
                                                                fmt, module, extra):
    import importlib.util

    from flyarchive.errors import MissingDependencyError

    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == module else found(name, *a))

    with pytest.raises(MissingDependencyError, match=rf"pip install 'flyarchive\[{extra}\]'"):
        export_poses(archive, tmp_path / "out", format=fmt, bodies="hand")

    assert not (tmp_path / "out").exists()


@requires_warp
@requires_no_cuda
def test_the_gpu_backend_without_a_cuda_device_names_the_cpu_backends(archive):
    lazy = flyarchive.positions(archive, "hand", backend="gpu")  # may run where a GPU is

    with pytest.raises(OptionsError, match=r"backend='gpu' needs a CUDA device.*'warp-cpu'"):
        flyarchive.load_positions(archive, "hand", backend="gpu")
    with pytest.raises(OptionsError, match="backend='gpu' needs a CUDA device"):
        lazy.compute()


def test_positions_claimed_by_a_writer_that_crashed_elsewhere_need_takeover(archive, cli):
    import json
    from pathlib import Path

    from flyarchive.analyze import keep_positions
    from flyarchive.store.claims import WRITER_KEY, _identity

    def crash(done: int, total: int) -> None:
        raise KeyboardInterrupt  # after the first committed block

    with pytest.raises(KeyboardInterrupt):
        keep_positions(archive, ["torso"], on_block=crash)
    target = next(p for p in (Path(archive) / "derived").iterdir() if p.is_dir())
    record = {"writer": "planted", "kind": "archive", **_identity(), "time": 1.7e9,
              "host": "node-17", "pid": 4242}  # the claim a crash on another host leaves
    (target / WRITER_KEY).write_text(json.dumps(record))
    before = snapshot(archive)

    refused = cli("positions", archive, "--keypoints", "torso", "--quiet")
    after_refusal = snapshot(archive)
    taken = cli("positions", archive, "--keypoints", "torso", "--quiet", "--takeover")

    assert refused[0] == 2 and "(--takeover on the command line)" in refused[2]
    assert "process 4242 on host 'node-17'" in refused[2] and after_refusal == before
    assert taken[0] == 0, taken[2]
    kept = flyarchive.positions(archive, ["torso"])
    assert kept.attrs["stored"] == str(target)
    assert np.array_equal(kept.values, flyarchive.positions(archive, ["torso"], stored=False).values)


def test_positions_built_under_a_client_that_closed_are_refused_on_another_client(
        dask_cluster, dask_client, tmp_path):
    import uuid

    distributed = pytest.importorskip("distributed")
    from flyarchive.testing.fixtures import record

    model = mujoco.MjModel.from_xml_string(TWO_HINGES_XML.format(name=f"h{uuid.uuid4().hex}"))
    url = record(model, str(tmp_path / "run.zarr"))  # a model no worker has loaded
    before = snapshot(url)
    with distributed.Client(dask_cluster, set_as_default=False) as first, first.as_current():
        lazy = flyarchive.positions(url, stored=False)  # its model sent to `first`
    key = f"flyarchive-model-{lazy.attrs['model_sha256']}"
    assert key not in dask_client.who_has()  # released with `first`

    with pytest.raises(ModelLoadError, match=r"\(sha256 [0-9a-f]{12}\.\.\.\) was sent once to the "
                       r"Dask cluster of the client that was the default when this graph was "
                       r"built.*cannot find it there\. The client that sent it closed.*Compute "
                       r"it on that client \(or in the process that built it\), or build it "
                       r"again"):
        dask_client.compute(lazy.data).result()

    assert snapshot(url) == before


def test_a_model_key_read_outside_a_dask_worker_says_where_the_bytes_went():
    import pickle

    from flyarchive.models.shipping import ModelRef

    ref = ModelRef("ab" * 32, b"mjb", "flyarchive-model-" + "ab" * 32)
    unpickled = pickle.loads(pickle.dumps(ref))  # as a process pool's worker gets it

    with pytest.raises(ModelLoadError, match=r"as 'flyarchive-model-abab.*', and this process "
                       r"cannot find it there.*in another process pool"):
        unpickled.blob()


@requires_nwb
def test_an_nwb_export_to_a_link_to_nothing_names_the_link_and_writes_nothing(archive, tmp_path):
    link = tmp_path / "nwb"
    link.symlink_to(tmp_path / "gone")

    with pytest.raises(OutputLocationError, match=r"nwb' is a symbolic link to '.*gone', which "
                       r"does not exist; NWB export writes .* into a folder\. Create what the link "
                       r"points to"):
        export_poses(archive, link, format="nwb", bodies="hand")

    assert link.is_symlink() and not (tmp_path / "gone").exists()


@requires_nwb
def test_an_nwb_export_to_a_link_to_a_file_is_refused(archive, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    link = tmp_path / "nwb"
    link.symlink_to(tmp_path / "notes.txt")

    with pytest.raises(OutputLocationError, match=r"nwb' is a symbolic link to a file; NWB export"):
        export_poses(archive, link, format="nwb", bodies="hand")

    assert (tmp_path / "notes.txt").read_text() == "mine"


@requires_nwb
def test_an_nwb_export_below_a_file_is_refused_before_any_work(archive, tmp_path, monkeypatch):
    import flyarchive.interop.poses as poses

    (tmp_path / "notes.txt").write_text("mine")
    monkeypatch.setattr(poses, "_source_positions", lambda *a: pytest.fail("positions computed"))

    with pytest.raises(OutputLocationError, match=r"notes\.txt' is a file, so '.*notes\.txt/nwb' "
                       r"cannot be written below it"):
        export_poses(archive, tmp_path / "notes.txt" / "nwb", format="nwb", bodies="hand")


@requires_nwb
def test_an_nwb_export_through_a_link_to_nothing_on_the_command_line_is_one_line(archive, cli,
                                                                                 tmp_path):
    link = tmp_path / "nwb"
    link.symlink_to(tmp_path / "gone")

    code, out, err = cli("export-poses", archive, "--format", "nwb", "--to", link / "w1",
                         "--keypoints", "hand")

    assert code == 2 and err.count("\n") == 1
    assert "FileExistsError" not in err and "is a symbolic link to" in err


@requires_movement
def test_a_movement_export_to_a_folder_is_refused(archive, tmp_path):
    folder = tmp_path / "poses"
    folder.mkdir()

    with pytest.raises(OutputLocationError, match=r"poses' is a folder; a movement export writes "
                       r"one netCDF file\. Give the file's path, e.g\. '.*poses/poses\.nc'"):
        export_poses(archive, folder, format="movement", bodies="hand", overwrite=True)

    assert list(folder.iterdir()) == []


# ----------------------------------------------------------------------------- gait
@pytest.mark.parametrize(("field", "value"), [("stance_height", -1.0), ("fall_height", float("nan")),
                                              ("swing_speed", float("inf")), ("min_swing", "0.1")])
def test_a_gait_threshold_that_is_not_a_finite_number_at_least_zero(field, value):
    from flyarchive.analyze.gait import GaitParams

    with pytest.raises(OptionsError, match=rf"GaitParams\.{field} must be a finite number >= 0 "
                       rf"\(--{field.replace('_', '-')} on the command line\), got {value!r}"):
        GaitParams(**{field: value})


def test_a_swing_threshold_below_its_stance_threshold():
    from flyarchive.analyze.gait import GaitParams

    with pytest.raises(OptionsError, match=r"swing_speed=4\.0 is below stance_speed=10\.0"):
        GaitParams(swing_speed=4.0)


@pytest.mark.parametrize(("option", "value"), [("--stance-height", "-1"), ("--fall-height", "nan"),
                                               ("--swing-height", "inf")])
def test_the_gait_command_refuses_thresholds_it_cannot_use(cli, archive, option, value):
    before = snapshot(archive)

    code, out, err = cli("gait", archive, "--thorax", "torso", "--tip", "t=hand@tip", option, value)

    assert code == 2
    assert f"must be a finite number >= 0 ({option} on the command line), got" in err
    assert snapshot(archive) == before


def test_a_gait_window_longer_than_the_recording(archive):
    with pytest.raises(SelectionError, match=r"window=5\.0 s is longer than the selection "
                       r"\(0\.152 s, 20 frames\)\. Pass a shorter window"):
        flyarchive.gait_summary(archive, thorax="torso", tips=["hand"], window=5.0)


def test_a_leg_mapping_that_names_keypoints_the_positions_do_not_have(archive):
    positions = flyarchive.positions(archive, ["torso", "hand"])

    with pytest.raises(SelectionError, match=r"The positions have no keypoint 'hnad'\. Did you "
                       r"mean 'hand'\? Keypoints \(2\): 'torso', 'hand'\. Name keypoints"):
        flyarchive.gait_steps(positions, thorax="torso", legs={"lf": "hnad"})


@requires_movement
@pytest.mark.slow  # movement imports for seconds
def test_a_leg_mapping_that_names_keypoints_a_poses_dataset_does_not_have():
    from flyarchive.testing.walker import walker_poses

    poses = walker_poses(100, 0.5)

    with pytest.raises(SelectionError, match=r"The poses have no keypoint 'L4_tip'.*Keypoints "
                       r"\(7\): 'thorax', 'L1_tip'"):
        flyarchive.gait_summary(poses, thorax="thorax", legs={"lf": "L1_tip", "lx": "L4_tip"})
    with pytest.raises(SelectionError, match=r"A poses dataset needs legs= mapping leg names"):
        flyarchive.gait_summary(poses, thorax="thorax")


def test_tracking_gaps_make_no_steps_across_them():
    from flyarchive.testing.walker import walker_positions

    positions = walker_positions(200, 2.0)
    lost = (positions.time > 0.5) & (positions.time < 0.9)
    gappy = positions.where(~lost)  # NaN: tracking lost for 0.4 s, several steps long

    steps = flyarchive.gait_steps(gappy)

    inside = (steps.touchdown_time > 0.5) & (steps.liftoff_time < 0.9)
    assert not inside.any()
    after = steps[steps.liftoff_time > 0.9].groupby("leg").stance_duration.nth(0)
    assert after.isna().sum() >= 1  # a stance cut by the gap has no known start
    whole = flyarchive.gait_steps(positions)
    assert len(steps) < len(whole)


def test_gait_of_an_archive_of_one_frame(tiny, tmp_path):
    from flyarchive.testing.fixtures import record

    url = record(tiny, str(tmp_path / "one.zarr"), n_steps=1)
    before = snapshot(url)

    with pytest.raises(SelectionError, match=r"Gait needs at least 2 frames; the selection holds "
                       r"1\. Record longer"):
        flyarchive.gait_summary(url, thorax="torso", tips=["hand"])
    with pytest.raises(SelectionError, match="Gait needs at least 2 frames"):
        flyarchive.gait_steps(url, thorax="torso", tips=["hand"])

    assert snapshot(url) == before


def test_saving_gait_measures_of_some_worlds_says_it_needs_every_world(archive, cli):
    before = snapshot(archive)

    with pytest.raises(SelectionError, match=r"save=True \(--save\) stores one value per world "
                       r"and needs every world of the archive; the selection holds 1 of its 2\. "
                       r"Drop worlds= \(--worlds\)"):
        flyarchive.gait_summary(archive, thorax="torso", tips=["hand"], worlds=[1], save=True)
    code, out, err = cli("gait", archive, "--thorax", "torso", "--tip", "t=hand@tip",
                         "--worlds", "0", "--save")

    assert code == 2 and "needs every world of the archive" in err
    assert snapshot(archive) == before


# ----------------------------------------------------------------------------- NWB metadata
@requires_nwb
@pytest.mark.parametrize(("text", "message"), [
    ("lab: Fly Lab\nlabb: typo\n", r"unknown field labb\. Did you mean 'lab'\? Fields: "
                                   r"session_description, .*, subject \(pynwb's names\)"),
    ("subject: {specis: Drosophila melanogaster}\n", r"unknown field subject\.specis\. Did you "
                                                     r"mean 'species'\? Fields of subject: "),
    ("subject: {age: 3}\n", r"subject\.age must be text \(ISO 8601 duration, e\.g\. P3D, or a "
                            r"range P2D/P5D.*\), got int 3\. Quote it in YAML"),
    ("subject: {age: 3 days}\n", r"subject\.age must be an ISO 8601 duration such as 'P3D'"),
    ("subject: {age: P2D/5 days}\n", r"or a range of two, the shorter first \('P2D/P5D'"),
    ("subject: {age: P5D/P2D}\n", r"the shorter first .* got 'P5D/P2D'"),
    ("subject: {date_of_birth: yesterday}\n", r"subject\.date_of_birth must be a date "
                                             r"\(2026-12-01\) or date and time"),
    ("subject: {sex: female}\n", r"subject\.sex must be one of M, F, U, O \(NWB's codes\), got "
                                 r"'female'"),
    ("experimenter: 5\n", r"experimenter must be text or list of text, got int 5"),
    ("keywords: walking\n", r"keywords must be list of text, got str 'walking'"),
    ("subject: fly\n", r"subject must be a mapping of Subject fields"),
    ("- lab\n", r"holds a list; it must be a mapping of NWBFile fields"),
    ("lab: [Fly Lab\n", r"is not valid YAML at line 2"),
])
def test_nwb_metadata_with_unknown_fields_or_wrong_types_writes_nothing(archive, tmp_path, text,
                                                                        message):
    meta = tmp_path / "meta.yaml"
    meta.write_text(text)

    with pytest.raises(OptionsError, match=message):
        export_poses(archive, tmp_path / "nwb", format="nwb", bodies="hand", metadata=meta)

    assert not (tmp_path / "nwb").exists()


@requires_nwb
def test_nwb_metadata_that_is_not_utf8_is_named_and_writes_nothing(archive, tmp_path):
    meta = tmp_path / "meta.yaml"
    meta.write_bytes("lab: Laboratoire de neurogénétique\n".encode("latin-1"))

    with pytest.raises(OptionsError, match=r"meta\.yaml' is not UTF-8 text \(byte 26: b'\\xe9'\)\. "
                                           r"Save it as UTF-8"):
        export_poses(archive, tmp_path / "nwb", format="nwb", bodies="hand", metadata=meta)

    assert not (tmp_path / "nwb").exists()


@requires_movement
def test_nwb_metadata_for_a_movement_file_is_refused(archive, tmp_path):  # (movement not imported)
    with pytest.raises(OptionsError, match=r"metadata \(--metadata\) describes NWB files"):
        export_poses(archive, tmp_path / "poses.nc", format="movement", metadata={"lab": "x"})

    assert not (tmp_path / "poses.nc").exists()


@requires_nwb
def test_the_cli_names_the_metadata_field_it_cannot_use(cli, archive, tmp_path):
    meta = tmp_path / "meta.yaml"
    meta.write_text("session_description: x\nsubject:\n  sex: male\n")

    code, out, err = cli("export-poses", archive, "--format", "nwb", "--to", str(tmp_path / "n"),
                         "--keypoints", "hand", "--metadata", str(meta))

    assert code == 2 and "subject.sex must be one of M, F, U, O" in err
    assert not (tmp_path / "n").exists()


@pytest.mark.parametrize("kwargs, said", [
    (dict(bodies=5), "bodies must be a name or a list of names (text), got int 5"),
    (dict(sites=5), "sites must be a name or a list of names"),
    (dict(points=[("hand", [0, 0, 0])]), "points must be a mapping"),
    (dict(points="hand"), "points must be a mapping"),
    (dict(leg=3), "leg must be a name or a list of names"),
])
def test_arguments_of_the_wrong_type_are_named(archive, kwargs, said):
    with pytest.raises(SelectionError, match=re.escape(said)):
        flyarchive.positions(archive, **kwargs)


@pytest.mark.parametrize("kwargs", [dict(leg=1), dict(joint=3), dict(joint={"tibia": 1})])
def test_select_dofs_names_a_selector_of_the_wrong_type(archive, kwargs):
    ds = flyarchive.open_archive(archive)
    name = next(iter(kwargs))

    with pytest.raises(SelectionError, match=f"{name} must be a name or a list of names"):
        flyarchive.select_dofs(ds.qpos, **kwargs)

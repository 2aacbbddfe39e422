"""Bad portable models (issue 32): an MJCF whose files are missing or too large, spec zips
that are bombs, lie, hold links or names that leave them, kept MJCF that names files outside
its zip or compiles forever, a model of another layout or qpos0, an MJB of another release
alone, and ``attach`` of the wrong model or beside a writer. Each case is one clear error
(type and message fragment); nothing committed changes.

"Another release" is this one reading an archive whose MJB says another release wrote it
(:func:`flyarchive.testing.spec_zips.as_another_release`): it must use the portable form.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import mujoco
import pytest

import flyarchive
from flyarchive import TrajectoryRecorder, attach_model
from flyarchive.errors import (
    ArchiveInUseError,
    LayoutMismatchError,
    ModelLoadError,
    OutputExistsError,
    UnsafeModelError,
)
from flyarchive.models import mujoco_release, portable_model
from flyarchive.models.spec_zip import MAX_FILE_BYTES, MAX_TOTAL_BYTES, read_spec_zip, write_spec_zip
from flyarchive.models.check import compiled_model
from flyarchive.testing import TINY_XML, TWO_HINGES_XML, simulate, write_meshed_model
from flyarchive.testing.fixtures import snapshot
from flyarchive.testing.spec_zips import (
    SLOW_XML,
    as_another_release,
    box_obj,
    mesh_xml,
    put_portable,
    with_declared_size,
    zip_of,
)

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def tiny_xml(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.xml"
    path.write_text(TINY_XML)
    return path


@pytest.fixture
def elsewhere(archive: str) -> str:
    """The tiny archive as another release sees it: its MJB unreadable, no portable form."""
    as_another_release(archive)
    return archive


# ----------------------------------------------------------------------------- the user's model
def test_an_mjcf_whose_mesh_is_missing_is_refused_before_anything_is_written(tmp_path):
    path = write_meshed_model(tmp_path / "fly")
    (tmp_path / "fly" / "assets" / "shell.obj").unlink()
    model = mujoco.MjModel.from_xml_string(TINY_XML)
    url = tmp_path / "run.zarr"

    with pytest.raises(ModelLoadError, match=r"The mesh 'shell' of .*fly\.xml' names the file "
                                             r"'shell\.obj', which is not at .*assets/shell\.obj'\. "
                                             r"Put the file there"):
        TrajectoryRecorder(str(url), model, model_source=path)

    assert not url.exists()


def test_an_mjcf_naming_a_file_larger_than_flyarchive_keeps_is_refused(tmp_path):
    huge = tmp_path / "huge.obj"
    with huge.open("wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: nothing is written, nothing is read
    (tmp_path / "huge.xml").write_text(mesh_xml(str(huge)))

    with pytest.raises(ModelLoadError, match=rf"names the file '{huge}' of {MAX_FILE_BYTES + 1:,} "
                                             r"bytes; flyarchive keeps files of at most"):
        portable_model(tmp_path / "huge.xml")


def test_a_model_source_of_another_model_is_refused_by_the_recorder(tmp_path, tiny_xml):
    other = tmp_path / "two.xml"
    other.write_text(TWO_HINGES_XML.format(name="elbow"))
    model = mujoco.MjModel.from_xml_path(str(tiny_xml))

    with pytest.raises(LayoutMismatchError, match=r"does not compile to the model being recorded: "
                                                  r"archive has nq=13, nmocap=1; model has nq=2"):
        TrajectoryRecorder(str(tmp_path / "run.zarr"), model, model_source=other)

    assert not (tmp_path / "run.zarr").exists()


def test_an_mjb_is_not_a_model_source(tmp_path, tiny):
    from flyarchive.models import save_mjb

    path = save_mjb(tiny, tmp_path / "tiny.mjb")

    with pytest.raises(ModelLoadError, match=r"has suffix '\.mjb'.*bound to the MuJoCo release"):
        portable_model(path)


# ----------------------------------------------------------------------------- spec zips given
@pytest.mark.parametrize(("entries", "links", "fragment"), [
    ({"model.xml": mesh_xml("../../x.obj"), "../../x.obj": box_obj()}, None,
     r"entry '\.\./\.\./x\.obj', whose name holds an empty, '\.' or '\.\.' part"),
    ({"model.xml": mesh_xml("/tmp/x.obj"), "/tmp/x.obj": box_obj()}, None,
     r"entry '/tmp/x\.obj', whose name is an absolute path"),
    ({"model.xml": mesh_xml("x.obj")}, {"x.obj": "/etc/hostname"},
     r"entry 'x\.obj' is a symbolic link"),
    ({"a.xml": mesh_xml("x.obj"), "b.xml": mesh_xml("x.obj"), "x.obj": box_obj()}, None,
     r"holds 2 MJCF \(\.xml\) files"),
], ids=["dot-dot", "absolute", "link", "two MJCF files"])
def test_a_spec_zip_given_that_could_leave_itself_is_refused(tmp_path, entries, links, fragment):
    path = tmp_path / "fly.mjz"
    path.write_bytes(zip_of(entries, links=links))

    with pytest.raises(ModelLoadError, match=rf"The spec zip .*fly\.mjz' cannot be used\. "
                                             rf".*{fragment}"):
        portable_model(path)


def test_a_zip_bomb_is_refused_by_what_it_declares_before_anything_is_inflated():
    blob = write_spec_zip(mesh_xml("m.obj").encode(), {"m.obj": box_obj(), "n.obj": box_obj(),
                                                        "o.obj": box_obj()})
    one = with_declared_size(blob, "m.obj", MAX_FILE_BYTES + 1)
    three = blob
    for name in ("m.obj", "n.obj", "o.obj"):
        three = with_declared_size(three, name, MAX_TOTAL_BYTES // 3 + 1)

    with pytest.raises(ValueError, match=rf"file 'm\.obj' is {MAX_FILE_BYTES + 1:,} bytes "
                                         "uncompressed; at most"):
        read_spec_zip(one)
    with pytest.raises(ValueError, match=rf"more than {MAX_TOTAL_BYTES:,} bytes uncompressed"):
        read_spec_zip(three)


def test_an_entry_that_inflates_beyond_what_it_declares_is_refused():
    blob = write_spec_zip(mesh_xml("m.obj").encode(), {"m.obj": b"\0" * (8 << 20)})
    lying = with_declared_size(blob, "m.obj", 1000)

    with pytest.raises(ValueError, match=r"Its file 'm\.obj' cannot be read \(Bad CRC-32"):
        read_spec_zip(lying)


# ----------------------------------------------------------------------------- kept ones
def _open(url: str) -> None:
    flyarchive.load_kept_model(url)


@pytest.mark.parametrize(("xml", "fragment"), [
    (mesh_xml("{canary}"), r"names a file whose name is an absolute path"),
    (mesh_xml("../../canary.obj"), r"holds an empty, '\.' or '\.\.' part"),
    (mesh_xml("other.obj"), r"names a file the zip does not hold"),
    ('<mujoco><include file="{canary}"/></mujoco>', r"has <include file="),
    ('<mujoco><compiler meshdir="/"/></mujoco>', r"sets <compiler meshdir='/'>"),
], ids=["absolute", "dot-dot", "not in the zip", "include", "meshdir"])
def test_a_kept_mjcf_that_names_files_outside_its_zip_is_refused_before_mujoco_reads_it(
        elsewhere, tmp_path, xml, fragment):
    canary = tmp_path / "canary.obj"
    canary.write_bytes(box_obj())  # were it read, the model would compile
    path = put_portable(elsewhere, zip_of({"model.xml": xml.format(canary=canary)}))
    before = snapshot(elsewhere)

    with pytest.raises(ModelLoadError, match=fragment) as caught:
        _open(elsewhere)

    assert f"could not compile the portable model {str(path)!r}" in str(caught.value)
    assert not isinstance(caught.value, UnsafeModelError)
    assert snapshot(elsewhere) == before


def test_a_kept_spec_zip_holding_a_link_is_refused(elsewhere):
    put_portable(elsewhere, zip_of({"model.xml": mesh_xml("x.obj")}, links={"x.obj": "/etc/passwd"}))
    before = snapshot(elsewhere)

    with pytest.raises(ModelLoadError, match=r"entry 'x\.obj' is a symbolic link"):
        _open(elsewhere)

    assert snapshot(elsewhere) == before


def test_a_kept_zip_bomb_is_refused(elsewhere):
    bomb = with_declared_size(write_spec_zip(mesh_xml("m.obj").encode(), {"m.obj": box_obj()}),
                              "m.obj", MAX_FILE_BYTES + 1)
    put_portable(elsewhere, bomb)
    before = snapshot(elsewhere)

    with pytest.raises(ModelLoadError, match=r"is \d[\d,]+ bytes uncompressed; at most"):
        _open(elsewhere)

    assert snapshot(elsewhere) == before


def test_a_kept_mjcf_whose_compile_never_ends_is_stopped(tmp_path):
    blob = write_spec_zip(SLOW_XML.encode(), {})

    with pytest.raises(UnsafeModelError, match=r"MuJoCo's model compiler did not finish within "
                                               r"3 s( of CPU time \(stopped\)| \(killed\))"):
        compiled_model(lambda: blob, hashlib.sha256(blob).hexdigest(), "slow.mjz",
                       cache=tmp_path, timeout_s=3)

    assert not list(tmp_path.rglob("*.json")) and not list(tmp_path.rglob("*.mjb"))


def test_a_kept_portable_model_of_another_layout_is_refused_naming_the_difference(elsewhere):
    other = TWO_HINGES_XML.format(name="elbow")
    path = put_portable(elsewhere, write_spec_zip(other.encode(), {}))
    before = snapshot(elsewhere)

    with pytest.raises(LayoutMismatchError, match=r"compiled by MuJoCo .* does not fit the archive "
                                                  r"it is kept in: archive has nq=13, nmocap=1; "
                                                  r"model has nq=2, nmocap=0") as caught:
        _open(elsewhere)

    assert str(path) in str(caught.value)
    assert snapshot(elsewhere) == before


def test_a_kept_portable_model_of_another_qpos0_is_refused_naming_it(elsewhere):
    shifted = TINY_XML.replace('<body name="torso" pos="0 0 0.6">', '<body name="torso" pos="0 0 0.7">')
    put_portable(elsewhere, write_spec_zip(shifted.encode(), {}),
                 qpos0=mujoco.MjModel.from_xml_string(TINY_XML).qpos0.tolist())
    before = snapshot(elsewhere)

    with pytest.raises(LayoutMismatchError, match=r"qpos0 differs at index 2: archive 0\.6, "
                                                  r"model 0\.7"):
        _open(elsewhere)

    assert snapshot(elsewhere) == before


def test_an_mjb_only_archive_of_another_release_is_one_line_naming_both_and_the_fix(elsewhere,
                                                                                   cli, tmp_path):
    before = snapshot(elsewhere)

    code, _, err = cli("render", elsewhere, "--camera", "front", "--out", tmp_path / "videos",
                       "--workers", "0")

    assert code == 2 and err.count("\n") == 1 and err.startswith("flyarchive render: error: ")
    assert f"MJB of MuJoCo 3.15.0, which MuJoCo {mujoco_release()} cannot read" in err
    assert f"flyarchive model attach {elsewhere} --model fly.xml" in err
    assert snapshot(elsewhere) == before and not (tmp_path / "videos").exists()


# ----------------------------------------------------------------------------- attach
def test_attaching_another_model_is_refused_naming_the_difference(elsewhere, tmp_path):
    other = tmp_path / "two.xml"
    other.write_text(TWO_HINGES_XML.format(name="elbow"))
    before = snapshot(elsewhere)

    with pytest.raises(LayoutMismatchError, match=r"does not fit the archive at .*: archive has "
                                                  r"nq=13, nmocap=1; model has nq=2, nmocap=0; "
                                                  r".*Nothing was written"):
        attach_model(elsewhere, other)

    assert snapshot(elsewhere) == before


def test_attaching_a_model_of_another_qpos0_is_refused_where_the_mjb_tells(archive, tmp_path):
    moved = tmp_path / "moved.xml"
    moved.write_text(TINY_XML.replace('name="shoulder" type="hinge"',
                                      'name="shoulder" type="hinge" ref="30"'))
    before = snapshot(archive)

    with pytest.raises(LayoutMismatchError, match=r"qpos0 differs at index 7: archive 0\.0, "
                                                  r"model 0\.5235987"):
        attach_model(archive, moved)

    assert snapshot(archive) == before


def test_attaching_a_model_of_other_geometry_is_refused_where_the_mjb_tells(archive, tmp_path):
    """An arm further out and a thicker hand were kept: another MuJoCo release then put
    the bodies elsewhere than the recording did."""
    moved = tmp_path / "moved.xml"
    moved.write_text(TINY_XML.replace('<body name="arm" pos="0.15 0 0">',
                                      '<body name="arm" pos="0.25 0 0">'))
    before = snapshot(archive)

    with pytest.raises(LayoutMismatchError, match=r"the kept MJB's model\.body_pos\[2\] is "
                                                  r"\[0\.15, 0\.0, 0\.0\], the source compiles "
                                                  r"to \[0\.25, 0\.0, 0\.0\].*Nothing was written"):
        attach_model(archive, moved)

    assert snapshot(archive) == before


def test_attaching_while_a_writer_holds_the_archive_is_refused(tiny, tiny_xml, tmp_path):
    url = str(tmp_path / "busy.zarr")
    recorder = TrajectoryRecorder(url, tiny, chunk_frames=5)
    simulate(tiny, 2, 24, recorder.record_as_needed)
    before = snapshot(url)

    with pytest.raises(ArchiveInUseError, match="Another writer is writing the archive"):
        attach_model(url, tiny_xml)

    assert snapshot(url) == before
    recorder.close()


def test_attaching_another_portable_model_over_one_kept_needs_replace(elsewhere, tiny_xml,
                                                                      tmp_path):
    attach_model(elsewhere, tiny_xml)
    meshed = write_meshed_model(tmp_path / "meshed")  # the same layout, another model
    before = snapshot(elsewhere)

    with pytest.raises(OutputExistsError, match=r"keeps a portable model already .*Pass "
                                                r"replace=True \(--replace\)"):
        attach_model(elsewhere, meshed)

    assert snapshot(elsewhere) == before


def test_attaching_a_missing_file_is_a_model_load_error(elsewhere, tmp_path):
    before = snapshot(elsewhere)

    with pytest.raises(ModelLoadError, match="No model file at"):
        attach_model(elsewhere, tmp_path / "missing.xml")

    assert snapshot(elsewhere) == before


# ----------------------------------------------------------------------------- geometry
def _two_bodies(arm="0.5 0 0.3", size="0.1"):
    return (f'<mujoco><worldbody><body name="base"><freejoint/><geom size="{size}"/>'
            f'<body name="arm" pos="{arm}"><joint name="elbow"/><geom size="0.05"/>'
            '</body></body></worldbody></mujoco>')


@pytest.mark.parametrize("change, said", [
    (lambda m: m.body_pos.__setitem__(2, [0.9, 0, 0.9]), r"model.body_pos\[2\] is \[0.9, 0.0, 0.9\]"),
    (lambda m: m.geom_size.__setitem__((0, 0), 0.3), r"model.geom_size\[0\] is \[0.3"),
])
def test_a_source_that_compiles_to_other_geometry_than_the_model_is_refused(
        tmp_path, change, said):
    from flyarchive import TrajectoryRecorder
    from flyarchive.errors import LayoutMismatchError

    source = tmp_path / "fly.xml"
    source.write_text(_two_bodies())
    model = mujoco.MjModel.from_xml_path(str(source))
    TrajectoryRecorder(str(tmp_path / "same.zarr"), model, model_source=str(source))  # accepted
    change(model)  # changed in memory after compiling: the source is no longer its source
    url = tmp_path / "run.zarr"

    with pytest.raises(LayoutMismatchError, match=f"does not compile to the model being "
                                                  f"recorded: {said}"):
        TrajectoryRecorder(str(url), model, model_source=str(source))

    assert not url.exists()


def test_a_model_source_given_when_appending_is_not_kept_and_a_warning_says_how(tmp_path):
    from flyarchive import TrajectoryRecorder, open_archive
    from flyarchive.testing import simulate

    source = tmp_path / "fly.xml"
    source.write_text(_two_bodies())
    model = mujoco.MjModel.from_xml_path(str(source))
    url = str(tmp_path / "run.zarr")
    with TrajectoryRecorder(url, model) as recorder:
        simulate(model, 1, 30, recorder.record_as_needed)

    with pytest.warns(RuntimeWarning, match=r"model_source was not kept: .*flyarchive model "
                                            r"attach"):
        with TrajectoryRecorder(url, model, mode="a", model_source=str(source)) as recorder:
            simulate(model, 1, 60, recorder.record_as_needed)

    assert "portable_model" not in open_archive(url).attrs


def test_resuming_with_the_model_source_the_archive_keeps_warns_of_nothing(tmp_path):
    """Every resume after a crash warned that model_source was not kept, though it was."""
    import warnings

    from flyarchive import TrajectoryRecorder, open_archive
    from flyarchive.testing import simulate

    source = tmp_path / "fly.xml"
    source.write_text(_two_bodies())
    model = mujoco.MjModel.from_xml_path(str(source))
    url = str(tmp_path / "run.zarr")
    with TrajectoryRecorder(url, model, model_source=str(source)) as recorder:
        simulate(model, 1, 30, recorder.record_as_needed)
    kept = open_archive(url).attrs["portable_model"]

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with TrajectoryRecorder(url, model, mode="a", model_source=str(source)) as recorder:
            simulate(model, 1, 60, recorder.record_as_needed)

    assert open_archive(url).attrs["portable_model"] == kept

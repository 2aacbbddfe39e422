"""The portable form of a kept model (a MuJoCo spec zip beside the archive's MJB): how it
is made, kept, compiled once per MuJoCo release and checked, and what names the model.

"Another release" is this one reading an archive whose MJB says another release wrote
it (its header edited: :func:`flyarchive.testing.spec_zips.as_another_release`), which it
cannot load, as MuJoCo 4.0.1 cannot load 3.16's. Bad portable models:
tests/bad_input/test_portable_model.py; the cache that keeps compiled models:
tests/models/test_check_cache.py."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path

import mujoco
import numpy as np
import pytest

import flyarchive
from flyarchive.models import (
    MODEL_ATTR,
    PORTABLE_MODEL_ATTR,
    compile_spec_zip,
    model_bytes,
    model_identity,
    portable_model,
)
from flyarchive.lru import LRUCache
from flyarchive.models import check as model_check
from flyarchive.models.spec_zip import read_spec_zip
from flyarchive.testing import TINY_XML, write_meshed_model
from flyarchive.testing.fixtures import copy_archive, record
from flyarchive.testing.spec_zips import as_another_release, kept_file

pytestmark = pytest.mark.timeout(180)

A, B = "a" * 64, "b" * 64
#: Arrays compared between two compiles of one model (the names of its files aside).
SAME = ("qpos0", "body_pos", "body_quat", "body_mass", "geom_pos", "geom_quat", "geom_size",
        "mesh_vert", "mesh_face", "tex_data", "cam_pos", "cam_quat", "jnt_axis")


@pytest.fixture(scope="module")
def meshed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a mesh and a texture in files under ``assets/`` (its MJCF's path)."""
    return write_meshed_model(tmp_path_factory.mktemp("meshed"))


@pytest.fixture(scope="module")
def recorded(meshed: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """An archive of the meshed model that keeps its portable form, recorded once."""
    model = mujoco.MjModel.from_xml_path(str(meshed))
    return record(model, str(tmp_path_factory.mktemp("portable") / "run.zarr"),
                  model_source=meshed)


@pytest.fixture
def archive(recorded: str, tmp_path: Path) -> str:
    return copy_archive(recorded, tmp_path / "run.zarr")


def _forget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing known in this process (as in a new one)."""
    monkeypatch.setattr(model_check, "_KNOWN", LRUCache(model_check.MAX_VERDICTS_HERE))
    monkeypatch.setattr(model_check, "_COMPILED", LRUCache(model_check.MAX_COMPILED_HERE))


def _assert_same_model(actual: mujoco.MjModel, expected: mujoco.MjModel) -> None:
    for name in SAME:
        np.testing.assert_array_equal(getattr(actual, name), getattr(expected, name), err_msg=name)


# ----------------------------------------------------------------------------- identity
@pytest.mark.parametrize(("attrs", "expected"), [
    ({MODEL_ATTR: {"sha256": A, "size": 1}, PORTABLE_MODEL_ATTR: {"sha256": B, "size": 2}}, B),
    ({MODEL_ATTR: {"sha256": A, "size": 1}}, A),
    ({PORTABLE_MODEL_ATTR: {"sha256": B, "size": 2}}, B),
    ({}, None),
], ids=["both forms: the portable one", "an MJB only", "a portable form only", "no model"])
def test_the_model_identity_is_the_portable_form_when_kept_else_the_mjb(attrs, expected):
    actual = model_identity(attrs)

    assert actual == expected


@pytest.mark.parametrize("damaged", [{"sha256": "B" * 64}, {"sha256": 5}, "b" * 64, None])
def test_a_damaged_portable_entry_does_not_name_the_model(damaged):
    attrs = {MODEL_ATTR: {"sha256": A, "size": 1}, PORTABLE_MODEL_ATTR: damaged}

    actual = model_identity(attrs)

    assert actual == A


# ----------------------------------------------------------------------------- making it
def test_an_mjcf_file_is_kept_with_every_file_it_references_under_relative_names(meshed):
    kept = portable_model(meshed)

    files = read_spec_zip(kept.blob)
    assert kept.files == ("meshes/shell.obj", "model.xml", "textures/grid.png")
    assert files.assets["meshes/shell.obj"] == (meshed.parent / "assets" / "shell.obj").read_bytes()
    assert b'file="meshes/shell.obj"' in files.xml and b"meshdir" not in files.xml
    assert kept.sha256 == hashlib.sha256(kept.blob).hexdigest() and kept.exact


def test_the_zip_is_written_byte_for_byte_the_same_sorted_with_fixed_timestamps(meshed):
    first, second = portable_model(meshed), portable_model(meshed)

    infos = zipfile.ZipFile(io.BytesIO(first.blob)).infolist()
    assert first.blob == second.blob
    assert [i.filename for i in infos] == sorted(i.filename for i in infos)
    assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
    assert not any(i.filename.startswith("/") or ".." in i.filename for i in infos)


def test_the_zip_of_an_mjcf_compiles_to_the_very_model_of_the_file(meshed):
    expected = mujoco.MjModel.from_xml_path(str(meshed))

    kept = portable_model(meshed)

    _assert_same_model(compile_spec_zip(kept.blob), expected)
    _assert_same_model(mujoco.MjSpec.from_zip(io.BytesIO(kept.blob)).compile(), expected)


def test_an_mjspec_is_kept_as_mujocos_xml_and_is_not_changed(meshed):
    spec = mujoco.MjSpec.from_file(str(meshed))
    expected = mujoco.MjModel.from_xml_path(str(meshed))

    kept = portable_model(spec, model=expected)

    compiled = compile_spec_zip(kept.blob)
    assert spec.meshdir == "assets" and spec.meshes[0].file == "shell.obj"
    assert kept.files == ("meshes/shell.obj", "model.xml", "textures/grid.png") and not kept.exact
    np.testing.assert_allclose(compiled.geom_pos, expected.geom_pos, rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(compiled.mesh_vert, expected.mesh_vert)


def test_a_spec_zip_flyarchive_wrote_is_kept_as_the_same_bytes(meshed, tmp_path):
    kept = portable_model(meshed)
    (tmp_path / "fly.mjz").write_bytes(kept.blob)

    again = portable_model(tmp_path / "fly.mjz")

    assert again.blob == kept.blob


def test_included_files_are_written_into_the_kept_mjcf(tmp_path):
    body = TINY_XML.split("<worldbody>")[1].split("</worldbody>")[0]
    (tmp_path / "body.xml").write_text(f"<mujoco><worldbody>{body}</worldbody></mujoco>")
    main = TINY_XML.replace(f"<worldbody>{body}</worldbody>",
                            '<include file="body.xml"/>')
    (tmp_path / "main.xml").write_text(main)
    expected = mujoco.MjModel.from_xml_path(str(tmp_path / "main.xml"))

    kept = portable_model(tmp_path / "main.xml")

    assert b"include" not in read_spec_zip(kept.blob).xml and kept.files == ("model.xml",)
    _assert_same_model(compile_spec_zip(kept.blob), expected)


def test_two_files_of_one_name_are_both_kept_and_keep_their_names(tmp_path):
    for folder, scale in (("a", 1), ("b", 2)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "shell.obj").write_text(
            "".join(f"v {scale * x} {y} {z}\n" for x in (-1, 1) for y in (-1, 1) for z in (-1, 1))
            + "f 1 3 4\nf 1 4 2\nf 5 6 8\nf 5 8 7\nf 1 2 6\nf 1 6 5\n"
              "f 3 7 8\nf 3 8 4\nf 1 5 7\nf 1 7 3\nf 2 4 8\nf 2 8 6\n")
    (tmp_path / "two.xml").write_text(
        '<mujoco><asset><mesh file="a/shell.obj"/><mesh name="big" file="b/shell.obj"/></asset>'
        '<worldbody><body><joint type="hinge"/><geom type="mesh" mesh="shell"/>'
        '<geom type="mesh" mesh="big"/></body></worldbody></mujoco>')
    expected = mujoco.MjModel.from_xml_path(str(tmp_path / "two.xml"))

    kept = portable_model(tmp_path / "two.xml")

    assert len(kept.files) == 3 and "meshes/shell.obj" in kept.files
    _assert_same_model(compile_spec_zip(kept.blob), expected)


# ----------------------------------------------------------------------------- keeping it
def test_a_recorder_keeps_both_forms_and_the_portable_one_names_the_model(archive, meshed):
    model = mujoco.MjModel.from_xml_path(str(meshed))
    attrs = json.loads((Path(archive) / "zarr.json").read_text())["attributes"]

    entry = attrs[PORTABLE_MODEL_ATTR]
    blob = kept_file(archive, PORTABLE_MODEL_ATTR).read_bytes()
    assert entry["sha256"] == hashlib.sha256(blob).hexdigest() == model_identity(attrs)
    assert entry["path"] == f"models/{entry['sha256']}.mjz" and entry["format"] == "mujoco-spec-zip"
    assert entry["exact"] is True and entry["mujoco"] == attrs[MODEL_ATTR]["mujoco"]
    assert entry["qpos0"] == model.qpos0.tolist() and entry["bodies"][1] == "torso"
    assert kept_file(archive).read_bytes() == model_bytes(model)


def test_on_the_recording_release_the_mjb_is_the_model(archive, meshed, monkeypatch):
    monkeypatch.setattr(model_check, "compile_in_child",
                        lambda *a, **k: pytest.fail("compiled on the recording release"))

    model = flyarchive.load_kept_model(archive)

    assert model_bytes(model) == kept_file(archive).read_bytes()


def test_another_release_compiles_the_portable_form_to_the_same_positions(archive, recorded):
    as_another_release(archive)
    bodies = ["torso", "hand", "target"]

    actual = flyarchive.positions(archive, bodies=bodies, worlds=[1])
    expected = flyarchive.positions(recorded, bodies=bodies, worlds=[1])

    np.testing.assert_array_equal(actual.values, expected.values)


def test_another_release_compiles_the_portable_form_once(archive, meshed, monkeypatch):
    as_another_release(archive)
    sha = json.loads((Path(archive) / "zarr.json").read_text())["attributes"][PORTABLE_MODEL_ATTR][
        "sha256"]
    runs = []
    real = model_check.compile_in_child
    monkeypatch.setattr(model_check, "compile_in_child",
                        lambda *a, **k: runs.append(a[1]) or real(*a, **k))
    first = flyarchive.load_kept_model(archive)
    _forget(monkeypatch)

    again = flyarchive.load_kept_model(archive)

    assert len(runs) <= 1 and model_check.compiled_path(sha).is_file()  # 0: an earlier test did
    assert model_bytes(again) == model_bytes(first) == model_check.compiled_path(sha).read_bytes()
    _assert_same_model(again, mujoco.MjModel.from_xml_path(str(meshed)))


def test_verify_checks_the_portable_form_on_the_recording_release_and_another(archive):
    on_this = flyarchive.verify(archive)
    as_another_release(archive)

    on_another = flyarchive.verify(archive)

    assert on_this.ok and on_this.problems == []
    assert on_another.ok and on_another.problems == []


def test_positions_kept_beside_or_apart_from_an_archive_with_a_portable_form_verify_clean(
        archive, tmp_path):
    beside = flyarchive.keep_positions(archive, ["torso", "hand"])
    apart = flyarchive.keep_positions(archive, "hand", to=str(tmp_path / "positions.zarr"))

    reports = {url: flyarchive.verify(url) for url in (archive, beside, apart)}

    assert {url: r.problems for url, r in reports.items() if not r.ok} == {}
    for url in (beside, apart):  # they keep no model, and name none
        assert PORTABLE_MODEL_ATTR not in flyarchive.open_positions(url).attrs


def test_positions_kept_by_a_release_that_copied_the_portable_entry_verify_clean(archive):
    """Derived groups kept by earlier flyarchive copied their archive's ``portable_model``, which
    names an object of the archive, not of the group: verify read it as the group's own."""
    import zarr

    beside = flyarchive.keep_positions(archive, "hand")
    entry = zarr.open_group(archive, mode="r").attrs[PORTABLE_MODEL_ATTR]
    zarr.open_group(beside, mode="r+").attrs[PORTABLE_MODEL_ATTR] = entry

    report = flyarchive.verify(archive)

    assert report.ok, report.problems


def test_the_same_mjcf_kept_by_two_recordings_has_one_identity(archive, meshed, tmp_path):
    model = mujoco.MjModel.from_xml_path(str(meshed))
    other = record(model, str(tmp_path / "other.zarr"), n_steps=8, model_source=meshed)

    ours, theirs = (json.loads((Path(u) / "zarr.json").read_text())["attributes"]
                    for u in (archive, other))

    assert model_identity(ours) == model_identity(theirs)


def test_a_recorder_given_a_spec_keeps_mujocos_xml_of_it(meshed, tmp_path):
    model = mujoco.MjModel.from_xml_path(str(meshed))
    url = record(model, str(tmp_path / "spec.zarr"), n_steps=8,
                 model_source=mujoco.MjSpec.from_file(str(meshed)))
    as_another_release(url)

    replayed = flyarchive.load_kept_model(url)

    entry = json.loads((Path(url) / "zarr.json").read_text())["attributes"][PORTABLE_MODEL_ATTR]
    assert entry["exact"] is False and replayed.nq == model.nq
    np.testing.assert_allclose(replayed.body_pos, model.body_pos, rtol=1e-6)

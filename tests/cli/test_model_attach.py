"""``flyarchive model attach`` (and ``flyarchive.attach_model``): an archive that keeps its
model only as an MJB of another MuJoCo release is rescued by keeping a portable model
beside it; nothing else changes and ``verify`` passes; ``flyarchive info`` shows the forms
kept and the releases that read them. Refusals: tests/bad_input/test_portable_model.py."""

from __future__ import annotations

import json
from pathlib import Path

import mujoco
import numpy as np
import pytest

import flyarchive
from flyarchive import attach_model, render_frames
from flyarchive.models import PORTABLE_MODEL_ATTR, model_bytes, model_identity, mujoco_release
from flyarchive.testing import TINY_XML
from flyarchive.testing.fixtures import copy_archive, record, snapshot
from flyarchive.testing.spec_zips import as_another_release

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> str:
    from flyarchive.testing import tiny_model

    return record(tiny_model(), str(tmp_path_factory.mktemp("attach") / "run.zarr"))


@pytest.fixture
def elsewhere(recorded: str, tmp_path: Path) -> str:
    """The tiny archive (MJB only) as another MuJoCo release sees it."""
    url = copy_archive(recorded, tmp_path / "run.zarr")
    as_another_release(url)
    return url


@pytest.fixture
def tiny_xml(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.xml"
    path.write_text(TINY_XML)
    return path


def _attrs(url: str) -> dict:
    return json.loads((Path(url) / "zarr.json").read_text())["attributes"]


def test_attach_rescues_an_archive_and_changes_nothing_else(elsewhere, tiny_xml, cli):
    before = snapshot(elsewhere)

    code, out, _ = cli("model", "attach", elsewhere, "--model", tiny_xml)

    after = snapshot(elsewhere)
    entry = _attrs(elsewhere)[PORTABLE_MODEL_ATTR]
    assert code == 0 and f"keeps the portable model {entry['path']}" in out
    assert set(after) - set(before) == {entry["path"]}
    assert [k for k in before if before[k] != after[k]] == ["zarr.json"]
    root_before, root_after = (json.loads(d["zarr.json"]) for d in (before, after))
    del root_after["attributes"][PORTABLE_MODEL_ATTR]
    assert root_after == root_before
    assert flyarchive.verify(elsewhere).ok and model_identity(_attrs(elsewhere)) == entry["sha256"]


def test_a_rescued_archive_renders_the_frames_of_the_original(elsewhere, recorded, tiny_xml):
    attach_model(elsewhere, tiny_xml)

    actual = render_frames(elsewhere, None, "front", worlds=[0], size=(48, 64)).values
    expected = render_frames(recorded, None, "front", worlds=[0], size=(48, 64)).values

    assert actual.shape == expected.shape and actual.shape[1] == 20 and expected.any()
    np.testing.assert_array_equal(actual, expected)


def test_attach_keeps_the_recorded_bodies_and_qpos0_where_the_mjb_tells(recorded, tiny_xml,
                                                                       tmp_path):
    url = copy_archive(recorded, tmp_path / "here.zarr")  # this release's MJB

    entry = attach_model(url, tiny_xml)

    tiny = mujoco.MjModel.from_xml_string(TINY_XML)
    assert entry["qpos0"] == tiny.qpos0.tolist() and entry["bodies"][:3] == ["world", "torso", "arm"]
    assert model_bytes(flyarchive.load_kept_model(url)) == model_bytes(tiny)  # the MJB, still


def test_attach_of_the_model_kept_already_writes_nothing(elsewhere, tiny_xml):
    first = attach_model(elsewhere, tiny_xml)
    before = snapshot(elsewhere)

    again = attach_model(elsewhere, tiny_xml)

    assert again["sha256"] == first["sha256"] and snapshot(elsewhere) == before


def test_attach_to_an_archive_that_keeps_no_model(tiny, tiny_xml, tmp_path):
    url = record(tiny, str(tmp_path / "bare.zarr"), n_steps=8, store_model=False)

    attach_model(url, tiny_xml)

    root = json.loads((Path(url) / "zarr.json").read_text())
    assert "models" in root["consolidated_metadata"]["metadata"]
    assert flyarchive.verify(url).ok
    assert flyarchive.load_kept_model(url).nq == tiny.nq


def test_info_shows_the_forms_kept_and_the_releases_that_read_them(elsewhere, tiny_xml, cli):
    _, before, _ = cli("info", elsewhere)
    attach_model(elsewhere, tiny_xml)

    _, after, _ = cli("info", elsewhere)

    lines = dict(line.split(None, 1) for line in after.splitlines())
    assert "MuJoCo 3.15.0 only" in before and "flyarchive model attach" in before
    assert lines["model"].startswith("MJB models/") and "bound to MuJoCo 3.15.0" in lines["model"]
    assert lines["portable_model"].startswith("models/") and "the MJCF's own text" in lines[
        "portable_model"] and f"written by MuJoCo {mujoco_release()}" in lines["portable_model"]
    assert lines["model_readable_on"].startswith("any MuJoCo release")


def test_info_json_names_the_portable_model(elsewhere, tiny_xml, cli):
    entry = attach_model(elsewhere, tiny_xml)

    _, out, _ = cli("info", elsewhere, "--json")

    info = json.loads(out)
    assert info["portable_model"]["sha256"] == entry["sha256"]
    assert "qpos0" not in info["portable_model"] and info["model"]["mujoco"] == "3.15.0"


def test_attach_and_replay_on_s3(tiny, tiny_xml, s3_location):
    url, options = s3_location.url, s3_location.storage_options
    record(tiny, url, n_steps=8, store_model=False, storage_options=options)

    attach_model(url, tiny_xml, storage_options=options)

    model = flyarchive.load_kept_model(url, options)  # the portable model: no MJB is kept
    assert model.nq == tiny.nq and flyarchive.verify(url, options).ok


def test_cli_attach_of_another_model_is_one_line(elsewhere, tmp_path, cli):
    other = tmp_path / "two.xml"
    other.write_text("<mujoco><worldbody><body><joint type='hinge'/><geom size='.1'/></body>"
                     "</worldbody></mujoco>")
    before = snapshot(elsewhere)

    code, _, err = cli("model", "attach", elsewhere, "--model", other)

    assert code == 2 and err.count("\n") == 1 and err.startswith("flyarchive model: error: ")
    assert "does not fit the archive" in err and "Nothing was written" in err
    assert snapshot(elsewhere) == before


def test_import_npz_with_an_mjcf_model_keeps_its_portable_form(recorded, tiny_xml, tmp_path, cli):
    cli("export-npz", recorded, "--to", tmp_path / "npz")

    code, _, err = cli("import-npz", tmp_path / "npz", "--to", tmp_path / "in.zarr",
                       "--model", tiny_xml)

    attrs = _attrs(str(tmp_path / "in.zarr"))
    assert code == 0, err
    assert attrs[PORTABLE_MODEL_ATTR]["exact"] is True and "model" in attrs
    assert model_identity(attrs) == attrs[PORTABLE_MODEL_ATTR]["sha256"]


def test_attach_with_replace_keeps_the_new_model_and_deletes_the_old(elsewhere, tiny_xml, tmp_path,
                                                                    cli):
    from flyarchive.testing import write_meshed_model

    old = attach_model(elsewhere, tiny_xml)
    meshed = write_meshed_model(tmp_path / "meshed")  # the same layout, another model

    code, _, err = cli("model", "attach", elsewhere, "--model", meshed, "--replace")

    new = _attrs(elsewhere)[PORTABLE_MODEL_ATTR]
    assert code == 0, err
    assert new["sha256"] != old["sha256"] and (Path(elsewhere) / new["path"]).is_file()
    assert not (Path(elsewhere) / old["path"]).exists()
    assert flyarchive.load_kept_model(elsewhere).nmesh == 1 and flyarchive.verify(elsewhere).ok

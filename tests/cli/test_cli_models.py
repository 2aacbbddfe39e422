"""The command line's stored models (info, render without --model, import-npz
--no-store-model), set-world-var, and render --where-world-var / --where-dof."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import mujoco
import numpy as np
import pytest

from flyarchive import open_archive
from flyarchive.cli.args import parse_world_var
from flyarchive.models import model_bytes
from flyarchive.testing import SLIDER_XML
from flyarchive.testing.fixtures import record, slider_archive

RENDER = ["--camera", "front", "--size", "48x64", "--workers", "0", "--quiet"]


@pytest.fixture
def archive(tiny, tmp_path: Path) -> str:
    """3 tiny worlds, 4 frames each."""
    return record(tiny, str(tmp_path / "run.zarr"), n_worlds=3, n_steps=12)


def test_info_shows_the_kept_model(tiny, archive, cli):
    blob = model_bytes(tiny)

    code, out, _ = cli("info", archive, "--json")

    model = json.loads(out)["model"]
    assert (code, model["sha256"], model["size"], model["mujoco"]) == (
        0, hashlib.sha256(blob).hexdigest(), len(blob), mujoco.__version__)


def test_info_text_names_the_kept_models_hash_size_and_mujoco(tiny, archive, cli):
    blob = model_bytes(tiny)  # 13.0 kB on MuJoCo 3.16, 13.1 kB on 4.0.1
    digest, size = hashlib.sha256(blob).hexdigest(), f"{len(blob) / 1e3:.1f} kB"

    _, out, _ = cli("info", archive)

    line = next(line for line in out.splitlines() if line.startswith("model "))
    assert digest[:16] in line and size in line and f"MuJoCo {mujoco.__version__}" in line


def test_info_says_when_no_model_is_kept(tiny, tmp_path, cli):
    url = record(tiny, str(tmp_path / "bare.zarr"), n_steps=12, store_model=False)

    code, out, _ = cli("info", url)

    assert code == 0 and "none: no model is kept (render needs --model)" in out


def test_render_without_model_uses_the_kept_one(archive, tmp_path, cli):
    code, _, _ = cli("render", archive, *RENDER, "--worlds", "2", "--out", tmp_path / "v")

    assert (code, (tmp_path / "v" / "world00002" / "front.mp4").is_file()) == (0, True)


def test_import_npz_without_storing_the_model(archive, model_xml, tmp_path, cli):
    cli("export-npz", archive, "--to", tmp_path / "npz")

    code, _, _ = cli("import-npz", tmp_path / "npz", "--to", tmp_path / "back.zarr",
                     "--model", model_xml, "--no-store-model")

    assert code == 0 and "model" not in open_archive(str(tmp_path / "back.zarr")).attrs


def test_import_npz_keeps_the_model(archive, model_xml, tmp_path, cli):
    cli("export-npz", archive, "--to", tmp_path / "npz")

    cli("import-npz", tmp_path / "npz", "--to", tmp_path / "back.zarr", "--model", model_xml)

    back, recorded = (open_archive(u).attrs["model"] for u in (str(tmp_path / "back.zarr"),
                                                                 archive))
    assert back["sha256"] == recorded["sha256"]


def test_set_world_var_adds_variables(archive, cli):
    code, out, _ = cli("set-world-var", archive, "success=1,0,1", "ok=true,false,true",
                       "reward=0.5,nan,2")

    ds = open_archive(archive)
    assert code == 0 and "set success, ok, reward" in out
    assert (ds.success.values.tolist(), ds.ok.values.tolist()) == ([1, 0, 1], [True, False, True])
    np.testing.assert_array_equal(ds.reward.values, [0.5, np.nan, 2.0])


def test_set_world_var_reads_values_from_a_file(archive, tmp_path, cli):
    np.save(tmp_path / "seeds.npy", np.array([3, 4, 5], dtype=np.int32))
    (tmp_path / "gain.json").write_text("[0.1, 0.2, 0.3]")

    cli("set-world-var", archive, f"seed=@{tmp_path / 'seeds.npy'}",
        f"gain=@{tmp_path / 'gain.json'}")

    ds = open_archive(archive)
    assert (str(ds.seed.dtype), ds.gain.values.tolist()) == ("int32", [0.1, 0.2, 0.3])


def test_set_world_var_overwrite_replaces_values(archive, cli):
    cli("set-world-var", archive, "success=1,0,1")

    code, _, _ = cli("set-world-var", archive, "success=0,0,1", "--overwrite")

    assert (code, open_archive(archive).success.values.tolist()) == (0, [0, 0, 1])


def test_render_where_world_var_renders_only_matching_worlds(archive, tmp_path, cli):
    cli("set-world-var", archive, "success=1,0,1")

    code, _, _ = cli("render", archive, *RENDER, "--where-world-var", "success=1",
                     "--out", tmp_path / "v")

    assert code == 0
    assert sorted(p.name for p in (tmp_path / "v").iterdir() if p.is_dir()) == [
        "world00000", "world00002"]


def test_a_where_world_var_matching_none_of_the_chosen_worlds_names_both(archive, tmp_path, cli):
    cli("set-world-var", archive, "success=1,0,1")

    code, _, err = cli("render", archive, *RENDER, "--where-world-var", "success=1",
                       "--worlds", "1", "--out", tmp_path / "v")

    assert code == 2
    assert "selects none of the chosen worlds ([1] (1 world); it selects [0, 2] (2 worlds)" in err
    assert not (tmp_path / "v").exists()


def test_render_where_conditions_all_hold(archive, tmp_path, cli):
    cli("set-world-var", archive, "success=1,0,1", "reward=3,1,0.5")

    cli("render", archive, *RENDER, "--where-world-var", "success=1",
        "--where-world-var", "reward>=1", "--out", tmp_path / "v")

    assert sorted(p.name for p in (tmp_path / "v").iterdir() if p.is_dir()) == ["world00000"]


def test_render_where_dof_writes_a_video_per_padded_window(tmp_path, cli):
    qpos = np.zeros((1, 30, 1))
    qpos[0, 3:6] = qpos[0, 20:23] = 1.0
    url = slider_archive(str(tmp_path / "slider.zarr"), qpos)
    model = tmp_path / "slider.xml"
    model.write_text(SLIDER_XML)

    code, _, _ = cli("render", url, *RENDER, "--model", model, "--where-dof", "x>0.5",
                     "--pad", "0.01", "--out", tmp_path / "v")

    assert code == 0
    assert sorted(p.name for p in (tmp_path / "v" / "world00000").iterdir()) == [
        "front.frames000002-000007.mp4", "front.frames000019-000024.mp4"]


@pytest.mark.parametrize(("text", "expected"), [
    ("success=1,0,1", np.array([1, 0, 1])),
    ("ok=TRUE,false", np.array([True, False])),
    ("r = 0.5, 1e-3", np.array([0.5, 1e-3])),
])
def test_world_variable_values_parse(text, expected):
    name, values = parse_world_var(text)

    assert name == text.split("=")[0].strip()
    np.testing.assert_array_equal(values, expected)
    assert values.dtype == expected.dtype


def test_set_world_var_refuses_a_name_given_twice(archive, cli):
    from flyarchive.testing.fixtures import snapshot

    before = snapshot(archive)

    code, _, err = cli("set-world-var", archive, "gain=1,2,3", "gain=4,5,6")

    assert code == 2 and "['gain'] are given more than once" in err
    assert snapshot(archive) == before


@pytest.mark.parametrize("text, said", [
    ("n=99999999999999999999,1,2", "a whole number is beyond 64 bits"),
    ("n=-99999999999999999999,1,2", "a whole number is beyond 64 bits"),
    ("m=1e400,1,2", "'1e400' is beyond what a 64-bit float holds"),
])
def test_set_world_var_refuses_numbers_too_large_to_store(archive, cli, text, said):
    from flyarchive.testing.fixtures import snapshot

    before = snapshot(archive)

    code, _, err = cli("set-world-var", archive, text)

    assert code == 2 and said in err and "Traceback" not in err
    assert snapshot(archive) == before
    assert parse_world_var("m=inf,1,2")[1][0] == np.inf  # infinity said as such is kept

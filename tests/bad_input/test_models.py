"""Bad input to models kept by content, world variables and where masks: each case fails
with a clear error, writes no video, and leaves the archive byte for byte as it was."""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from pathlib import Path
from typing import Any

import mujoco
import numpy as np
import pytest
import xarray as xr

from flyarchive import TrajectoryRecorder, add_world_vars, open_archive
from flyarchive.distribute.api import RenderOptions, render_videos
from flyarchive.distribute.frames import render_frames
from flyarchive.errors import (
    ArchiveInUseError,
    CorruptArchiveError,
    ModelLoadError,
    OutputExistsError,
    SchemaError,
    SelectionError,
    UnsafeFileError,
)
from flyarchive.models import load_model_file, model_bytes, mujoco_release
from flyarchive.testing import TINY_XML, simulate
from flyarchive.testing.fixtures import snapshot

SMALL = RenderOptions(size=(48, 64), segment_frames=8)


def render(url: str, out: Path, **kwargs: Any) -> Any:
    return render_videos(url, kwargs.pop("model", None), "front", str(out), options=SMALL,
                         n_workers=0, **kwargs)


def kept(url: str) -> Path:
    """The file of the model kept beside a local archive."""
    return Path(url) / json.loads((Path(url) / "zarr.json").read_text())["attributes"]["model"]["path"]


def another_release(blob: bytes, version: int = 3015000) -> bytes:
    """MJB bytes whose header says another MuJoCo release wrote them."""
    return blob[:12] + struct.pack("<i", version) + blob[16:]


def rename_kept(url: str, blob: bytes) -> None:
    """Put ``blob`` in place of the kept model, named (and recorded) by its own hash."""
    root = json.loads((Path(url) / "zarr.json").read_text())
    old = Path(url) / root["attributes"]["model"]["path"]
    digest = hashlib.sha256(blob).hexdigest()
    root["attributes"]["model"].update(sha256=digest, size=len(blob),
                                       path=f"models/{digest}.mjb")
    old.unlink()
    (old.parent / f"{digest}.mjb").write_bytes(blob)
    (Path(url) / "zarr.json").write_text(json.dumps(root))


# ----------------------------------------------------------------------------- where masks
@pytest.mark.parametrize(("mask", "fragment"), [
    (lambda ds: ds.qpos > 0, r"has dims \('world', 'time', 'dof'\); it must be over"),
    (lambda ds: xr.DataArray([True, True, False], dims="world", coords={"world": [0, 1, 9]}),
     r"and \[9\] are not in the archive, which has world ids \[0, 1\]"),
    (lambda ds: xr.DataArray([[True]], dims=("world", "time"),
                             coords={"world": [0], "time": [5.0]}),
     r"1 of them \(first 5 s\) are not times of the archive's frames, which span 0\.\.0\.152 s"),
    (lambda ds: xr.DataArray([True, False, True], dims="world"),
     r"has 3 entries along 'world' and no 'world' coordinate; the archive has 2"),
    (lambda ds: ds.qpos.sel(dof="root/x"), r"has dtype float64; it must be bool"),
    (lambda ds: [True, False], r"must be an xarray DataArray computed from the archive"),
])
def test_a_where_mask_that_does_not_match_the_archive_is_refused(archive, tmp_path, mask,
                                                                 fragment):
    before = snapshot(archive)

    with pytest.raises(SelectionError, match=fragment):
        render(archive, tmp_path / "videos", where=mask(open_archive(archive)))

    assert snapshot(archive) == before and not (tmp_path / "videos").exists()


def test_a_negative_pad_is_refused(archive, tmp_path):
    before = snapshot(archive)
    where = open_archive(archive).qpos.sel(dof="root/x") > 0

    with pytest.raises(SelectionError, match="pad must be a number of simulated seconds of at "
                                             "least 0, got -1"):
        render(archive, tmp_path / "videos", where=where, pad=-1)

    assert snapshot(archive) == before and not (tmp_path / "videos").exists()


def test_a_mask_that_selects_nothing_is_refused(archive, tmp_path):
    before = snapshot(archive)
    where = open_archive(archive).qpos.sel(dof="root/x") > 1e9

    with pytest.raises(SelectionError, match=r"selects no committed frame of the chosen worlds "
                                             r"\(\d+ worlds?\) in their recording\. Check"):
        render(archive, tmp_path / "videos", where=where)

    assert snapshot(archive) == before and not (tmp_path / "videos").exists()


# ----------------------------------------------------------------------------- kept models
def test_a_kept_model_whose_bytes_do_not_hash_to_its_name_is_refused(archive, tmp_path):
    path = kept(archive)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40  # MuJoCo itself would load this without a word
    path.write_bytes(bytes(data))
    before = snapshot(archive)

    with pytest.raises(CorruptArchiveError) as err:
        render(archive, tmp_path / "videos")

    message = str(err.value)
    assert f"{path}" in message and path.stem in message
    assert hashlib.sha256(bytes(data)).hexdigest() in message
    assert snapshot(archive) == before and not (tmp_path / "videos").exists()


def test_a_missing_kept_model_is_refused(archive, tmp_path):
    kept(archive).unlink()
    before = snapshot(archive)

    with pytest.raises(CorruptArchiveError, match="names the stored model .* but there is no "
                                                  "object"):
        render_frames(archive, None, "front", size=(48, 64))

    assert snapshot(archive) == before


def test_a_kept_model_of_another_mujoco_release_is_refused(archive, tmp_path):
    rename_kept(archive, another_release(kept(archive).read_bytes()))
    before = snapshot(archive)

    with pytest.raises(ModelLoadError, match=r"keeps its model only as a compiled MJB of MuJoCo "
                                             r"3\.15\.0, which MuJoCo "
                                             rf"{mujoco_release()} cannot read.* flyarchive model "
                                             r"attach .* --model fly\.xml .*install "
                                             r"mujoco==3\.15\.0"):
        render(archive, tmp_path / "videos")

    assert snapshot(archive) == before and not (tmp_path / "videos").exists()


def test_rendering_an_archive_that_keeps_no_model_asks_for_one(bare, tmp_path):
    url = bare
    before = snapshot(url)

    with pytest.raises(ModelLoadError, match="keeps no model .*store_model=False.* Pass the "
                                             "compiled model"):
        render(url, tmp_path / "videos")

    assert snapshot(url) == before and not (tmp_path / "videos").exists()


def test_cli_render_without_model_of_an_archive_that_keeps_none_is_one_line(bare, tmp_path, cli):
    url = bare
    before = snapshot(url)

    code, _, err = cli("render", url, "--camera", "front", "--out", tmp_path / "videos",
                       "--workers", "0")

    assert code == 2 and err.startswith("flyarchive render: error: ") and err.count("\n") == 1
    assert "--model FILE" in err
    assert snapshot(url) == before and not (tmp_path / "videos").exists()


def test_a_kept_model_that_is_a_link_out_of_the_archive_is_refused(archive, tmp_path):
    path = kept(archive)
    outside = tmp_path / "elsewhere.mjb"
    outside.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(outside)
    before = snapshot(archive)

    with pytest.raises(UnsafeFileError, match="leads out of the archive"):
        render(archive, tmp_path / "videos")

    assert snapshot(archive) == before and not (tmp_path / "videos").exists()


def test_a_kept_model_that_is_a_fifo_is_refused_without_blocking(archive, tmp_path):
    path = kept(archive)
    path.unlink()
    os.mkfifo(path)
    before = snapshot(archive)

    with pytest.raises(UnsafeFileError, match="is a FIFO"):
        render(archive, tmp_path / "videos")

    assert snapshot(archive) == before and not (tmp_path / "videos").exists()


def test_a_kept_model_larger_than_a_model_may_be_is_not_read(archive, tmp_path):
    from flyarchive.models.entries import MAX_MODEL_BYTES

    path = kept(archive)
    with open(path, "r+b") as f:
        f.truncate(MAX_MODEL_BYTES + 1)  # sparse: no gigabyte is written, none must be read
    others = {p: p.read_bytes() for p in Path(archive).rglob("*") if p.is_file() and p != path}

    with pytest.raises(UnsafeFileError, match=f"is {MAX_MODEL_BYTES + 1} bytes, more than"):
        render(archive, tmp_path / "videos")

    assert {p: p.read_bytes() for p in Path(archive).rglob("*") if p.is_file() and p != path} \
        == others and path.stat().st_size == MAX_MODEL_BYTES + 1
    assert not (tmp_path / "videos").exists()


# ----------------------------------------------------------------------------- model files
@pytest.mark.parametrize(("content", "fragment"), [
    (lambda blob: TINY_XML.encode(), r"is not a compiled MuJoCo model \(.mjb\): it does not start "
                                     r"with the MJB id 54321 .*it looks like MJCF XML"),
    (lambda blob: blob[: len(blob) // 2], "could not load .*Truncated model file"),
    (lambda blob: another_release(blob), r"was compiled by MuJoCo 3\.15\.0"),
    (lambda blob: b"", "is not a compiled MuJoCo model"),
])
def test_a_model_file_that_is_not_an_mjb_of_this_mujoco_is_refused_without_a_log_file(
        tiny, tmp_path, monkeypatch, content, fragment):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "bad.mjb"
    path.write_bytes(content(model_bytes(tiny)))

    with pytest.raises(ModelLoadError, match=fragment):
        load_model_file(path)

    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()


def test_cli_render_with_a_model_file_that_is_not_an_mjb_is_one_line(archive, tmp_path, cli):
    (tmp_path / "model.mjb").write_text(TINY_XML)
    before = snapshot(archive)

    code, _, err = cli("render", archive, "--model", tmp_path / "model.mjb", "--camera", "front",
                       "--out", tmp_path / "videos", "--workers", "0")

    assert code == 2 and "is not a compiled MuJoCo model" in err and err.count("\n") == 1
    assert snapshot(archive) == before and not (tmp_path / "videos").exists()


# ----------------------------------------------------------------------------- world variables
@pytest.mark.parametrize(("variables", "error", "fragment"), [
    ({"success": [1, 0, 1]}, SchemaError, r"has shape \(3,\); .* has 2 worlds .*needs shape \(2,\)"),
    ({"time": [1, 0]}, SchemaError, "World variable name 'time' cannot be used"),
    ({"models": [1, 0]}, SchemaError, "World variable name 'models' cannot be used"),
    ({"derived": [1, 0]}, SchemaError, "World variable name 'derived' cannot be used"),
    ({"a/b": [1, 0]}, SchemaError, "World variable name 'a/b' cannot be used"),
    ({"note": np.array(["a", None], dtype=object)}, SchemaError,
     r"'note' cannot be stored: it has dtype object \(Python objects\)\. World variables hold "
     r"bools, numbers or text"),
    ({"note": [b"good", b"bad"]}, SchemaError, r"dtype \|S4 \(bytes\)"),
    ({"note": "good"}, SchemaError, r"'note' is the single value 'good'; it must be 2 values"),
    ({"note": ["ok", "\ud800"]}, SchemaError, r"text that is not valid Unicode"),
    ({"note": ["wt", 1]}, SchemaError, r"'note' cannot be stored: it mixes text with 1 \(int\)"),
    ({"note": ["x" * (9 << 20), "y" * (9 << 20)]}, SchemaError,
     r"its text is 18,874,380 bytes in 2 values; readers take at most 16,777,216 bytes"),
    ({"z": np.array([1j, 2j])}, SchemaError, r"complex numbers"),
    ({"ok": [1, 0], "success": [[1], [0]]}, SchemaError, r"'success' has shape \(2, 1\)"),
    ({"score": xr.DataArray([1, 2], dims="world", coords={"world": [0, 7]})}, SchemaError,
     r"over world ids \[0, 7\] \(2\); the archive .* has world ids \[0, 1\]"),
    ({}, SchemaError, "must be a non-empty dict"),
])
def test_world_variables_that_cannot_be_stored_are_refused(archive, variables, error, fragment):
    before = snapshot(archive)

    with pytest.raises(error, match=fragment):
        add_world_vars(archive, variables)

    assert snapshot(archive) == before


def test_an_existing_world_variable_is_not_replaced_without_overwrite(archive):
    add_world_vars(archive, {"success": [1, 0]})
    before = snapshot(archive)

    with pytest.raises(OutputExistsError, match="already has the world variable 'success'. Pass "
                                                "overwrite=True"):
        add_world_vars(archive, {"ok": [1, 1], "success": [0, 0]})

    assert snapshot(archive) == before


def test_a_replacement_that_does_not_fit_the_stored_dtype_is_refused(archive):
    add_world_vars(archive, {"seed": [1, 2]})
    before = snapshot(archive)

    with pytest.raises(SchemaError, match="'seed' is stored as int64; .* new float64 values do "
                                          "not fit it exactly"):
        add_world_vars(archive, {"seed": [1.5, 2.0]}, overwrite=True)

    assert snapshot(archive) == before


def test_world_variables_are_refused_while_a_recorder_writes(tiny, tmp_path):
    url = str(tmp_path / "busy.zarr")
    recorder = TrajectoryRecorder(url, tiny, chunk_frames=5)
    simulate(tiny, 2, 24, recorder.record_as_needed)
    before = snapshot(url)

    with pytest.raises(ArchiveInUseError, match="Another writer is writing the archive"):
        add_world_vars(url, {"success": [1, 0]})

    assert snapshot(url) == before
    recorder.close()


@pytest.mark.parametrize(("assignment", "fragment"), [
    ("success=1,x,1", r"'x' is not a number, and other values are"),
    ("genotype=wt,,mutA", r"value 2 is empty"),
    ("success", r"Cannot read the world variable 'success'; write NAME=V1,V2"),
    ("ok=true,1", r"'true' is not a number, and other values are \(true/false only when every "
                  r"value is one"),
    ("=1,2", r"Cannot read the world variable '=1,2'"),
    ("seed=@missing.npy", r"Cannot read the values of 'seed' from '.*missing.npy'"),
])
def test_set_world_var_with_values_it_cannot_read_is_one_line(archive, cli, assignment, fragment):
    before = snapshot(archive)

    code, _, err = cli("set-world-var", archive, assignment)

    assert code == 2 and err.startswith("flyarchive set-world-var: error: ")
    assert err.count("\n") == 1 and re.search(fragment, err)
    assert snapshot(archive) == before


@pytest.mark.parametrize(("condition", "fragment"), [
    ("success=1", r"no world variable 'success'. World variables: none"),
    ("success~1", r"Cannot read the condition --where-world-var 'success~1'"),
])
def test_render_where_world_var_it_cannot_use_is_one_line(archive, tmp_path, cli, condition,
                                                          fragment):
    before = snapshot(archive)

    code, _, err = cli("render", archive, "--camera", "front", "--where-world-var", condition,
                       "--out", tmp_path / "videos", "--workers", "0")

    assert code == 2 and err.count("\n") == 1
    assert re.search(fragment, err)
    assert snapshot(archive) == before and not (tmp_path / "videos").exists()

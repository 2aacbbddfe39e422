"""Bad input to the outputs of a render (maps, mosaics, overlays): each case fails with a
clear error before anything is rendered, writes nothing into the output folder, and
leaves the archive byte for byte as it was."""

from __future__ import annotations

from pathlib import Path

import mujoco
import numpy as np
import pytest

from flyarchive.distribute.api import RenderOptions, render_videos
from flyarchive.distribute.frames import render_frames
from flyarchive.errors import FrameSizeError, RenderOptionsError
from flyarchive.testing.fixtures import snapshot

SIZE = (48, 64)


@pytest.fixture
def before(archive: str) -> dict:
    return snapshot(Path(archive))


def render(archive: str, tiny: mujoco.MjModel, out: Path, **options) -> None:
    render_videos(archive, tiny, "front", str(out),
                  options=RenderOptions(size=options.pop("size", SIZE), **options), n_workers=0)


def test_unknown_output_name_lists_the_outputs(archive, before, tmp_path, tiny):
    with pytest.raises(RenderOptionsError, match="Unknown output 'normals'.*'rgb', 'depth', 'segmentation'"):
        render(archive, tiny, tmp_path / "out", outputs=("rgb", "normals"))

    assert not (tmp_path / "out").exists()
    assert snapshot(Path(archive)) == before


def test_unknown_output_name_in_render_frames_is_refused(archive, before, tiny):
    with pytest.raises(RenderOptionsError, match="Unknown output 'flow'"):
        render_frames(archive, tiny, "front", size=SIZE, outputs=("flow",))

    assert snapshot(Path(archive)) == before


def test_unknown_backend_in_render_frames_lists_the_backends(archive, before, tiny):
    with pytest.raises(RenderOptionsError, match="Unknown backend 'cuda'.*'warp-cpu'"):
        render_frames(archive, tiny, "front", size=SIZE, backend="cuda")

    assert snapshot(Path(archive)) == before


def test_mosaic_of_odd_sized_tiles_is_refused(archive, before, tmp_path, tiny):
    with pytest.raises(FrameSizeError, match="even"):
        render(archive, tiny, tmp_path / "out", size=(47, 64), mosaic=(2, 2))

    assert not (tmp_path / "out").exists()
    assert snapshot(Path(archive)) == before


@pytest.mark.parametrize("mosaic", [(0, 2), (2,), "2by3", (1.5, 2)])
def test_mosaic_that_is_not_two_positive_integers_is_refused(archive, before, tmp_path, tiny, mosaic):
    with pytest.raises(RenderOptionsError, match="mosaic must be \\(rows, cols\\)"):
        render(archive, tiny, tmp_path / "out", mosaic=mosaic)

    assert not (tmp_path / "out").exists()
    assert snapshot(Path(archive)) == before


def test_mosaic_with_maps_is_refused_as_unsupported(archive, before, tmp_path, tiny):
    with pytest.raises(RenderOptionsError, match="A mosaic tiles RGB videos"):
        render(archive, tiny, tmp_path / "out", mosaic=(1, 2), outputs=("rgb", "depth"))

    assert not (tmp_path / "out").exists()
    assert snapshot(Path(archive)) == before


def test_mosaic_of_where_windows_is_refused(archive, before, tmp_path, tiny):
    from flyarchive.query import open_archive

    ds = open_archive(archive)
    where = ds.qpos.isel(dof=0) > float(np.median(ds.qpos.isel(dof=0).values))

    with pytest.raises(RenderOptionsError, match="A mosaic shows its worlds' frames side by side"):
        render_videos(archive, tiny, "front", str(tmp_path / "out"), where=where,
                      options=RenderOptions(size=SIZE, mosaic=(1, 2)), n_workers=0)

    assert not (tmp_path / "out").exists()
    assert snapshot(Path(archive)) == before


def test_overlay_of_a_variable_the_archive_lacks_names_its_variables(archive, before, tmp_path, tiny):
    from flyarchive.store.world_vars import add_world_vars

    add_world_vars(archive, {"success": np.array([1, 0])})
    with_var = snapshot(Path(archive))

    with pytest.raises(RenderOptionsError, match="Cannot overlay 'reward'.*'success'"):
        render(archive, tiny, tmp_path / "out", overlays=("time", "reward"))

    assert not (tmp_path / "out").exists()
    assert snapshot(Path(archive)) == with_var != before


def test_overlay_without_rgb_is_refused(archive, before, tmp_path, tiny):
    with pytest.raises(RenderOptionsError, match="An overlay is burnt into RGB frames"):
        render(archive, tiny, tmp_path / "out", outputs=("depth",), overlays=("time",))

    assert not (tmp_path / "out").exists()
    assert snapshot(Path(archive)) == before


@pytest.mark.parametrize("flag, value, fragment", [
    ("--mosaic", "2by3", "mosaic must be (rows, cols)"),
    ("--outputs", "rgb,normals", "Unknown output 'normals'"),
    ("--overlay", "time,nope", "Cannot overlay 'nope'"),
])
def test_cli_bad_output_flags_exit_2_with_one_line(archive, before, tmp_path, cli, flag, value, fragment):
    code, _, err = cli("render", archive, "--camera", "front", "--size", "48x64", "--out",
                       tmp_path / "out", "--workers", "0", "--quiet", flag, value)

    assert code == 2
    assert err.startswith("flyarchive render: error: ") and fragment in err
    assert not (tmp_path / "out").exists()
    assert snapshot(Path(archive)) == before

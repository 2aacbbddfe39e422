"""Bad selections a user hit: world ids that are bools or named twice, time windows that are
not (start, end) numbers, open ranges past the last world, conditions of the wrong kind,
unknown names (with "did you mean"), a plot of a world without frames, and a damaged chunk
said once. Each case fails with a clear error and changes nothing."""

from __future__ import annotations

import re

import numpy as np
import pytest

from flyarchive import add_world_vars, open_archive
from flyarchive.distribute.api import RenderOptions, render_videos
from flyarchive.distribute.frames import render_frames
from flyarchive.errors import CorruptArchiveError, RenderOptionsError, SelectionError
from flyarchive.interop.npz_export import export_npz
from flyarchive.plot import plot_traces
from flyarchive.query.conditions import where_from_conditions
from flyarchive.recorders.trajectories import read_trajectories
from flyarchive.testing import flip_bits, shard_file
from flyarchive.testing.fixtures import snapshot
from flyarchive.testing.markers import requires_flygym_files

SMALL = RenderOptions(size=(48, 64), segment_frames=8)


def one_line(err: str) -> bool:
    return err.count("\n") == 1


# ----------------------------------------------------------------------------- world ids
@pytest.mark.parametrize(("worlds", "fragment"), [
    ([True], r"worlds=\[True\] holds True, a bool, which is not a world id"),
    ([np.bool_(False)], r"holds np\.False_, a bool, which is not a world id"),
    ([0, 0], r"worlds=\[0, 0\] names world\(s\) \[0\] more than once"),
    ([0.5], r"holds 0\.5, a float\. World ids are whole numbers"),
    ("0,1", r"worlds must be a sequence of world ids, e.g. \[0, 3\], got '0,1'"),
    (1, r"worlds must be a sequence of world ids, e.g. \[0, 3\], got 1"),
])
def test_render_refuses_world_ids_that_are_not_ids_each_once(archive, tiny, tmp_path, worlds,
                                                             fragment):
    before = snapshot(archive)

    with pytest.raises(SelectionError, match=fragment):
        render_videos(archive, tiny, "front", str(tmp_path / "v"), worlds=worlds, options=SMALL,
                      n_workers=0)

    assert snapshot(archive) == before and not (tmp_path / "v").exists()


@pytest.mark.parametrize(("time", "fragment"), [
    ((0,), r"time must be \(start, end\) in simulated seconds.*got \(0,\)"),
    ((0, 0.1, 0.2), r"got \(0, 0\.1, 0\.2\)"),
    (0.5, r"time must be \(start, end\).*got 0\.5"),
    ((0, float("nan")), r"time=\(0, nan\) holds NaN, which is no time"),
    ((float("nan"), None), r"holds NaN, which is no time"),
    (("0", 1), r"time=\('0', 1\) holds '0'; each side is a number of simulated seconds or None"),
    ((True, 1), r"holds True; each side is a number"),
])
def test_render_frames_refuses_a_time_that_is_not_a_window(archive, tiny, time, fragment):
    before = snapshot(archive)

    with pytest.raises(SelectionError, match=fragment):
        render_frames(archive, tiny, "front", time=time, size=(48, 64))

    assert snapshot(archive) == before


def test_export_npz_refuses_a_world_named_twice_and_writes_nothing(archive, tmp_path):
    before = snapshot(archive)

    with pytest.raises(SelectionError, match=r"names world\(s\) \[0\] more than once"):
        export_npz(archive, tmp_path / "npz", worlds=[0, 1, 0])

    assert snapshot(archive) == before and not (tmp_path / "npz").exists()


def test_export_npz_refuses_a_bool_as_a_world_id(archive, tmp_path):
    before = snapshot(archive)

    with pytest.raises(SelectionError, match="a bool, which is not a world id"):
        export_npz(archive, tmp_path / "npz", worlds=[True])

    assert snapshot(archive) == before and not (tmp_path / "npz").exists()


@requires_flygym_files
def test_trajectories_refuse_a_world_named_twice(archive):
    before = snapshot(archive)

    with pytest.raises(SelectionError, match=r"names world\(s\) \[1\] more than once"):
        read_trajectories(archive, worlds=[1, 1])

    assert snapshot(archive) == before


def test_cli_export_npz_with_a_world_named_twice_is_one_line_and_writes_nothing(archive, tmp_path,
                                                                               cli):
    before = snapshot(archive)

    code, out, err = cli("export-npz", archive, "--to", tmp_path / "npz", "--worlds", "0,1,0-1")

    assert code == 2 and one_line(err) and out == ""
    assert "The world selection '0,1,0-1' names world(s) [0, 1] more than once" in err
    assert snapshot(archive) == before and not (tmp_path / "npz").exists()


def test_cli_open_world_range_past_the_last_world_is_one_line(archive, tmp_path, cli):
    before = snapshot(archive)

    code, _, err = cli("export-npz", archive, "--to", tmp_path / "npz", "--worlds", "5-")

    assert code == 2 and one_line(err)
    assert "The world range '5-' in '5-' selects no world: the archive's largest world id is 1" in err
    assert snapshot(archive) == before and not (tmp_path / "npz").exists()


def test_cli_render_with_a_nan_time_is_one_line_and_renders_nothing(archive, tmp_path, cli):
    before = snapshot(archive)

    code, _, err = cli("render", archive, "--camera", "front", "--time", "0:nan", "--workers", "0",
                       "--out", tmp_path / "v")

    assert code == 2 and one_line(err)
    assert "Cannot read time window '0:nan': NaN is no time; write START:END" in err
    assert snapshot(archive) == before and not (tmp_path / "v").exists()


# ----------------------------------------------------------------------------- plot
def test_plot_of_a_world_without_frames_is_refused_and_writes_no_png(ragged, tmp_path, cli):
    before = snapshot(ragged)

    code, out, err = cli("plot", ragged, "--world", "2", "--out", tmp_path / "w2.png")

    assert code == 2 and one_line(err) and out == ""
    assert re.search(r"World 2 of .* has no committed frames, so there are no traces to plot.*"
                     r"Worlds with frames: \[0, 1\]", err)
    assert snapshot(ragged) == before and not (tmp_path / "w2.png").exists()


def test_plot_refuses_a_bool_as_a_world(archive, tmp_path):
    before = snapshot(archive)

    with pytest.raises(SelectionError, match="world must be a world id .*got True"):
        plot_traces(archive, True, tmp_path / "p.png")  # type: ignore[arg-type]

    assert snapshot(archive) == before and not (tmp_path / "p.png").exists()


def test_plot_of_an_unknown_dof_suggests_the_closest(archive, tmp_path):
    before = snapshot(archive)

    with pytest.raises(SelectionError, match=r"\['shouldr'\] are not in the archive\. Did you mean "
                                             r"'shoulder'"):
        plot_traces(archive, 0, tmp_path / "p.png", dofs=["shouldr"])

    assert snapshot(archive) == before and not (tmp_path / "p.png").exists()


# ----------------------------------------------------------------------------- conditions
@pytest.fixture
def labelled(archive: str) -> str:
    add_world_vars(archive, {"genotype": ["wt", "mutA"], "success": [1, 0],
                             "reward": [np.nan, 0.5]})
    return archive


@pytest.mark.parametrize(("world_vars", "dofs", "fragment"), [
    (["genotype=1"], [], r"'genotype' holds text; compare it with a text in quotes, e\.g\. "
                         r"\"genotype=='1'\""),
    (["success=='wt'"], [], r"'wt' is not a number, and 'success' holds int64 values"),
    (["success=wt"], [], r"'wt' is not a number"),
    (["genotype>'a'"], [], r"'genotype' holds text, which is compared with = or != only"),
    (["reward=nan"], [], r"compares with NaN, which equals nothing.*ds\.NAME\.isnull\(\)"),
    (["sucess=1"], [], r"no world variable 'sucess'\. Did you mean 'success'\? World variables: "
                       r"'genotype', 'reward', 'success'"),
    (["genotipe='wt'"], [], r"Did you mean 'genotype'\?"),
    ([], ["shouldr>0"], r"no dof 'shouldr'\. Did you mean 'shoulder' or 'slider'\?"),
    ([], ["shoulder>'a'"], r"'a' is not a number; a dof's qpos is compared with a number"),
])
def test_conditions_of_the_wrong_kind_or_unknown_names_are_refused(labelled, world_vars, dofs,
                                                                    fragment):
    before = snapshot(labelled)

    with pytest.raises(SelectionError, match=fragment):
        where_from_conditions(open_archive(labelled), world_vars, dofs)

    assert snapshot(labelled) == before


def test_cli_render_with_a_misspelt_world_variable_is_one_line(labelled, tmp_path, cli):
    before = snapshot(labelled)

    code, _, err = cli("render", labelled, "--camera", "front", "--where-world-var", "genotyp=wt",
                       "--workers", "0", "--out", tmp_path / "v")

    assert code == 2 and one_line(err) and "Did you mean 'genotype'?" in err
    assert snapshot(labelled) == before and not (tmp_path / "v").exists()


def test_an_unknown_overlay_item_suggests_the_closest(labelled, tiny, tmp_path):
    before = snapshot(labelled)
    options = RenderOptions(size=(48, 64), overlays=("genotipe",))

    with pytest.raises(RenderOptionsError, match=r"Cannot overlay 'genotipe'.*Did you mean "
                                                 r"'genotype'\?"):
        render_videos(labelled, tiny, "front", str(tmp_path / "v"), options=options, n_workers=0)

    assert snapshot(labelled) == before and not (tmp_path / "v").exists()


# ----------------------------------------------------------------------------- one message
def test_a_damaged_chunk_is_said_once_when_a_render_reads_it(archive, tiny, tmp_path):
    flip_bits(shard_file(archive, "qpos", 0, 0))
    before = snapshot(archive)

    with pytest.raises(CorruptArchiveError) as caught:
        render_videos(archive, tiny, "front", str(tmp_path / "v"), options=SMALL, n_workers=0)

    message = str(caught.value)
    assert "(file qpos/c/0/" in message and "fails its CRC-32C checksum" in message
    assert message.count("The stored bytes are damaged") == 1
    assert message.count("Reading ") == 1
    assert snapshot(archive) == before

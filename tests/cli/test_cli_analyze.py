"""``flyarchive positions``, ``gait`` and ``export-poses`` as a user runs them."""

from __future__ import annotations

import json

import numpy as np
import pytest

import flyarchive
from flyarchive.cli.args import where_mask as _where
from flyarchive.cli.analysis import parse_keypoints
from flyarchive.testing.fixtures import record
from flyarchive.testing.markers import requires_movement


@pytest.fixture
def archive(tiny, tmp_path):
    return record(tiny, str(tmp_path / "run.zarr"), n_worlds=3)


def test_keypoints_and_points_are_read_from_the_command_line():
    got = parse_keypoints(["torso,site:s1", "bodies"], ["tip=arm@tip", "p=hand@0,0.5,-1e-3"])

    assert got == {"bodies": ["torso", "*"], "sites": ["s1"],
                   "points": {"tip": ("arm", "tip"), "p": ("hand", (0.0, 0.5, -0.001))}}
    assert parse_keypoints(["tarsus-tips"], None)["points"]["nmf/rh_tip"] == ("nmf/rh_tarsus5", "tip")
    assert parse_keypoints(["gait"], None)["points"] == flyarchive.gait_points()


def test_positions_are_kept_beside_the_archive_and_read_back(cli, archive):
    code, out, err = cli("positions", archive, "--keypoints", "torso,hand", "--point", "tip=arm@tip",
                         "--quiet")

    kept = flyarchive.positions(archive, ["torso", "hand"], points={"tip": ("arm", "tip")})
    assert code == 0, err
    assert out.strip() == f"kept positions at {kept.attrs['stored']}" and err == ""


def test_positions_show_a_progress_bar_on_stderr_unless_quiet(cli, archive):
    code, out, err = cli("positions", archive, "--keypoints", "torso")

    assert code == 0, err
    assert "positions: 100%" in err and "20/20" in err  # tqdm's bar: frames of the window
    assert out.startswith("kept positions at ")


def test_positions_as_an_archive_of_their_own_with_orientations(cli, archive, tmp_path):
    to = str(tmp_path / "pos.zarr")

    code, out, err = cli("positions", archive, "--to", to, "--keypoints", "torso,target",
                         "--orientations", "--quiet")

    kept = flyarchive.open_positions(to)
    assert code == 0, err
    assert kept.orientation.shape == (3, 20, 2, 4)
    assert np.array_equal(kept.position.values, flyarchive.positions(archive, ["torso", "target"]).values)


def test_gait_prints_json_and_saves_world_variables_that_select_worlds(cli, archive):
    code, out, err = cli("gait", archive, "--thorax", "torso", "--tip", "hand_tip=hand@tip",
                         "--json", "--save")

    assert code == 0, err
    table = json.loads(out.replace("NaN", "null"))
    assert table["world"] == [0, 1, 2] and table["units"]["distance"] == "model unit"
    ds = flyarchive.open_archive(archive)
    assert np.allclose(ds.path_length.values, table["path_length"])
    assert ds.path_length.attrs["units"] == "model unit" and ds.duty_factor_hand.attrs["units"] == "1"
    where = _where(archive, None, [f"path_length>{min(table['path_length'])}"], None)
    assert where.values.tolist() == [v > min(table["path_length"]) for v in table["path_length"]]


def test_gait_save_replaces_what_an_earlier_save_stored(cli, archive):
    gait = ("gait", archive, "--thorax", "torso", "--tip", "hand_tip=hand@tip", "--save")
    assert cli(*gait)[0] == 0
    first = flyarchive.open_archive(archive).time_below.values

    code, _, err = cli(*gait, "--fall-height", "1e3")

    assert code == 0, err
    assert not np.array_equal(flyarchive.open_archive(archive).time_below.values, first)


def test_gait_save_replaces_a_world_variable_of_yours_only_with_overwrite(cli, archive):
    mine = [9.5, 9.5, 9.5]
    flyarchive.add_world_vars(archive, {"distance": mine})
    gait = ("gait", archive, "--thorax", "torso", "--tip", "hand_tip=hand@tip", "--save")

    code, _, err = cli(*gait)

    assert code == 2 and "world variables distance that no earlier gait save" in err
    assert "--overwrite" in err and "Nothing was written" in err
    ds = flyarchive.open_archive(archive)
    assert ds.distance.values.tolist() == mine and "path_length" not in ds
    assert cli(*gait, "--overwrite")[0] == 0
    assert flyarchive.open_archive(archive).distance.values.tolist() != mine


def test_gait_table_shows_whole_names_and_units(cli, archive):
    code, out, err = cli("gait", archive, "--thorax", "torso", "--tip", "hand_tip=hand@tip")

    assert code == 0, err
    header, *rows = out.splitlines()[:40]
    assert header.split() == ["world", "0", "world", "1", "world", "2"]
    labels = [row.split("  ")[0].strip() for row in rows if row.strip()]
    assert "stance_fraction_hand [1]" in labels and "step_frequency_hand [Hz]" in labels
    assert "heading_change [rad]" in labels and "duty_factor_hand [1]" in labels


def test_gait_labels_lengths_in_the_length_unit_given(cli, archive):
    code, out, err = cli("gait", archive, "--thorax", "torso", "--tip", "hand_tip=hand@tip",
                         "--length-unit", "m")

    assert code == 0, err
    labels = [row.split("  ")[0].strip() for row in out.splitlines()]
    assert "distance [m]" in labels and "mean_speed [m/s]" in labels
    assert "step_length_hand [m]" in labels and not any("mm" in label for label in labels)
    code, _, err = cli("gait", archive, "--thorax", "torso", "--tip", "hand_tip=hand@tip",
                       "--length-unit", " ")
    assert code == 2 and "length_unit must be the name of the positions' length unit" in err


def test_gait_writes_the_step_and_epoch_tables_as_csv_and_json(cli, archive, tmp_path):
    import pandas as pd

    steps, epochs = tmp_path / "steps.csv", tmp_path / "epochs.json"

    code, out, err = cli("gait", archive, "--thorax", "torso", "--tip", "hand_tip=hand@tip",
                         "--steps", str(steps), "--epochs", str(epochs), "--json")
    again = cli("gait", archive, "--thorax", "torso", "--tip", "hand_tip=hand@tip",
                "--steps", str(steps))

    assert code == 0, err
    expected = flyarchive.gait_steps(archive, thorax="torso", tips={"hand_tip": ("hand", "tip")})
    got = pd.read_csv(steps)
    assert list(got.columns) == list(expected.columns) and len(got) == len(expected)
    assert np.allclose(got.liftoff_time, expected.liftoff_time)
    rows = json.loads(epochs.read_text())
    assert {r["phase"] for r in rows} <= {"stance", "swing"} and rows[0]["leg"] == "hand"
    assert again[0] == 2 and "already exists; pass --overwrite" in again[2]


@requires_movement
def test_export_poses_writes_a_movement_file_and_refuses_to_overwrite_it(cli, archive, tmp_path):
    target = tmp_path / "poses.nc"

    code, out, err = cli("export-poses", archive, "--format", "movement", "--to", target,
                         "--keypoints", "hand", "--worlds", "0-1")
    again = cli("export-poses", archive, "--format", "movement", "--to", target)

    assert code == 0, err
    assert out.strip() == f"wrote 1 file(s): {target}"
    assert again[0] == 2 and "already exists" in again[2]


def test_positions_draws_its_bar_once_work_starts_and_none_for_a_call_refused(archive, tmp_path,
                                                                                cli):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")

    code, _, err = cli("positions", archive, "--keypoints", "bodies", "--to", mine)

    assert code == 2 and "frame/s" not in err and "frame [" not in err  # no empty bar drawn
    code, out, err = cli("positions", archive, "--keypoints", "bodies", "--to", tmp_path / "p.zarr")
    assert code == 0 and "kept positions at" in out
    assert "positions: 100%" in err and "0frame [" not in err

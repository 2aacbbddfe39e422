"""Derived data (kept positions) under the states' guarantees: a derived group that is
damaged, inconsistent with itself or with its archive, or that belongs to another archive,
is refused by every reader with a clear error that names the group and what to do
(recompute it), is named by ``verify`` (of the archive, and of the group's own URL), and is
repaired by running ``flyarchive positions`` again; never read as NaN or as another
archive's values. The archive itself is never changed.

The group is the tiny archive's (tests/bad_input/conftest.py: 2 worlds x 20 frames, chunks
of 5) positions of ``torso`` and ``hand`` with orientations, kept once per test process
and copied per test: a ``position`` shard holds both worlds over 5 frames
(``position/c/0/<t>/0/0``), an inner chunk one world.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import flyarchive
from flyarchive.errors import CorruptArchiveError, SchemaError
from flyarchive.testing import flip_bits
from flyarchive.testing.fixtures import copy_archive, snapshot
from flyarchive.testing.holes import delete_object, empty_inner_chunks

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]  # keeps positions per test: the full suite's

KEYPOINTS = ["torso", "hand"]
SHARD = "position/c/0/1/0/0"  # worlds 0..1, frames 5..9


@pytest.fixture(scope="session")
def recorded_kept(recorded: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny archive with its positions of torso and hand (and orientations) kept beside
    it, made once per test process: do not change it."""
    url = copy_archive(recorded, tmp_path_factory.mktemp("kept") / "run.zarr")
    flyarchive.keep_positions(url, KEYPOINTS, orientations=True)
    return url


@pytest.fixture
def kept(recorded_kept: str, tmp_path: Path) -> tuple[str, Path]:
    """A copy of :func:`recorded_kept` (``run.zarr``) and its derived group's folder."""
    url = copy_archive(recorded_kept, tmp_path / "run.zarr")
    (group,) = (Path(url) / "derived").glob("positions-*")
    return url, group


def archive_files(url: str) -> dict[str, bytes]:
    """The archive's own files (its derived groups left out)."""
    return {k: v for k, v in snapshot(url).items() if not k.startswith("derived/")}


def edit_json(group: Path, name: str, edit: Callable[[dict], None]) -> None:
    """Edit array ``name``'s metadata the same way in its own ``zarr.json`` and in the
    consolidated copy (a consistent edit, as a tool that rewrites both would make)."""
    path = group / name / "zarr.json"
    meta = json.loads(path.read_text())
    edit(meta)
    path.write_text(json.dumps(meta))
    root = group / "zarr.json"
    document = json.loads(root.read_text())
    edit(document["consolidated_metadata"]["metadata"][name])
    root.write_text(json.dumps(document))


def edit_attrs(group: Path, edit: Callable[[dict], None]) -> None:
    root = group / "zarr.json"
    document = json.loads(root.read_text())
    edit(document["attributes"])
    root.write_text(json.dumps(document))


def set_values(group: Path, name: str, change: Callable[[np.ndarray], np.ndarray]) -> None:
    """Write new values into array ``name`` through zarr (valid checksums)."""
    import zarr

    arr = zarr.open_array(str(group / name), mode="r+")
    arr[:] = change(np.asarray(arr[:]))


def hand(url: str, **kwargs):
    return flyarchive.positions(url, KEYPOINTS, **kwargs)


# ----------------------------------------------------------------------------- missing chunks
def test_a_deleted_shard_of_kept_positions_fails_the_read_instead_of_reading_nan(kept):
    url, group = kept
    delete_object(str(group), SHARD)

    with pytest.raises(CorruptArchiveError) as err:
        hand(url).values

    message = str(err.value)
    assert f"position [worlds [0, 1] (indices 0, 1), frames 5..9] (file {SHARD}) from " \
           f"'{group}' failed: the file is missing, but n_frames says these frames were " \
           "committed" in message
    assert f"run `flyarchive positions {url}` again with the same keypoints, which " \
           "recomputes what is damaged" in message


def test_a_read_of_frames_beside_the_deleted_shard_still_answers(kept):
    url, group = kept
    expected = hand(url, stored=False).isel(time=slice(0, 5)).values
    delete_object(str(group), SHARD)

    actual = hand(url)

    assert actual.attrs["stored"] == str(group)
    assert np.array_equal(actual.isel(time=slice(0, 5)).values, expected)


def test_an_inner_chunk_marked_never_written_fails_the_read_naming_its_world(kept):
    url, group = kept
    empty_inner_chunks(str(group), SHARD, [1])  # world 1, frames 5..9

    with pytest.raises(CorruptArchiveError, match=r"position \[world 1 \(index 1\), frames "
                       r"5\.\.9\] \(file position/c/0/1/0/0\).*the shard's index marks the "
                       r"chunk as never written"):
        hand(url, worlds=[1]).values


def test_a_deleted_orientation_shard_fails_reads_of_orientations(kept):
    url, group = kept
    delete_object(str(group), "orientation/c/0/2/0/0")

    with pytest.raises(CorruptArchiveError, match=r"orientation \[worlds \[0, 1\].*frames "
                       r"10\.\.14\].*`flyarchive positions"):
        hand(url, orientations=True).orientation.values


def test_flipped_bits_in_kept_positions_fail_their_checksum_and_say_to_recompute(kept):
    url, group = kept
    flip_bits(group / SHARD)

    with pytest.raises(CorruptArchiveError, match=r"Reading position \[worlds? .*frames "
                       r"5\.\.9\] \(file position/c/0/1/0/0\) .*failed: .*The stored bytes are "
                       r"damaged; This derived group holds values computed from the archive") as err:
        hand(url).values

    assert f"`flyarchive positions {url}` again" in str(err.value)


def test_verify_names_a_deleted_chunk_of_a_derived_group(kept, cli):
    url, group = kept
    delete_object(str(group), SHARD)

    code, out, err = cli("verify", url)

    assert code == 1 and out == ""
    assert f"derived/{group.name}: position has 10 committed frames that are missing or not " \
           "finite in worlds 0..1, frames 5..9" in err
    assert f"derived/{group.name}: This derived group holds values computed from the archive" \
        in err


def test_verify_of_the_derived_groups_own_url_checks_it(kept, cli):
    url, group = kept
    sound = cli("verify", group)
    delete_object(str(group), SHARD)

    code, out, err = cli("verify", group)

    assert sound[0] == 0 and "a derived group of 2 worlds, 40 committed frames read" in sound[1]
    assert code == 1 and "position has 10 committed frames that are missing" in err
    assert f"run `flyarchive positions {url}` again with the same keypoints" in err
    assert "no variable 'qpos'" not in err


def test_the_commands_a_damaged_groups_error_names_do_what_it_says(kept, cli):
    url, group = kept
    delete_object(str(group), SHARD)
    with pytest.raises(CorruptArchiveError) as err:
        hand(url).values
    verify_url = str(err.value).split("`flyarchive verify ")[1].split("`")[0]

    checked = cli("verify", verify_url)
    repaired = cli("positions", url, "--keypoints", ",".join(KEYPOINTS), "--orientations",
                   "--quiet")

    assert checked[0] == 1 and "position has 10 committed frames" in checked[2]
    assert repaired[0] == 0, repaired[2]
    assert np.array_equal(hand(url).values, hand(url, stored=False).values)


def test_rerunning_positions_recomputes_a_deleted_chunk_instead_of_saying_kept(kept, cli):
    url, group = kept
    expected = hand(url, stored=False).values
    before = archive_files(url)
    delete_object(str(group), SHARD)

    code, out, err = cli("positions", url, "--keypoints", ",".join(KEYPOINTS),
                         "--orientations", "--quiet")

    assert code == 0
    assert "repairing: Recomputing worlds 0..1, frames 5..9" in err
    assert out.startswith("repaired and kept positions at")
    actual = hand(url)
    assert actual.attrs["stored"] == str(group) and np.array_equal(actual.values, expected)
    assert flyarchive.verify(url).ok and archive_files(url) == before


def test_a_deleted_chunk_of_kept_positions_on_s3(recorded, s3_location):
    from flyarchive.store.derived import find_derived

    url, options = s3_location.url, s3_location.storage_options
    copy_archive(recorded, url, options)
    group = flyarchive.keep_positions(url, "hand", storage_options=options)
    expected = flyarchive.positions(url, "hand", storage_options=options).values
    key = group[len(url) + 1:] + "/" + SHARD
    delete_object(url, key, options)

    with pytest.raises(CorruptArchiveError, match=r"position \[worlds \[0, 1\].*frames 5\.\.9\]"):
        flyarchive.positions(url, "hand", storage_options=options).values
    report = flyarchive.verify(url, options)
    notes = []
    flyarchive.keep_positions(url, "hand", storage_options=options, on_repair=notes.append)

    assert any("position has 10 committed frames that are missing" in p for p in report.problems)
    assert len(notes) == 1 and "Recomputing worlds 0..1, frames 5..9" in notes[0]
    assert [g for g, _, _ in find_derived(url, options)] == [group]
    assert np.array_equal(flyarchive.positions(url, "hand", storage_options=options).values,
                          expected)
    assert flyarchive.verify(url, options).ok


# ----------------------------------------------------------------------------- metadata
def test_metadata_that_says_fewer_frames_than_were_committed_is_refused_at_open(kept):
    url, group = kept
    edit_json(group, "position", lambda meta: meta["shape"].__setitem__(1, 15))

    with pytest.raises(CorruptArchiveError, match=r"The derived group at .* is damaged: n_frames "
                       r"\[20, 20\] is outside 0\.\.15 \(the time extent\).*`flyarchive "
                       r"positions"):
        hand(url)


def test_verify_names_metadata_shorter_than_the_committed_frames(kept, cli):
    url, group = kept
    edit_json(group, "position", lambda meta: meta["shape"].__setitem__(1, 15))

    code, out, err = cli("verify", url)

    assert code == 1
    assert f"derived/{group.name}: n_frames [20, 20] is outside 0..15 (the time extent)" in err


def test_rerunning_positions_remakes_a_group_whose_metadata_is_damaged(kept, cli):
    url, group = kept
    expected = hand(url, stored=False).values
    before = archive_files(url)
    edit_json(group, "position", lambda meta: meta["shape"].__setitem__(1, 15))

    code, out, err = cli("positions", url, "--keypoints", ",".join(KEYPOINTS),
                         "--orientations", "--quiet")

    assert code == 0 and f"repairing: Made {group} anew: The derived group" in err
    assert "n_frames [20, 20] is outside 0..15" in err and "again with the same" not in err
    assert np.array_equal(hand(url).values, expected)
    assert flyarchive.verify(url).ok and archive_files(url) == before


def test_keypoint_labels_fewer_than_the_positions_keypoints(kept):
    url, group = kept
    edit_json(group, "keypoint", lambda meta: meta.update(shape=[1]))

    with pytest.raises(SchemaError, match=r"Variable '(orientation|position)' has length 2 along "
                       r"'keypoint', but coordinate 'keypoint' has length 1"):
        hand(url)


def test_keypoint_labels_that_disagree_with_the_provenance(kept):
    url, group = kept
    set_values(group, "keypoint", lambda labels: np.array(["hand", "torso"]))

    with pytest.raises(SchemaError, match=r"Coordinate 'keypoint' is \['hand', 'torso'\], but "
                       r"the provenance defines \['torso', 'hand'\]: the labels do not name the "
                       r"values they label"):
        hand(url)


def test_repeated_keypoint_labels(kept):
    url, group = kept
    set_values(group, "keypoint", lambda labels: np.array(["hand", "hand"]))

    with pytest.raises(SchemaError, match=r"Coordinate 'keypoint' repeats the label\(s\) "
                       r"\['hand'\]"):
        flyarchive.open_positions(group)


def test_a_state_array_whose_dimensions_were_renamed(kept):
    url, group = kept
    edit_json(group, "position",
              lambda meta: meta.update(dimension_names=["world", "frames", "keypoint", "xyz"]))

    with pytest.raises(SchemaError, match=r"derived group at .* is damaged: Variable 'position' "
                       r"has dims \('world', 'frames', 'keypoint', 'xyz'\); a derived group's "
                       r"values have dims \(world, time, \.\.\.\)"):
        hand(url)


def test_a_state_pipeline_without_its_checksum_is_refused_before_any_read(kept):
    url, group = kept

    def no_crc(meta: dict) -> None:
        inner = meta["codecs"][0]["configuration"]["codecs"]
        inner[:] = [c for c in inner if c["name"] != "crc32c"]

    edit_json(group, "position", no_crc)

    with pytest.raises(SchemaError, match=r"position/zarr\.json: the pipeline "
                       r"\['bytes'\] does not end in one crc32c stage.*nothing was decoded"):
        hand(url)


def test_negative_commit_markers(kept):
    url, group = kept
    set_values(group, "n_frames", lambda n: np.array([-1, 20]))

    with pytest.raises(CorruptArchiveError, match=r"n_frames \[-1, 20\] is outside 0\.\.20"):
        flyarchive.open_positions(group)


def test_a_deleted_time_chunk_of_the_group(kept):
    url, group = kept
    delete_object(str(group), "time/c/2")

    with pytest.raises(CorruptArchiveError, match=r"time has 5 missing or non-finite values "
                       r"among the 20 committed frames"):
        hand(url)


def test_a_derived_attribute_that_is_not_an_object(kept, cli):
    url, group = kept
    edit_attrs(group, lambda attrs: attrs.update(derived="positions"))

    with pytest.raises(SchemaError, match="holds no derived values"):
        flyarchive.open_positions(group)
    code, out, err = cli("verify", url)

    assert code == 1 and f"derived/{group.name}: Schema: Attribute 'derived' is 'positions'" \
        in err
    assert "stored" not in hand(url).attrs  # not read: computed


def test_derived_values_of_another_kind_are_not_positions(kept):
    url, group = kept
    edit_attrs(group, lambda attrs: attrs["derived"].update(kind="gait"))

    with pytest.raises(SchemaError, match=r"derived values of another kind \('gait'\), not "
                       r"positions"):
        flyarchive.open_positions(group)


def test_an_export_of_a_damaged_group_names_the_damage_not_a_missing_qpos(kept, tmp_path):
    from flyarchive.interop.poses import export_poses

    url, group = kept
    set_values(group, "keypoint", lambda labels: np.array(["hand", "torso"]))

    with pytest.raises(SchemaError, match=r"The derived group at .* is damaged: Coordinate "
                       r"'keypoint' is \['hand', 'torso'\]"):
        export_poses(group, tmp_path / "poses.nc", format="movement")

    assert not (tmp_path / "poses.nc").exists()


# ----------------------------------------------------------------------------- the archive
def test_world_ids_that_are_not_the_archives(kept):
    url, group = kept
    set_values(group, "world", lambda ids: ids + 5)

    with pytest.raises(CorruptArchiveError, match=r"does not match its archive: Its worlds "
                       r"\[5, 6\] are not the archive's worlds \[0, 1\]"):
        hand(url)


def test_times_that_are_not_the_archives(kept, cli):
    url, group = kept
    set_values(group, "time", lambda time: time + 0.5)

    with pytest.raises(CorruptArchiveError, match=r"Its 'time' differs from the archive's at "
                       r"20 committed frames \(first: frame 0, 0\.5 against 0\.0\)"):
        hand(url)
    code, _, err = cli("verify", url)

    assert code == 1 and f"derived/{group.name}: Its 'time' differs" in err


def test_more_frames_committed_than_the_archive_has(ragged, cli, tiny, model_xml):
    flyarchive.keep_positions(ragged, "hand", model=tiny)  # worlds of 8, 5 and 0 frames
    (group,) = (Path(ragged) / "derived").glob("positions-*")
    set_values(group, "n_frames", lambda n: np.array([8, 8, 0]))

    with pytest.raises(CorruptArchiveError, match=r"It has committed \[8\] frames of worlds "
                       r"\[1\], but the archive has only \[5\]"):
        flyarchive.positions(ragged, "hand", model=tiny)
    code, _, err = cli("verify", ragged)
    repaired = cli("positions", ragged, "--keypoints", "hand", "--model", model_xml, "--quiet")

    assert code == 1 and "but the archive has only [5]" in err
    assert repaired[0] == 0 and "anew" in repaired[2]
    assert flyarchive.verify(ragged).ok


def test_a_layout_that_is_not_the_archives(kept):
    import mujoco

    from flyarchive.layout import ModelLayout
    from flyarchive.testing import TWO_HINGES_XML

    url, group = kept
    other = ModelLayout.from_model(mujoco.MjModel.from_xml_string(TWO_HINGES_XML))
    edit_attrs(group, lambda attrs: attrs.update(layout=other.to_attrs()))

    with pytest.raises(CorruptArchiveError, match=rf"Its model layout \(hash "
                       rf"'{other.hash[:16]}'\) is not the archive's \(hash '[0-9a-f]{{16}}'\)"):
        flyarchive.open_positions(group)


def test_a_group_whose_provenance_names_another_archive_is_refused(kept, cli):
    url, group = kept
    edit_attrs(group, lambda attrs: attrs["derived"].update(source_archive_id="f" * 32))

    with pytest.raises(CorruptArchiveError, match=r"was computed from the archive 'fff+', not "
                       r"from the archive '[0-9a-f]{32}' at .* that it is kept beside.*never "
                       r"reads it for this archive\. Delete it"):
        flyarchive.open_positions(group)
    code, _, err = cli("verify", url)
    again = cli("positions", url, "--keypoints", ",".join(KEYPOINTS), "--orientations",
                "--quiet")

    assert code == 1 and f"derived/{group.name}: It was computed from the archive 'fff" in err
    assert again[0] == 0 and f"repairing: Made {group} anew" in again[2]
    assert flyarchive.verify(url).ok


def test_positions_kept_for_another_archive_are_never_read_for_this_one(kept, recorded,
                                                                       tmp_path):
    import shutil

    url, group = kept
    other = copy_archive(recorded, tmp_path / "other.zarr")
    import zarr

    zarr.open_group(other, mode="r+").attrs["archive_id"] = "a" * 32  # another recording
    their = Path(flyarchive.keep_positions(other, KEYPOINTS, orientations=True))
    shutil.rmtree(group)
    planted = Path(url) / "derived" / their.name
    shutil.copytree(their, planted)
    set_values(planted, "position", lambda values: values + 100.0)  # not this archive's

    actual = hand(url)
    report = flyarchive.verify(url)

    assert "stored" not in actual.attrs
    assert np.array_equal(actual.values, hand(url, stored=False).values)
    assert any(f"derived/{their.name}: It was computed from the archive 'aaaa" in p
               for p in report.problems)


# ----------------------------------------------------------------------------- the folder
def test_a_folder_in_derived_that_is_not_a_group_is_named_by_verify(kept, cli):
    url, group = kept
    (Path(url) / "derived" / "stray").mkdir()
    (Path(url) / "derived" / "stray" / "notes.txt").write_text("mine")

    code, _, err = cli("verify", url)

    assert code == 1 and "derived/stray: it is not a derived group (no zarr.json)" in err
    assert (Path(url) / "derived" / "stray" / "notes.txt").read_text() == "mine"


def test_a_group_whose_zarr_json_was_deleted_is_named_and_remade(kept, cli):
    url, group = kept
    (group / "zarr.json").unlink()

    code, _, err = cli("verify", url)
    again = cli("positions", url, "--keypoints", ",".join(KEYPOINTS), "--orientations",
                "--quiet")

    assert code == 1 and f"derived/{group.name}: it is not a derived group (no zarr.json)" in err
    assert again[0] == 0 and "What was there is not a derived group of this request" in again[2]
    assert flyarchive.verify(url).ok and hand(url).attrs["stored"] == str(group)


def test_positions_kept_as_an_archive_of_their_own_are_checked_and_repaired(archive, tmp_path):
    to = str(tmp_path / "positions.zarr")
    flyarchive.keep_positions(archive, "hand", to=to)
    expected = flyarchive.open_positions(to).values
    delete_object(to, SHARD)
    said = []

    with pytest.raises(CorruptArchiveError, match=rf"file {SHARD}.*run `flyarchive positions "
                       rf"ARCHIVE --to {to}` again with the same keypoints"):
        flyarchive.open_positions(to).values
    flyarchive.keep_positions(archive, "hand", to=to, on_repair=said.append)

    assert len(said) == 1 and "Recomputing worlds 0..1, frames 5..9" in said[0]
    assert np.array_equal(flyarchive.open_positions(to).values, expected)


def test_an_archive_command_on_positions_kept_on_their_own_says_what_they_are(tmp_path, cli):
    from flyarchive.testing import tiny_model
    from flyarchive.testing.fixtures import record

    archive = record(tiny_model(), str(tmp_path / "run.zarr"), n_worlds=2, n_steps=12)
    own = str(tmp_path / "own.zarr")
    flyarchive.keep_positions(archive, "*", to=own)

    for command in (["info", own], ["export-npz", own, "--to", str(tmp_path / "npz")]):
        code, _, err = cli(*command)
        assert code == 2 and "holds values derived from an archive" in err, err
        assert "flyarchive.open_positions(url)" in err

"""Kept positions: a derived group beside the archive (or an archive of its own), committed
as recordings are, resumed after an interruption, and read back by flyarchive.positions."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import flyarchive
from flyarchive.analyze import blocks
from flyarchive.errors import ArchiveExistsError
from flyarchive.testing import tiny_model
from flyarchive.testing.fixtures import record, snapshot

pytestmark = pytest.mark.slow  # keeps positions in most tests: the full suite's, not the fast tier's

POINTS = {"claw": ("fly/lf_tarsus5", (0.1, 0.0, -0.2))}


def no_kinematics(monkeypatch):
    """Make computing positions fail: what is read must come from the store."""
    def refuse(*args, **kwargs):
        raise AssertionError("positions were computed instead of read")

    monkeypatch.setattr(blocks, "kinematics_block", refuse)
    import flyarchive.analyze.prepare as prepare

    monkeypatch.setattr(prepare, "kinematics_block", refuse)


def test_kept_positions_are_read_back_instead_of_computed(sites_archive, monkeypatch):
    expected = flyarchive.positions(sites_archive, "*", points=POINTS, orientations=True).compute()
    group = flyarchive.keep_positions(sites_archive, "*", points=POINTS, orientations=True)
    no_kinematics(monkeypatch)

    actual = flyarchive.positions(sites_archive, ["fly/lf_femur", "*"], points=POINTS,
                                  orientations=True, worlds=[2, 1], time=(0.0, 0.1)).compute()

    assert actual.attrs["stored"] == group and "/derived/positions-" in group
    window = expected.sel(world=[2, 1], time=actual.time)
    assert np.array_equal(actual.position.values,
                          window.position.sel(keypoint=actual.keypoint).values)
    assert np.array_equal(actual.orientation.values,
                          window.orientation.sel(keypoint=actual.keypoint).values)


def test_a_request_the_kept_group_does_not_hold_is_computed(sites_archive):
    flyarchive.keep_positions(sites_archive, "target")

    other = flyarchive.positions(sites_archive, "target", points=POINTS)
    turned = flyarchive.positions(sites_archive, "target", orientations=True)

    assert "stored" not in other.attrs and "stored" not in turned.attrs


def test_positions_kept_under_a_default_dask_client_equal_those_kept_without(dask_client,
                                                                             tmp_path):
    url = record(tiny_model(), str(tmp_path / "run.zarr"))
    expected = flyarchive.positions(url, stored=False).compute()

    with dask_client.as_current():  # blocks computed there may come back unaligned
        group = flyarchive.keep_positions(url)
    actual = flyarchive.positions(url).compute()

    assert actual.attrs["stored"] == group
    assert np.array_equal(actual.values, expected.values, equal_nan=True)


def test_the_archive_still_verifies_and_opens_with_a_derived_group(sites_archive):
    flyarchive.keep_positions(sites_archive, "target")

    report = flyarchive.verify(sites_archive)
    plain = xr.open_zarr(sites_archive)

    assert report.ok, report.problems
    assert "qpos" in plain and "derived" not in plain
    assert flyarchive.open_archive(sites_archive).qpos.shape == (3, 20, 13)


def test_an_interrupted_keep_resumes_after_its_last_committed_block(sites_archive, monkeypatch):
    expected = flyarchive.positions(sites_archive, "target").values

    def stop(done, total):
        if done >= 10:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        flyarchive.keep_positions(sites_archive, "target", on_block=stop)
    seen = []
    group = flyarchive.keep_positions(sites_archive, "target",
                                      on_block=lambda done, total: seen.append(done))

    assert seen == [15, 20]  # frames 10.. only
    assert np.array_equal(flyarchive.open_positions(group).values, expected)


def test_positions_of_an_archive_that_grew_are_computed_then_kept_again(tmp_path):
    model = tiny_model()
    url = record(model, str(tmp_path / "grow.zarr"), n_steps=36)  # 10 frames
    flyarchive.keep_positions(url, "hand")
    record(model, url, n_steps=76, mode="a")  # rerun to 20 frames

    grown = flyarchive.positions(url, "hand")
    group = flyarchive.keep_positions(url, "hand")
    again = flyarchive.positions(url, "hand")

    assert "stored" not in grown.attrs and grown.sizes["time"] == 20
    assert again.attrs["stored"] == group
    assert np.array_equal(again.values, grown.values)


def test_positions_kept_beside_a_bounded_error_archive_verify_clean(tmp_path):
    url = record(tiny_model(), str(tmp_path / "bounded.zarr"), codec="abs:1e-3")

    group = flyarchive.keep_positions(url, ["torso", "hand"])
    report = flyarchive.verify(url)

    assert report.ok, report.problems  # positions are not on the states' quantization grid
    assert "codec" not in flyarchive.open_positions(group).attrs


def test_positions_kept_as_an_archive_of_their_own(sites_archive, tmp_path):
    to = str(tmp_path / "positions.zarr")

    written = flyarchive.keep_positions(sites_archive, sites="target_tip", to=to)
    kept = flyarchive.open_positions(to)

    assert written == to
    assert kept.attrs["backend"] == "cpu" and kept.keypoint_kind.values.tolist() == ["site"]
    assert np.array_equal(kept.values, flyarchive.positions(sites_archive, sites="target_tip").values)
    assert {"sim_time", "frame"} <= set(xr.open_zarr(to).position.coords)  # plain xarray reads it


def test_an_archive_of_other_positions_is_not_replaced(sites_archive, tmp_path):
    to = str(tmp_path / "positions.zarr")
    flyarchive.keep_positions(sites_archive, "target", to=to)
    before = snapshot(to)

    with pytest.raises(ArchiveExistsError, match="not these derived values"):
        flyarchive.keep_positions(sites_archive, "fly/c_thorax", to=to)

    assert snapshot(to) == before


def test_a_recording_is_never_replaced_by_positions_overwrite_or_not(sites_archive, tmp_path,
                                                                     cli):
    """``positions RUN --to RUN --overwrite`` (a slip of tab completion) deleted the recording
    and left an empty group of positions in its place."""
    from flyarchive.errors import OutputLocationError

    other = record(tiny_model(), str(tmp_path / "other.zarr"), n_worlds=2)
    before, other_before = snapshot(sites_archive), snapshot(other)

    for to in (sites_archive, other, sites_archive + "/"):
        with pytest.raises(ArchiveExistsError, match="derived values never replace a recording"):
            flyarchive.keep_positions(sites_archive, "target", to=to, overwrite=True)
    code, _, err = cli("positions", sites_archive, "--keypoints", "target", "--to",
                       sites_archive, "--overwrite")
    for to, where in ((sites_archive + "/pos.zarr", "inside"), (str(tmp_path), "a folder holding")):
        with pytest.raises(OutputLocationError, match=f"is {where} the archive"):
            flyarchive.keep_positions(sites_archive, "target", to=to, overwrite=True)

    assert code == 2 and "never replace a recording" in err and "Nothing was changed" in err
    assert snapshot(sites_archive) == before and snapshot(other) == other_before
    assert flyarchive.verify(sites_archive).ok


def test_keep_on_each_storage(location, sites_model):
    url = record(sites_model, location.url, storage_options=location.storage_options)

    group = flyarchive.keep_positions(url, "target", storage_options=location.storage_options)
    read = flyarchive.positions(url, "target", storage_options=location.storage_options)

    assert read.attrs["stored"] == group
    assert np.isfinite(read.values).all()


def test_positions_of_an_s3_archive_kept_in_a_local_archive(s3_location, sites_model, tmp_path):
    """The archive's S3 options were given to the local --to too: refused ("drop them")."""
    options = s3_location.storage_options
    url = record(sites_model, s3_location.url, storage_options=options)
    to = str(tmp_path / "positions.zarr")

    flyarchive.keep_positions(url, "target", to=to, storage_options=options)

    assert np.array_equal(flyarchive.open_positions(to).values,
                          flyarchive.positions(url, "target", storage_options=options).values)


#: ``flyarchive positions ARGS...`` that says ``HELD`` on stdout once it has committed
#: ``argv[1]`` frames and then waits for a line on stdin: a kill meanwhile comes between two
#: blocks it committed, as a user's kill could.
HELD_POSITIONS = """
import sys
import flyarchive.analyze as analyze
from flyarchive.cli import main
keep = analyze.keep_positions
def held(*args, on_block, **kwargs):
    def block(done, total):
        on_block(done, total)
        if done >= int(sys.argv[1]):
            print("HELD", flush=True)
            sys.stdin.readline()
    return keep(*args, on_block=block, **kwargs)
analyze.keep_positions = held
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.subprocess
@pytest.mark.slow  # a child process killed mid-way
@pytest.mark.timeout(300)
def test_a_killed_positions_command_loses_only_its_block_and_resumes(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from flyarchive.cli import main
    from flyarchive.store.derived import open_derived

    url = record(tiny_model(), str(tmp_path / "long.zarr"), n_worlds=3, n_steps=800,
                 chunk_frames=25)  # 201 frames
    expected = flyarchive.positions(url, "hand").values
    command = ["positions", url, "--keypoints", "hand", "--quiet"]
    child = subprocess.Popen([sys.executable, "-c", HELD_POSITIONS, "100", *command],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    held = child.stdout.readline()  # it has committed frames 0..99
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    (name,) = [n for n in os.listdir(f"{url}/derived") if n.startswith("positions-")]
    partial = open_derived(f"{url}/derived/{name}")
    committed = int(partial.n_frames.min())

    code = main(command)  # the rerun, here

    assert held == "HELD\n" and committed == 100
    assert np.array_equal(partial.position.values[:, :committed], expected[:, :committed])
    assert code == 0
    kept = flyarchive.positions(url, "hand")
    assert "stored" in kept.attrs and np.array_equal(kept.values, expected)
    assert flyarchive.verify(url).ok


def test_a_repair_rewrites_only_the_damaged_shard_and_no_other_group(sites_archive):
    from pathlib import Path

    from flyarchive.testing.holes import delete_object

    damaged = Path(flyarchive.keep_positions(sites_archive, "target"))
    other = Path(flyarchive.keep_positions(sites_archive, "fly/c_thorax", orientations=True))
    expected = flyarchive.positions(sites_archive, "target", stored=False).values
    untouched = snapshot(other)
    good = {k: v for k, v in snapshot(damaged).items() if k != "position/c/0/2/0/0"}
    delete_object(str(damaged), "position/c/0/2/0/0")  # frames 10..14 of the 3 worlds
    said = []

    flyarchive.keep_positions(sites_archive, "target", on_repair=said.append)

    assert len(said) == 1 and "Recomputing worlds 0..2, frames 10..14" in said[0]
    assert snapshot(other) == untouched
    assert {k: v for k, v in snapshot(damaged).items() if k in good} == good
    assert np.array_equal(flyarchive.positions(sites_archive, "target").values, expected)


def test_a_sound_group_is_kept_without_a_repair(sites_archive):
    group = flyarchive.keep_positions(sites_archive, "target")
    before = snapshot(group)
    said = []

    again = flyarchive.keep_positions(sites_archive, "target", on_repair=said.append)

    assert again == group and said == [] and snapshot(group) == before


def test_verify_names_the_derived_groups_it_checked(sites_archive, cli):
    group = flyarchive.keep_positions(sites_archive, "target")

    code, out, err = cli("verify", sites_archive)

    assert code == 0 and err == ""
    assert f"Derived groups checked too: derived/{group.rsplit('/', 1)[1]}." in out


def test_positions_kept_with_a_given_model_are_a_note_and_serve_only_that_model(sites_archive,
                                                                              sites_model):
    import copy

    moved = copy.deepcopy(sites_model)  # same layout, another model: a site moved
    moved.site_pos[0] += 0.5
    group = flyarchive.keep_positions(sites_archive, sites="fly/c_back", model=moved)

    report = flyarchive.verify(sites_archive)
    with_kept = flyarchive.positions(sites_archive, sites="fly/c_back")
    with_moved = flyarchive.positions(sites_archive, sites="fly/c_back", model=moved)

    assert report.ok and len(report.notes) == 1
    assert "was computed with the model" in report.notes[0] and "not the one the archive keeps" \
        in report.notes[0]
    assert "stored" not in with_kept.attrs and with_moved.attrs["stored"] == group


@pytest.mark.parametrize("undone", [True, False], ids=["undone", "killed"])
def test_an_interrupted_keep_is_a_note_of_verify_not_damage(sites_archive, monkeypatch, undone):
    from pathlib import Path

    from flyarchive.store import derived

    def fail(*args, **kwargs):
        raise KeyboardInterrupt  # once the group's zarr.json is written, before its arrays

    monkeypatch.setattr(derived, "_create_arrays", fail)
    if not undone:  # killed: nothing was undone
        monkeypatch.setattr(derived, "undo", lambda *args: None)
    with pytest.raises(KeyboardInterrupt):
        flyarchive.keep_positions(sites_archive, "target")
    monkeypatch.undo()
    for claim in Path(sites_archive).glob("derived/*/claims/writer.json"):
        claim.unlink()  # a killed writer's claim: another process's, dead (taken over)

    report = flyarchive.verify(sites_archive)
    group = flyarchive.keep_positions(sites_archive, "target")

    assert report.ok, report.problems
    assert len(report.notes) == 1
    assert ("is empty (a creation that was undone)" if undone
            else "its creation was interrupted") in report.notes[0]
    assert flyarchive.positions(sites_archive, "target").attrs["stored"] == group


def test_positions_kept_inside_another_recording_are_refused(sites_archive, tmp_path):
    """positions --to other.zarr/p.zarr was accepted: the other archive's verify then failed
    and its replacement was refused."""
    from flyarchive.errors import OutputLocationError

    other = record(tiny_model(), str(tmp_path / "other.zarr"), n_worlds=1)
    before = snapshot(other)

    for inside in ("p.zarr", "derived/x"):
        with pytest.raises(OutputLocationError, match=r"inside the archive \(or zarr group\)"):
            flyarchive.keep_positions(sites_archive, "target", to=f"{other}/{inside}")

    assert snapshot(other) == before and flyarchive.verify(other).ok

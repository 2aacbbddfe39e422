"""SIGKILL during import-npz and export-npz: nothing half-written, partial imports said, reruns heal.

Each trial runs the operation in a real child process and kills it with SIGKILL at
a chosen step (see :mod:`flyarchive.testing.interop_kills`).
"""

import pytest

from flyarchive.testing.interop_kills import InteropKillConfig, kill_trial, trial_inputs

pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(300)]

IMPORT_STEPS = InteropKillConfig(operation="import").total_steps  # 24 commits
EXPORT_FILES = InteropKillConfig(operation="export", n_files=6).total_steps
EXPORT = {"n_files": 6, "n_frames": 120, "chunk_frames": 40}


@pytest.fixture(scope="module")
def import_inputs(tmp_path_factory):
    """The npz files every import trial imports, and their uninterrupted import."""
    return trial_inputs(tmp_path_factory.mktemp("import-inputs"),
                        InteropKillConfig(operation="import"))


@pytest.fixture(scope="module")
def export_inputs(tmp_path_factory):
    """The archive every export trial exports (the import of npz files)."""
    return trial_inputs(tmp_path_factory.mktemp("export-inputs"),
                        InteropKillConfig(operation="export", **EXPORT))


@pytest.mark.parametrize("wait_steps", [0, 3, pytest.param(12, marks=pytest.mark.sweep),
                                        IMPORT_STEPS])  # before, between (twice), after the commits
def test_a_killed_import_is_reported_partial_and_resume_equals_a_whole_import(tmp_path, wait_steps,
                                                                            import_inputs):
    config = InteropKillConfig(operation="import", wait_steps=wait_steps)

    result = kill_trial(tmp_path, config, inputs=import_inputs)

    assert result.killed
    assert result.problems == []  # includes: a partial archive left is reported as partial
    assert result.rerun_equal
    if 0 < wait_steps < IMPORT_STEPS:  # killed between two commits
        assert result.archive_left and result.partial_detected


@pytest.mark.parametrize(("wait_steps", "mid_write"), [
    (0, False), (2, True),  # before the first file, while a file is being written
    pytest.param(EXPORT_FILES, False, marks=pytest.mark.sweep),  # after the last: as before it
])
def test_a_killed_export_leaves_no_half_written_file_and_the_rerun_no_leftover(
        tmp_path, wait_steps, mid_write, export_inputs):
    config = InteropKillConfig(operation="export", wait_steps=wait_steps, mid_write=mid_write,
                               **EXPORT)

    result = kill_trial(tmp_path, config, inputs=export_inputs)

    assert result.killed
    if mid_write:
        assert result.leftovers_after_kill == 1  # killed with a file in its temporary name
    assert result.half_written == 0
    assert result.leftovers_after_rerun == 0
    assert result.rerun_equal
    assert result.problems == []

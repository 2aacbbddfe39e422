"""The flyarchive command as a user meets it: pipes, Ctrl-C, home folders. (Quiet Warp: a
render in a fresh process prints no Warp logs, tests/query/test_header.py.)"""

import os
import signal
import subprocess
import sys

import pytest

from flyarchive.cli import main
from flyarchive.cli.args import parse_worlds
from flyarchive.errors import SelectionError
from flyarchive.testing import TINY_XML
from flyarchive.testing.fixtures import record

pytestmark = pytest.mark.timeout(300)
ENV = {**os.environ, "MUJOCO_GL": "egl"}


def flyarchive(*args):
    return [sys.executable, "-m", "flyarchive.cli", *args]


@pytest.fixture
def archive(tiny, tmp_path):
    """2 tiny worlds, 7 frames each."""
    return record(tiny, str(tmp_path / "cli.zarr"), n_steps=24)


@pytest.mark.subprocess
def test_info_into_a_closed_pipe_exits_quietly(archive):
    proc = subprocess.Popen(flyarchive("info", archive), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=ENV)
    proc.stdout.close()  # as `| head` does once it has read enough

    _, err = proc.communicate(timeout=120)

    assert proc.returncode == 1
    assert err == b""


@pytest.mark.subprocess
def test_ctrl_c_during_an_import_is_one_line_and_exit_130(tmp_path):
    from flyarchive.testing.interop_kills import interrupt_import

    result = interrupt_import(tmp_path)  # Ctrl-C while it waits after its first commit

    assert result.exit_code == 130
    assert result.stderr == "flyarchive import-npz: interrupted\n"
    assert result.stdout == "COMMITTED\n"  # one commit, no "imported" line
    assert len(set(result.committed)) == 1 and 0 < result.committed[0] < max(result.frames)


def test_export_to_a_path_under_the_home_folder_expands_it(archive, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)

    assert main(["export-npz", archive, "--to", "~/npz"]) == 0

    assert sorted(p.name for p in (tmp_path / "home" / "npz").iterdir()) == [
        "world00000.npz", "world00001.npz"]
    assert not (tmp_path / "~").exists()


def test_import_to_a_path_under_the_home_folder_expands_it(archive, tmp_path, monkeypatch):
    (tmp_path / "tiny.xml").write_text(TINY_XML)
    main(["export-npz", archive, "--to", str(tmp_path / "npz")])
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)

    code = main(["import-npz", "~/../npz", "--to", "~/back.zarr", "--model", "~/../tiny.xml"])

    assert code == 0
    assert (tmp_path / "home" / "back.zarr" / "zarr.json").is_file()


def test_relative_output_paths_are_relative_to_the_working_folder(archive, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    assert main(["export-npz", archive, "--to", "rel/npz", "--worlds", "1"]) == 0

    assert (tmp_path / "rel" / "npz" / "world00001.npz").is_file()


def test_a_world_range_over_the_limit_is_refused_before_it_is_expanded():
    with pytest.raises(SelectionError, match="names 1,000,001 worlds; at most 1,000,000"):
        parse_worlds("0-1000000")


def test_a_world_range_within_the_limit_is_expanded():
    assert len(parse_worlds("0-999999")) == 1_000_000

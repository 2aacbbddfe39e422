"""Hostile archives that could exhaust memory or hang: each command refuses them.

Each case is an adversary's edit of a small sound archive (flyarchive.testing.hostile):
a chunk that decodes to 4 GiB, a chunk linked to /dev/zero, a FIFO... The command runs
in a child process limited to 3 GiB of address space and 25 s, so a regression fails
(MemoryError, a killed child) instead of taking the machine or hanging the suite.
"""

import pytest

from flyarchive.testing.hostile import make_case, make_sound, run_isolated, snapshot

pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(90)]


@pytest.fixture(scope="module")
def sound(tmp_path_factory):
    return make_sound(str(tmp_path_factory.mktemp("sound") / "run.zarr"))


@pytest.fixture
def hostile(sound, tmp_path):
    def build(case):
        return make_case(sound, case, tmp_path / "hostile.zarr")

    return build


def run(command, url, tmp_path):
    return run_isolated(command, url, tmp_path / "out", timeout_s=25)


def test_gzip_bomb_in_n_frames_is_refused_by_info_before_decoding(hostile, tmp_path):
    url = hostile("n_frames chunk: gzip, 4 MB -> 4 GiB")
    before = snapshot(tmp_path / "hostile.zarr")

    outcome = run("info", url, tmp_path)

    assert outcome.exit == 2, outcome.message
    assert "n_frames/zarr.json: the pipeline ['bytes', 'gzip'] is not one flyarchive writes" \
        in outcome.message
    assert f"flyarchive verify {url}" in outcome.message
    assert snapshot(tmp_path / "hostile.zarr") == before


def test_gzip_bomb_in_n_frames_is_a_schema_error_from_open_archive(hostile, tmp_path):
    url = hostile("n_frames chunk: gzip, 4 MB -> 4 GiB")

    outcome = run("open_archive", url, tmp_path)

    assert outcome.error_type == "SchemaError", outcome.message
    assert "gzip" in outcome.message


def test_pcodec_bomb_in_a_qpos_chunk_is_refused_by_export_npz(hostile, tmp_path):
    url = hostile("qpos chunk: pcodec, 4 GiB of zeros")
    before = snapshot(tmp_path / "hostile.zarr")

    outcome = run("export-npz", url, tmp_path)

    assert outcome.exit == 2, outcome.message
    assert "pcodec chunk holds more or fewer values than its declared shape (1, 5, 13)" \
        in outcome.message
    assert snapshot(tmp_path / "hostile.zarr") == before


def test_pcodec_bomb_in_a_qpos_chunk_is_named_by_verify(hostile, tmp_path):
    url = hostile("qpos chunk: pcodec, 4 GiB of zeros")

    outcome = run("verify", url, tmp_path)

    assert outcome.exit == 1, outcome.message
    assert "(file qpos/c/0/1/0) is unreadable: a pcodec chunk holds more" in outcome.message


def test_a_4_gib_chunk_file_is_refused_by_open_archive_without_reading_it(hostile, tmp_path):
    url = hostile("n_frames chunk file of 4 GiB")
    before = snapshot(tmp_path / "hostile.zarr")

    outcome = run("open_archive", url, tmp_path)

    assert outcome.error_type == "UnsafeFileError", outcome.message
    assert "n_frames/c/0 is 4294967296 bytes, more than the 20 bytes" in outcome.message
    assert snapshot(tmp_path / "hostile.zarr") == before


def test_a_qpos_chunk_linked_to_dev_zero_is_refused_by_plot(hostile, tmp_path):
    url = hostile("qpos chunk -> /dev/zero")
    before = snapshot(tmp_path / "hostile.zarr")

    outcome = run("plot", url, tmp_path)

    assert outcome.exit == 2, outcome.message
    assert "qpos/c/0/1/0 leads out of the archive (to /dev/zero)" in outcome.message
    assert not (tmp_path / "out" / "plot.png").exists()
    assert snapshot(tmp_path / "hostile.zarr") == before


def test_a_fifo_time_chunk_is_named_by_verify_instead_of_hanging(hostile, tmp_path):
    url = hostile("time chunk is a FIFO")
    before = snapshot(tmp_path / "hostile.zarr")

    outcome = run("verify", url, tmp_path)

    assert outcome.exit == 1, outcome.message
    assert "time/c/1 is a FIFO (named pipe), not a regular file" in outcome.message
    assert snapshot(tmp_path / "hostile.zarr") == before


def test_a_fifo_time_chunk_is_refused_by_render_before_rendering(hostile, tmp_path):
    url = hostile("time chunk is a FIFO")

    outcome = run("render", url, tmp_path)

    assert outcome.exit == 2, outcome.message
    assert "time/c/1 is a FIFO" in outcome.message
    assert not (tmp_path / "out" / "videos").exists()


def test_a_chunk_shape_of_10_to_the_12_is_refused_by_info(hostile, tmp_path):
    url = hostile("n_frames chunk shape 10**12")

    outcome = run("info", url, tmp_path)

    assert outcome.exit == 2, outcome.message
    assert "a chunk of shape (1000000000000,) decodes to 8000000000000 bytes" in outcome.message


def test_a_zstd_label_chunk_declaring_4_gib_is_refused_by_open_archive(hostile, tmp_path):
    url = hostile("dof labels: zstd frame declaring 4 GiB")

    outcome = run("open_archive", url, tmp_path)

    assert outcome.error_type == "UnsafeFileError", outcome.message
    assert "dof/c/0 is zstd data that declares 4294967295 decoded bytes" in outcome.message

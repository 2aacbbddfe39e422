"""Hostile archives that could exhaust memory or hang: each command refuses them.

Each case is an adversary's edit of a small sound archive (flyarchive.testing.hostile):
a chunk that decodes to 4 GiB, a chunk linked to /dev/zero, a FIFO... Each command runs
in a process of its own limited to 3 GiB of address space and 25 s, so a regression fails
(MemoryError, a killed process) instead of taking the machine or hanging the suite. The
processes are forked, one per command, from one child that imports flyarchive once
(flyarchive.testing.hostile.run_isolated_many); each archive is built once, and every
command on it must leave it as it was.
"""

from dataclasses import dataclass
from pathlib import Path

import pytest

from flyarchive.testing.hostile import Outcome, run_isolated_many
from flyarchive.testing.hostile_cases import make_case, make_sound, snapshot

pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(300)]

GZIP, PCODEC, HUGE = ("n_frames chunk: gzip, 4 MB -> 4 GiB", "qpos chunk: pcodec, 4 GiB of zeros",
                      "n_frames chunk file of 4 GiB")
DEV_ZERO, FIFO, SHAPE, ZSTD = ("qpos chunk -> /dev/zero", "time chunk is a FIFO",
                               "n_frames chunk shape 10**12",
                               "dof labels: zstd frame declaring 4 GiB")
#: What the tests below run: (hostile case, command).
JOBS = [(GZIP, "info"), (GZIP, "open_archive"), (PCODEC, "export-npz"), (PCODEC, "verify"),
        (HUGE, "open_archive"), (DEV_ZERO, "plot"), (FIFO, "verify"), (FIFO, "render"),
        (SHAPE, "info"), (ZSTD, "open_archive")]


@dataclass
class Ran:
    """One command on one hostile archive: what it did, the archive's URL, whether every
    command left the archive as it was, and the command's output folder."""

    outcome: Outcome
    url: str
    unchanged: bool
    out: Path


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Ran]:
    """Every job of :data:`JOBS`, each command in a capped process of its own."""
    folder = tmp_path_factory.mktemp("hostile")
    sound = make_sound(str(folder / "sound.zarr"))
    cases = sorted({case for case, _ in JOBS})
    urls = {case: make_case(sound, case, folder / f"case{i}.zarr") for i, case in enumerate(cases)}
    before = {case: snapshot(Path(url)) for case, url in urls.items()}
    outs = [folder / f"out{i}" for i in range(len(JOBS))]

    outcomes = run_isolated_many([(command, urls[case], out) for (case, command), out
                                  in zip(JOBS, outs)], timeout_s=25, warm=sound)

    unchanged = {case: snapshot(Path(url)) == before[case] for case, url in urls.items()}
    return {job: Ran(outcome, urls[job[0]], unchanged[job[0]], out)
            for job, outcome, out in zip(JOBS, outcomes, outs)}


def test_gzip_bomb_in_n_frames_is_refused_by_info_before_decoding(ran):
    job = ran[GZIP, "info"]
    outcome = job.outcome

    assert outcome.exit == 2, outcome.message
    assert "n_frames/zarr.json: the pipeline ['bytes', 'gzip'] is not one flyarchive writes" \
        in outcome.message
    assert f"flyarchive verify {job.url}" in outcome.message
    assert job.unchanged


def test_gzip_bomb_in_n_frames_is_a_schema_error_from_open_archive(ran):
    outcome = ran[GZIP, "open_archive"].outcome

    assert outcome.error_type == "SchemaError", outcome.message
    assert "gzip" in outcome.message


def test_pcodec_bomb_in_a_qpos_chunk_is_refused_by_export_npz(ran):
    job = ran[PCODEC, "export-npz"]
    outcome = job.outcome

    assert outcome.exit == 2, outcome.message
    assert "pcodec chunk holds more or fewer values than its declared shape (1, 5, 13)" \
        in outcome.message
    assert job.unchanged


def test_pcodec_bomb_in_a_qpos_chunk_is_named_by_verify(ran):
    outcome = ran[PCODEC, "verify"].outcome

    assert outcome.exit == 1, outcome.message
    assert "(file qpos/c/0/1/0) is unreadable: a pcodec chunk holds more" in outcome.message


def test_a_4_gib_chunk_file_is_refused_by_open_archive_without_reading_it(ran):
    job = ran[HUGE, "open_archive"]
    outcome = job.outcome

    assert outcome.error_type == "UnsafeFileError", outcome.message
    assert "n_frames/c/0 is 4294967296 bytes, more than the 20 bytes" in outcome.message
    assert job.unchanged


def test_a_qpos_chunk_linked_to_dev_zero_is_refused_by_plot(ran):
    job = ran[DEV_ZERO, "plot"]
    outcome = job.outcome

    assert outcome.exit == 2, outcome.message
    assert "qpos/c/0/1/0 leads out of the archive (to /dev/zero)" in outcome.message
    assert not (job.out / "plot.png").exists()
    assert job.unchanged


def test_a_fifo_time_chunk_is_named_by_verify_instead_of_hanging(ran):
    job = ran[FIFO, "verify"]
    outcome = job.outcome

    assert outcome.exit == 1, outcome.message
    assert "time/c/1 is a FIFO (named pipe), not a regular file" in outcome.message
    assert job.unchanged


def test_a_fifo_time_chunk_is_refused_by_render_before_rendering(ran):
    job = ran[FIFO, "render"]
    outcome = job.outcome

    assert outcome.exit == 2, outcome.message
    assert "time/c/1 is a FIFO" in outcome.message
    assert not (job.out / "videos").exists()


def test_a_chunk_shape_of_10_to_the_12_is_refused_by_info(ran):
    outcome = ran[SHAPE, "info"].outcome

    assert outcome.exit == 2, outcome.message
    assert "a chunk of shape (1000000000000,) decodes to 8000000000000 bytes" in outcome.message


def test_a_zstd_label_chunk_declaring_4_gib_is_refused_by_open_archive(ran):
    outcome = ran[ZSTD, "open_archive"].outcome

    assert outcome.error_type == "UnsafeFileError", outcome.message
    assert "dof/c/0 is zstd data that declares 4294967295 decoded bytes" in outcome.message

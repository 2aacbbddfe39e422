"""Fixtures of the bad-input suite: every case asserts the error type, a fragment of its
message, and that what was committed before is byte for byte as it was
(:func:`flyarchive.testing.fixtures.snapshot`). Command-line renders here say ``--workers 0``:
by default the command line starts its LocalCluster before it reads the other arguments
(seconds per case); that path's errors close it (tests/distribute/test_early_cluster.py).

The archives are recorded once per test process and each test gets a copy of its own
(:func:`flyarchive.testing.fixtures.copy_archive`: milliseconds, where a recording takes
most of a second), so a test may damage its copy. A copy keeps the original's
``archive_id``: a test about an archive replaced at the same URL records a new one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flyarchive.testing.fixtures import ForbiddingS3, copy_archive, forbidding_s3, record


@pytest.fixture(scope="session")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The archive :func:`archive` copies, recorded once per test process: do not change it."""
    from flyarchive.testing import tiny_model

    return record(tiny_model(), str(tmp_path_factory.mktemp("recorded") / "run.zarr"))


@pytest.fixture
def archive(recorded: str, tmp_path: Path) -> str:
    """A local archive of 2 tiny worlds, 20 frames each (chunks of 5), at ``run.zarr``."""
    return copy_archive(recorded, tmp_path / "run.zarr")


@pytest.fixture(scope="session")
def recorded_bare(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Like :func:`recorded`, kept without its model (``store_model=False``)."""
    from flyarchive.testing import tiny_model

    return record(tiny_model(), str(tmp_path_factory.mktemp("recorded") / "bare.zarr"),
                  store_model=False)


@pytest.fixture
def bare(recorded_bare: str, tmp_path: Path) -> str:
    """:func:`archive`'s worlds in an archive that keeps no model, at ``bare.zarr``."""
    return copy_archive(recorded_bare, tmp_path / "bare.zarr")


@pytest.fixture(scope="session")
def recorded_ragged(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Worlds 0, 1, 2 with 8, 5 and 0 committed frames (chunks of 4), written once."""
    import numpy as np

    from flyarchive.clock import Timing
    from flyarchive.layout import ModelLayout
    from flyarchive.store import ArchiveSpec, ArchiveWriter, FrameBlock
    from flyarchive.testing import reference_frames, tiny_model

    tiny = tiny_model()
    frames = reference_frames(tiny, 3, 40)
    url = str(tmp_path_factory.mktemp("recorded") / "ragged.zarr")
    spec = ArchiveSpec(ModelLayout.from_model(tiny), Timing(0.002, 25, 0.2), (0, 1, 2),
                       chunk_frames=4)
    block = FrameBlock(frames["time"][:8], frames["qpos"][:, :8], frames["mocap_pos"][:, :8],
                       frames["mocap_quat"][:, :8])
    with ArchiveWriter.create(url, spec) as writer:
        writer.write(block, n_frames=np.array([8, 5, 0]))
    return url


@pytest.fixture
def ragged(recorded_ragged: str, tmp_path: Path) -> str:
    """Worlds 0, 1, 2 with 8, 5 and 0 committed frames, at ``ragged.zarr``."""
    return copy_archive(recorded_ragged, tmp_path / "ragged.zarr")


@pytest.fixture(name="forbidding_s3")
def forbidding_s3_endpoint() -> Iterator[ForbiddingS3]:
    """An S3 endpoint on loopback that refuses every request as AWS does a bad key."""
    with forbidding_s3() as endpoint:
        yield endpoint


@pytest.fixture
def unreachable() -> dict[str, Any]:
    """Storage options for an unused loopback port, one quick attempt."""
    from flyarchive.testing.s3 import _free_port, s3_storage_options

    return s3_storage_options(f"http://127.0.0.1:{_free_port()}", botocore_attempts=1,
                              secret="unreachable-secret-value",
                              config_kwargs={"connect_timeout": 1})

"""Fixtures of the bad-input suite: every case asserts the error type, a fragment of its
message, and that what was committed before is byte for byte as it was
(:func:`flyarchive.testing.fixtures.snapshot`). Command-line renders here say ``--workers 0``:
by default the command line starts its LocalCluster before it reads the other arguments
(seconds per case); that path's errors close it (tests/distribute/test_early_cluster.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mujoco
import pytest

from flyarchive.testing.fixtures import ForbiddingS3, forbidding_s3, record


@pytest.fixture
def archive(tiny: mujoco.MjModel, tmp_path: Path) -> str:
    """A local archive of 2 tiny worlds, 20 frames each (chunks of 5), at ``run.zarr``."""
    return record(tiny, str(tmp_path / "run.zarr"))


@pytest.fixture
def ragged(tiny: mujoco.MjModel, tmp_path: Path) -> str:
    """Worlds 0, 1, 2 with 8, 5 and 0 committed frames."""
    import numpy as np

    from flyarchive.clock import Timing
    from flyarchive.layout import ModelLayout
    from flyarchive.store import ArchiveSpec, ArchiveWriter, FrameBlock
    from flyarchive.testing import reference_frames

    frames = reference_frames(tiny, 3, 40)
    url = str(tmp_path / "ragged.zarr")
    spec = ArchiveSpec(ModelLayout.from_model(tiny), Timing(0.002, 25, 0.2), (0, 1, 2),
                       chunk_frames=4)
    block = FrameBlock(frames["time"][:8], frames["qpos"][:, :8], frames["mocap_pos"][:, :8],
                       frames["mocap_quat"][:, :8])
    with ArchiveWriter.create(url, spec) as writer:
        writer.write(block, n_frames=np.array([8, 5, 0]))
    return url


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

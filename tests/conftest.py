"""Shared fixtures: storage locations (memory, local disk, S3 on loopback), models, the CLI.

Skip markers (``requires_warp``...) are in :mod:`flyarchive.testing.markers`; plain helpers
(``record``, ``snapshot``...) in :mod:`flyarchive.testing.fixtures`.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("MUJOCO_GL", "egl")

from flyarchive.testing.fixtures import Location  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def model_check_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """flyarchive's cache folder (verdicts of kept models' checks) for the whole session: a
    temporary one, never the user's; processes started by the tests inherit it."""
    before = os.environ.get("FLYARCHIVE_CACHE_DIR")
    folder = tmp_path_factory.mktemp("flyarchive-cache")
    os.environ["FLYARCHIVE_CACHE_DIR"] = str(folder)
    yield folder
    if before is None:
        os.environ.pop("FLYARCHIVE_CACHE_DIR", None)
    else:
        os.environ["FLYARCHIVE_CACHE_DIR"] = before


@pytest.fixture(scope="session")
def s3_server() -> Iterator[Any]:
    """A real S3-compatible server (moto in server mode) on loopback, with a bucket."""
    from flyarchive.testing.s3 import S3Server

    with S3Server() as server:
        server.create_bucket("flyarchive-test")
        yield server


@pytest.fixture
def s3_location(s3_server: Any) -> Location:
    return Location(f"s3://flyarchive-test/{uuid.uuid4().hex}.zarr", s3_server.storage_options())


@pytest.fixture(params=["memory", "local", "s3"])
def location(request: pytest.FixtureRequest, tmp_path: Any) -> Location:
    """An empty archive location on each storage backend."""
    if request.param == "memory":
        return Location(f"memory://{uuid.uuid4().hex}.zarr")
    if request.param == "local":
        return Location(str(tmp_path / "run.zarr"))
    return request.getfixturevalue("s3_location")


@pytest.fixture
def tiny():
    from flyarchive.testing import tiny_model

    return tiny_model()


@pytest.fixture
def model_xml(tmp_path: Any) -> str:
    """The tiny model's MJCF in a file, for the CLI's ``--model``."""
    from flyarchive.testing import TINY_XML

    path = tmp_path / "tiny.xml"
    path.write_text(TINY_XML)
    return str(path)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Any:
    """Run ``flyarchive ARGS...`` in this process: ``cli(*argv) -> (exit code, stdout, stderr)``."""
    from flyarchive.cli import main

    def run(*argv: str) -> tuple[int, str, str]:
        code = main([str(arg) for arg in argv])
        out = capsys.readouterr()
        return code, out.out, out.err

    return run

"""Bad GPU choices for rendering (``gpus=`` / ``--gpus``): each is refused before the
archive is opened, with the GPUs this process sees; nothing is written anywhere.

The GPUs are a fake set of two (``CUDA_VISIBLE_DEVICES=0,1``, read without CUDA).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flyarchive.distribute.api import RenderOptions, render_videos
from flyarchive.errors import RenderBackendError, RenderOptionsError
from flyarchive.testing.fixtures import snapshot

GPU = RenderOptions(size=(48, 64), backend="gpu")


@pytest.fixture(autouse=True)
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setattr("flyarchive.distribute.gpus._run_nvidia_smi", lambda: None)


def refused(archive: str, tmp_path: Path, error: type[Exception], fragment: str,
            **kwargs: Any) -> None:
    """``render_videos`` with ``kwargs`` raises ``error`` matching ``fragment``; the archive
    is unchanged and no output folder was made."""
    before = snapshot(archive)

    with pytest.raises(error, match=fragment):
        render_videos(archive, None, "front", str(tmp_path / "v"), **kwargs)

    assert snapshot(archive) == before
    assert not (tmp_path / "v").exists()


def test_gpus_naming_a_device_that_is_not_there_lists_the_ones_that_are(archive, tmp_path):
    refused(archive, tmp_path, RenderOptionsError,
            r"gpus=\[2\] asks for GPU\(s\) \[2\]; this process sees 2 GPU\(s\): 0 \(0\), 1 \(1\)",
            options=GPU, gpus=[2])


def test_gpus_naming_a_device_twice_is_refused(archive, tmp_path):
    refused(archive, tmp_path, RenderOptionsError, r"GPU\(s\) \[1\] twice",
            options=GPU, gpus=[1, 1])


def test_an_empty_gpus_list_is_refused(archive, tmp_path):
    refused(archive, tmp_path, RenderOptionsError, "asks for no GPU", options=GPU, gpus=[])


def test_gpus_as_a_string_is_refused(archive, tmp_path):
    refused(archive, tmp_path, RenderOptionsError, "must be a list of CUDA device numbers",
            options=GPU, gpus="0,1")


def test_gpus_with_the_cpu_backend_is_refused(archive, tmp_path):
    refused(archive, tmp_path, RenderOptionsError, "backend='opengl' renders on the CPU",
            options=RenderOptions(size=(48, 64)), gpus=[0])


def test_gpus_with_a_scheduler_is_refused(archive, tmp_path):
    refused(archive, tmp_path, RenderOptionsError, "a client or scheduler was given",
            options=GPU, gpus=[0], scheduler="tcp://127.0.0.1:1")


def test_gpus_where_no_gpu_is_visible_is_refused(archive, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")

    refused(archive, tmp_path, RenderBackendError, "none is visible to this process",
            options=GPU, gpus=[0])


def test_cli_malformed_gpus_is_one_error_line_and_exit_2(archive, tmp_path, cli):
    before = snapshot(archive)

    code, _, err = cli("render", archive, "--camera", "front", "--backend", "gpu",
                       "--gpus", "0,x", "--out", tmp_path / "v")

    assert code == 2
    assert err.startswith("flyarchive render: error: Cannot read GPUs '0,x'")
    assert snapshot(archive) == before
    assert not (tmp_path / "v").exists()


def test_cli_gpus_naming_a_missing_device_is_one_error_line_and_exit_2(archive, tmp_path, cli):
    before = snapshot(archive)

    code, _, err = cli("render", archive, "--camera", "front", "--backend", "gpu",
                       "--gpus", "0,7", "--out", tmp_path / "v")

    assert code == 2
    assert "flyarchive render: error: gpus=[0, 7] asks for GPU(s) [7]" in err
    assert snapshot(archive) == before
    assert not (tmp_path / "v").exists()


@pytest.mark.cluster  # the command line starts its cluster first
@pytest.mark.parametrize("value", ["0", pytest.param("-4", marks=pytest.mark.sweep)])
def test_cli_batch_worlds_below_one_is_one_error_line_and_exit_2(archive, tmp_path, cli, value):
    before = snapshot(archive)

    code, _, err = cli("render", archive, "--camera", "front", "--backend", "gpu",
                       "--batch-worlds", value, "--out", tmp_path / "v")

    assert code == 2
    assert err.startswith("flyarchive render: error: batch_worlds must be an integer of at "
                          f"least 1, got {value}.")
    assert snapshot(archive) == before
    assert not (tmp_path / "v").exists()

"""The portable codec: zarr v3 core codecs only, readable where pcodec is not installed.

The two reader tests create a real virtual environment with ``pip install zarr xarray``
(the versions this project runs, so that only pcodec's absence differs), which needs
PyPI or a local mirror and takes about 20 s.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from flyarchive import codecs, open_archive
from flyarchive.testing.fixtures import record

CORE_CODECS = {"sharding_indexed", "transpose", "bytes", "blosc", "crc32c"}

# Runs in the plain environment: prints whether pcodec is importable, then saves what
# xarray reads (committed frames only) as .npy files (no pickle), or lets the error out.
READER = """
import importlib.util, json, sys
import numpy as np, xarray as xr

print(json.dumps({"pcodec_importable": importlib.util.find_spec("pcodec") is not None}), flush=True)
ds = xr.open_zarr(sys.argv[1], consolidated=False)
n = int(ds.n_frames.values.min())
np.save(sys.argv[2] + "/qpos.npy", ds.qpos.values[:, :n])
np.save(sys.argv[2] + "/mocap_pos.npy", ds.mocap_pos.values[:, :n])
"""


def codec_names(array_json: Path) -> set[str]:
    """Every codec name in an array's metadata, inside the shards included."""
    names = set()
    for codec in json.loads(array_json.read_text())["codecs"]:
        names.add(codec["name"])
        config = codec.get("configuration", {})
        for inner in config.get("codecs", []) + config.get("index_codecs", []):
            names.add(inner["name"])
    return names


@pytest.fixture(scope="module")
def plain_python(tmp_path_factory) -> Path:
    """A new virtual environment with only ``pip install zarr xarray`` (no pcodec, no dask)."""
    venv = tmp_path_factory.mktemp("plain-venv")
    # Without a pip of its own (ensurepip takes seconds): this pip installs into it.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    wanted = [f"{pkg}=={importlib.metadata.version(pkg)}" for pkg in ("zarr", "xarray")]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", *wanted],
        capture_output=True, text=True, timeout=600,
    )
    if done.returncode != 0:
        pytest.fail(f"pip install {' '.join(wanted)} failed (PyPI is needed):\n{done.stderr[-3000:]}")
    return python


def read_in(python: Path, url: str, out: Path) -> subprocess.CompletedProcess[str]:
    out.mkdir()
    return subprocess.run([str(python), "-c", READER, url, str(out)], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.install
def test_portable_archive_opens_with_plain_zarr_and_xarray_without_pcodec(tiny, tmp_path, plain_python):
    url = str(tmp_path / "portable.zarr")
    record(tiny, url, codec="portable")
    ds = open_archive(url)
    n = int(ds.n_frames.min())
    expected = {"qpos": ds.qpos.values[:, :n], "mocap_pos": ds.mocap_pos.values[:, :n]}

    done = read_in(plain_python, url, tmp_path / "read")

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[0]) == {"pcodec_importable": False}
    for name, values in expected.items():
        actual = np.load(tmp_path / "read" / f"{name}.npy", allow_pickle=False)
        assert actual.dtype == values.dtype and actual.tobytes() == values.tobytes(), name


@pytest.mark.install
def test_default_archive_in_that_environment_fails_naming_numcodecs_pcodec(tiny, tmp_path, plain_python):
    url = str(tmp_path / "default.zarr")
    record(tiny, url, codec="lossless")

    done = read_in(plain_python, url, tmp_path / "read")

    assert done.returncode != 0
    assert json.loads(done.stdout.splitlines()[0]) == {"pcodec_importable": False}
    assert "codec 'pcodec' is not available" in done.stderr
    assert "numcodecs[pcodec]" in done.stderr


def test_portable_archive_stores_only_zarr_v3_core_codecs(tiny, tmp_path):
    url = tmp_path / "portable.zarr"

    record(tiny, str(url), codec="portable")

    for name in ("qpos", "mocap_pos", "mocap_quat", "time", "n_frames", "world"):
        assert codec_names(url / name / "zarr.json") <= CORE_CODECS, name


def test_portable_state_is_stored_time_last(tiny, tmp_path):
    url = tmp_path / "portable.zarr"

    record(tiny, str(url), codec="portable")

    inner = json.loads((url / "mocap_quat" / "zarr.json").read_text())["codecs"][0]
    transpose = inner["configuration"]["codecs"][0]
    assert transpose == {"name": "transpose", "configuration": {"order": [0, 2, 3, 1]}}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_portable_round_trip_is_bit_exact(tmp_path, dtype):
    rng = np.random.default_rng(0)
    expected = np.cumsum(rng.normal(0.0, 0.05, (2, 50, 13)), axis=1).astype(dtype)
    expected[0, 0, :5] = [-0.0, np.nan, np.inf, -np.inf, np.finfo(dtype).smallest_subnormal]
    arr = zarr.create_array(
        zarr.storage.LocalStore(tmp_path), name="state", shape=expected.shape, dtype=dtype,
        chunks=(1, 50, 13), shards=expected.shape, fill_value=np.nan,
        **codecs.array_codecs("portable", dtype),
    )

    arr[:] = expected
    actual = arr[:]

    assert actual.dtype == expected.dtype
    assert actual.tobytes() == expected.tobytes()


def test_describe_names_the_codec_and_what_a_reader_needs():
    portable, default = codecs.describe("portable"), codecs.describe("lossless")

    assert (portable["codec"], portable["lossless"]) == ("blosc-zstd", True)
    assert "zarr v3" in portable["reader_needs"] and "pcodec" not in portable["reader_needs"]
    assert default["codec"] == "pcodec" and "numcodecs[pcodec]" in default["reader_needs"]
    assert codecs.describe("abs:1e-6")["reader_needs"] == default["reader_needs"]


def test_archive_attributes_name_the_portable_codec(tiny, tmp_path):
    url = str(tmp_path / "portable.zarr")

    record(tiny, url, codec="portable")

    assert open_archive(url).attrs["codec"] == codecs.describe("portable")


def test_unknown_spec_error_lists_portable():
    with pytest.raises(codecs.CodecSpecError, match="'portable'"):
        codecs.parse_codec("portable:9")


def test_array_codecs_refuses_fewer_than_two_dimensions():
    with pytest.raises(codecs.CodecSpecError, match="ndim=1"):
        codecs.array_codecs("portable", np.float64, ndim=1)

"""The portable codec: zarr v3 core codecs only, readable where pcodec is not installed.

The two reader tests read in a new virtual environment that holds only zarr, xarray and
what they require (their dependencies as ``pip install zarr xarray`` would install them,
the very distributions this project runs, linked in: no pcodec, no Dask, no flyarchive;
so that only pcodec's absence differs, without a download or an install).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import numpy as np
import pytest
import zarr

from flyarchive import codecs, open_archive
from flyarchive.testing.fixtures import record

CORE_CODECS = {"sharding_indexed", "transpose", "bytes", "blosc", "crc32c"}

# Runs in the plain environment: prints which of pcodec, dask and flyarchive are
# importable, then for each archive (URL, output folder) saves what xarray reads
# (committed frames only) as .npy files (no pickle), or prints the error's traceback.
READER = """
import importlib.util, json, sys, traceback
import numpy as np, xarray as xr

print(json.dumps({name: importlib.util.find_spec(name) is not None
                  for name in ("pcodec", "dask", "flyarchive")}), flush=True)
for url, out in zip(sys.argv[1::2], sys.argv[2::2]):
    try:
        ds = xr.open_zarr(url, consolidated=False)
        n = int(ds.n_frames.values.min())
        np.save(out + "/qpos.npy", ds.qpos.values[:, :n])
        np.save(out + "/mocap_pos.npy", ds.mocap_pos.values[:, :n])
        print(json.dumps({"url": url, "error": None}), flush=True)
    except Exception:
        print(json.dumps({"url": url, "error": traceback.format_exc()}), flush=True)
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


def required(*names: str) -> list[importlib.metadata.Distribution]:
    """The installed distributions ``pip install NAMES`` needs: them and what they require,
    extras left out."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found, todo = {}, list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name not in found:
            found[name] = importlib.metadata.distribution(name)
            todo += [r.name for r in map(Requirement, found[name].requires or ())
                     if r.marker is None or r.marker.evaluate({"extra": ""})]
    return list(found.values())


@pytest.fixture(scope="module")
def plain_python(tmp_path_factory) -> Path:
    """The Python of a new virtual environment that holds zarr, xarray and what they require
    (no pcodec, no dask, no flyarchive): this environment's distributions, linked in."""
    root = tmp_path_factory.mktemp("plain-venv")
    venv.create(root, symlinks=True, with_pip=False)
    (site,) = root.glob("lib/python*/site-packages")
    for dist in required("zarr", "xarray"):
        here = Path(dist.locate_file(""))
        for top in {f.parts[0] for f in dist.files or () if f.parts[0] not in ("..", "__pycache__")}:
            (site / top).symlink_to(here / top)
    return root / "bin" / "python"


@pytest.fixture(scope="module")
def portable(tmp_path_factory) -> str:
    """A portable archive of the tiny model, recorded once: tests only read it."""
    from flyarchive.testing import tiny_model

    return record(tiny_model(), str(tmp_path_factory.mktemp("portable") / "portable.zarr"),
                  codec="portable")


@pytest.fixture(scope="module")
def read_plainly(plain_python, portable, tmp_path_factory) -> dict:
    """A portable and a default archive read in that environment, in one process: what it
    could import, and per archive what xarray read (the folder of its .npy files), the
    traceback of its error, and what open_archive reads here (committed frames only)."""
    from flyarchive.testing import tiny_model

    folder = tmp_path_factory.mktemp("read-plainly")
    archives = {"portable": portable,
                "lossless": record(tiny_model(), str(folder / "lossless.zarr"), codec="lossless")}
    argv = []
    for codec, url in archives.items():
        (folder / codec).mkdir()
        argv += [url, str(folder / codec)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    done = subprocess.run([str(plain_python), "-c", READER, *argv], capture_output=True,
                          text=True, timeout=120, env=env, cwd=folder)

    assert done.returncode == 0, done.stderr
    first, *rows = map(json.loads, done.stdout.splitlines())
    errors = {row["url"]: row["error"] for row in rows}
    read = {}
    for codec, url in archives.items():
        ds = open_archive(url)
        n = int(ds.n_frames.min())
        read[codec] = {"out": folder / codec, "error": errors[url],
                       "expected": {"qpos": ds.qpos.values[:, :n],
                                    "mocap_pos": ds.mocap_pos.values[:, :n]}}
    return {"importable": first, **read}


@pytest.mark.subprocess
def test_portable_archive_opens_with_plain_zarr_and_xarray_without_pcodec(read_plainly):
    read = read_plainly["portable"]

    assert read_plainly["importable"] == {"pcodec": False, "dask": False, "flyarchive": False}
    assert read["error"] is None
    for name, values in read["expected"].items():
        actual = np.load(read["out"] / f"{name}.npy", allow_pickle=False)
        assert actual.dtype == values.dtype and actual.tobytes() == values.tobytes(), name


@pytest.mark.subprocess
def test_default_archive_in_that_environment_fails_naming_numcodecs_pcodec(read_plainly):
    error = read_plainly["lossless"]["error"]

    assert read_plainly["importable"]["pcodec"] is False
    assert error is not None and not list(read_plainly["lossless"]["out"].iterdir())
    assert "codec 'pcodec' is not available" in error
    assert "numcodecs[pcodec]" in error


def test_portable_archive_stores_only_zarr_v3_core_codecs(portable):
    url = Path(portable)

    for name in ("qpos", "mocap_pos", "mocap_quat", "time", "n_frames", "world"):
        assert codec_names(url / name / "zarr.json") <= CORE_CODECS, name


def test_portable_state_is_stored_time_last(portable):
    inner = json.loads((Path(portable) / "mocap_quat" / "zarr.json").read_text())["codecs"][0]
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


def test_archive_attributes_name_the_portable_codec(portable):
    assert open_archive(portable).attrs["codec"] == codecs.describe("portable")


def test_unknown_spec_error_lists_portable():
    with pytest.raises(codecs.CodecSpecError, match="'portable'"):
        codecs.parse_codec("portable:9")


def test_array_codecs_refuses_fewer_than_two_dimensions():
    with pytest.raises(codecs.CodecSpecError, match="ndim=1"):
        codecs.array_codecs("portable", np.float64, ndim=1)
